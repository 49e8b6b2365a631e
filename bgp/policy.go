package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	api "github.com/osrg/gobgp/v4/api"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// Every path flock originates carries a marker large community naming its
// kind, so the export policy can add each peer's communities per kind; the
// last export statement strips the markers, so peers never see them.
const markerData1 = 0x666c6f63 // "floc"

func kindIndex(k advert.Kind) uint32 { return uint32(slices.Index(advert.Kinds, k) + 1) }

func marker(asn uint32, k advert.Kind) string {
	return fmt.Sprintf("%d:%d:%d", asn, markerData1, kindIndex(k))
}

// markerKind is the kind a marker value names ("" if it is not one of
// ours).
func markerKind(asn uint32, asnField, data1, data2 uint32) advert.Kind {
	if asnField != asn || data1 != markerData1 || data2 < 1 || int(data2) > len(advert.Kinds) {
		return ""
	}
	return advert.Kinds[data2-1]
}

const (
	ipv4OKSet  = "flock-ipv4-ok"
	exportName = "flock-export"
)

func kindSet(k advert.Kind) string { return "flock-kind-" + string(k) }

// policyPeer is what the export policy needs of one peer. It holds no
// pointers, so fmt.Sprint of a slice of them is a stable fingerprint.
type policyPeer struct {
	key    string
	addr   netip.Addr // neighbour address without zone; invalid until resolved
	local  netip.Addr // session source address without zone (may be invalid)
	ipv4OK bool       // the RFC 5549 guard lets IPv4 through
	comms  v1alpha1.KindCommunities
	large  v1alpha1.KindCommunities
}

func communitiesFor(c v1alpha1.KindCommunities, k advert.Kind) []string {
	switch k {
	case advert.Summary:
		return c.Summary
	case advert.Pod:
		return c.Pod
	case advert.Anycast:
		return c.Anycast
	case advert.Address:
		return c.Address
	case advert.Service:
		return c.Service
	}
	return nil
}

// exportPolicy is one generation of the export policy, with what it gives
// each peer.
type exportPolicy struct {
	sets  []*api.DefinedSet
	stmts []*api.Statement
	// outcome per peer key: whether IPv4 goes out and which communities
	// each kind gets, as the policy really applies them. A peer whose
	// outcome changes needs a soft reset.
	outcome map[string]string
	// warning per peer key, when GoBGP's policy cannot give the peer what
	// it is configured for.
	warning map[string]string
	// ipv4Held: peers the guard lets IPv4 through to, but the policy
	// cannot (they cannot be told apart from a peer it must not reach).
	ipv4Held map[string]bool
}

// peerMatch is how a statement selects one peer.
//
// GoBGP v4.8.0 evaluates a neighbour set against the peer's address with
// the zone dropped (NeighborCondition matches net.IPNet.Contains on
// Addr.AsSlice), so fe80::1%eth1 and fe80::1%eth2 are the same neighbour to
// a policy; per-neighbour policies exist only for route-server clients,
// which flock's peers are not. Peers that share an address are told apart
// by the session's local address instead: for a locally originated path
// (next hop unspecified) GoBGP evaluates the next-hop condition against the
// session's local address without zone (PolicyOptions.OldNextHop), which
// for an unnumbered session is our link-local address on that link. Only
// when both ends use the same link-local addresses on two links are the
// peers indistinguishable; then the guard fails closed and the peer is
// warned about.
type peerMatch struct {
	addr  netip.Addr
	local netip.Addr // valid: the next hop must be this address too
}

func (m peerMatch) covers(q policyPeer) bool {
	return q.addr == m.addr && (!m.local.IsValid() || q.local == m.local)
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// buildExport builds the export policy of one generation:
//
//  1. per-peer guard exceptions: IPv4 rejected for a peer the guard holds
//     back whose address another, allowed peer shares;
//  2. the RFC 5549 guard: IPv4 rejected unless the neighbour is in the
//     generation's IPv4-ok set (an empty set rejects IPv4 to everyone, so
//     the guard fails closed);
//  3. each peer's communities per kind (no route action, so evaluation
//     goes on);
//  4. the marker strip and accept, for locally originated paths only: with
//     the default action reject, a route learned from one peer (import
//     policy accept) is never passed on to another, so the node is no
//     transit router.
func buildExport(asn uint32, gen int, peers []policyPeer) exportPolicy {
	out := exportPolicy{outcome: map[string]string{}, warning: map[string]string{}, ipv4Held: map[string]bool{}}
	groups := map[netip.Addr][]policyPeer{}
	var addrs []netip.Addr
	for _, p := range peers {
		if !p.addr.IsValid() {
			continue
		}
		if groups[p.addr] == nil {
			addrs = append(addrs, p.addr)
		}
		groups[p.addr] = append(groups[p.addr], p)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	match := func(p policyPeer) peerMatch {
		m := peerMatch{addr: p.addr}
		if len(groups[p.addr]) > 1 && p.local.IsValid() {
			m.local = p.local
		}
		return m
	}
	nsets := map[netip.Addr]string{}
	nset := func(a netip.Addr) string {
		if n, ok := nsets[a]; ok {
			return n
		}
		n := fmt.Sprintf("flock-nbr-%d-%d", gen, len(nsets))
		nsets[a] = n
		out.sets = append(out.sets, &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: n, List: []string{hostPrefix(a)}})
		return n
	}
	conds := func(m peerMatch) *api.Conditions {
		c := &api.Conditions{NeighborSet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: nset(m.addr)}}
		if m.local.IsValid() {
			c.NextHopInList = []string{hostPrefix(m.local)}
		}
		return c
	}

	// The guard: an address is in the IPv4-ok set if a peer there may have
	// IPv4 and every peer there that may not can be excepted without
	// catching an allowed one.
	var ok []string
	var exceptions []policyPeer
	okAddr := map[netip.Addr]bool{}
	for _, a := range addrs {
		g := groups[a]
		allowed := slices.ContainsFunc(g, func(p policyPeer) bool { return p.ipv4OK })
		if !allowed {
			continue
		}
		var held []policyPeer
		separable := true
		for _, q := range g {
			if q.ipv4OK {
				continue
			}
			m := match(q)
			if !m.local.IsValid() || slices.ContainsFunc(g, func(p policyPeer) bool { return p.ipv4OK && m.covers(p) }) {
				separable = false
			}
			held = append(held, q)
		}
		if !separable {
			for _, p := range g {
				if p.ipv4OK {
					out.ipv4Held[p.key] = true
					out.warning[p.key] = "IPv4 withheld: GoBGP's export policy cannot tell this session from another session to the same neighbour address that must not get IPv4 (both use the same local address, or it is unknown)"
				}
			}
			continue
		}
		okAddr[a] = true
		ok = append(ok, hostPrefix(a))
		exceptions = append(exceptions, held...)
	}
	okName := fmt.Sprintf("%s-%d", ipv4OKSet, gen)
	out.sets = append(out.sets, &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: okName, List: ok})
	for i, q := range exceptions {
		c := conds(match(q))
		c.AfiSafiIn = []*api.Family{apiFamily("ipv4")}
		out.stmts = append(out.stmts, &api.Statement{
			Name:       fmt.Sprintf("flock-rfc5549-except-%d-%d", gen, i),
			Conditions: c,
			Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT},
		})
	}
	out.stmts = append(out.stmts, &api.Statement{
		Name: fmt.Sprintf("flock-rfc5549-guard-%d", gen),
		Conditions: &api.Conditions{
			NeighborSet: &api.MatchSet{Type: api.MatchSet_TYPE_INVERT, Name: okName},
			AfiSafiIn:   []*api.Family{apiFamily("ipv4")},
		},
		Actions: &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT},
	})

	// Communities, and what each peer really gets from them.
	type commStmt struct {
		m          peerMatch
		kind       advert.Kind
		std, large []string
	}
	var cs []commStmt
	for _, p := range peers {
		if !p.addr.IsValid() {
			continue
		}
		m := match(p)
		for _, k := range advert.Kinds {
			std, large := communitiesFor(p.comms, k), communitiesFor(p.large, k)
			if len(std) == 0 && len(large) == 0 {
				continue
			}
			act := &api.Actions{}
			if len(std) > 0 {
				act.Community = &api.CommunityAction{Type: api.CommunityAction_TYPE_ADD, Communities: std}
			}
			if len(large) > 0 {
				act.LargeCommunity = &api.CommunityAction{Type: api.CommunityAction_TYPE_ADD, Communities: large}
			}
			c := conds(m)
			c.LargeCommunitySet = &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: kindSet(k)}
			out.stmts = append(out.stmts, &api.Statement{Name: fmt.Sprintf("flock-comm-%d-%d", gen, len(cs)), Conditions: c, Actions: act})
			cs = append(cs, commStmt{m: m, kind: k, std: std, large: large})
		}
	}
	for _, q := range peers {
		if !q.addr.IsValid() {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "ipv4=%v", q.ipv4OK && okAddr[q.addr])
		own := true
		for _, k := range advert.Kinds {
			var std, large []string
			for _, c := range cs {
				if c.kind == k && c.m.covers(q) {
					std, large = append(std, c.std...), append(large, c.large...)
				}
			}
			fmt.Fprintf(&b, " %s=%v/%v", k, std, large)
			own = own && sameSet(std, communitiesFor(q.comms, k)) && sameSet(large, communitiesFor(q.large, k))
		}
		out.outcome[q.key] = b.String()
		if !own && out.warning[q.key] == "" {
			out.warning[q.key] = "communities mixed with another session's: GoBGP's export policy cannot tell this session from another session to the same neighbour address (both use the same local address, or it is unknown)"
		}
	}

	var markers []string
	for _, k := range advert.Kinds {
		markers = append(markers, "^"+marker(asn, k)+"$")
	}
	out.stmts = append(out.stmts, &api.Statement{
		Name:       fmt.Sprintf("flock-originated-%d", gen),
		Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
		Actions: &api.Actions{
			LargeCommunity: &api.CommunityAction{Type: api.CommunityAction_TYPE_REMOVE, Communities: markers},
			RouteAction:    api.RouteAction_ROUTE_ACTION_ACCEPT,
		},
	})
	return out
}

// installBaseSets creates the sets every generation shares: one marker set
// per kind.
func (s *Speaker) installBaseSets(ctx context.Context) error {
	for _, k := range advert.Kinds {
		ds := &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_LARGE_COMMUNITY, Name: kindSet(k), List: []string{"^" + marker(s.asn, k) + "$"}}
		if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: ds}); err != nil {
			return fmt.Errorf("bgp: defined set %s: %w", ds.Name, err)
		}
	}
	return nil
}

// exportState is the installed export policy generation.
type exportState struct {
	seq  int // names of every attempt are new, so a failed one never collides
	name string
	sets []*api.DefinedSet
	key  string // fingerprint of the inputs; "" before the first install
}

// installExport builds a new generation of the export policy from the
// peers' current state, switches the global export assignment to it in one
// step and removes the old one. Nothing happens when the inputs did not
// change. It returns, per peer key, the outcome and warning of the policy
// now in force. Callers hold s.mu.
func (s *Speaker) installExport(ctx context.Context, peers []policyPeer) (*exportPolicy, error) {
	key := fmt.Sprint(peers)
	if key == s.export.key {
		return nil, nil
	}
	s.export.seq++
	gen := s.export.seq
	pol := buildExport(s.asn, gen, peers)
	for _, ds := range pol.sets {
		if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: ds}); err != nil {
			return nil, fmt.Errorf("bgp: defined set %s: %w", ds.Name, err)
		}
	}
	name := fmt.Sprintf("%s-%d", exportName, gen)
	if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{Name: name, Statements: pol.stmts}}); err != nil {
		return nil, fmt.Errorf("bgp: export policy: %w", err)
	}
	if err := s.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_EXPORT,
		Policies: []*api.Policy{{Name: name}}, DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT,
	}}); err != nil {
		return nil, fmt.Errorf("bgp: export assignment: %w", err)
	}
	if s.export.name != "" {
		if err := s.srv.DeletePolicy(ctx, &api.DeletePolicyRequest{Policy: &api.Policy{Name: s.export.name}, All: true}); err != nil {
			s.log.Warn("bgp: removing old export policy", "policy", s.export.name, "err", err)
		}
		for _, ds := range s.export.sets {
			if err := s.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: ds, All: true}); err != nil {
				s.log.Warn("bgp: removing old defined set", "set", ds.Name, "err", err)
			}
		}
	}
	s.export = exportState{seq: gen, name: name, sets: pol.sets, key: key}
	return &pol, nil
}
