package bgp

import (
	"context"
	"fmt"
	"slices"
	"strings"

	api "github.com/osrg/gobgp/v4/api"

	"code.fritzlab.net/fritzlab/flock/bgp/advert"
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

const (
	ipv4OKSet  = "flock-ipv4-ok"
	guardStmt  = "flock-rfc5549-guard"
	exportName = "flock-export"
)

func kindSet(k advert.Kind) string { return "flock-kind-" + string(k) }

// policyPeer is what the export policy needs of one peer.
type policyPeer struct {
	addr string // resolved neighbour address (no zone)
	spec v1alpha1.Peer
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
	}
	return nil
}

// exportStatements builds the export policy of one generation: the RFC
// 5549 guard, each peer's communities per kind, and the marker strip.
func exportStatements(asn uint32, gen int, peers []policyPeer) (sets []*api.DefinedSet, stmts []*api.Statement) {
	stmts = append(stmts, &api.Statement{
		Name: fmt.Sprintf("%s-%d", guardStmt, gen),
		Conditions: &api.Conditions{
			NeighborSet: &api.MatchSet{Type: api.MatchSet_TYPE_INVERT, Name: ipv4OKSet},
			AfiSafiIn:   []*api.Family{apiFamily("ipv4")},
		},
		Actions: &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT},
	})
	for i, p := range peers {
		if p.addr == "" {
			continue
		}
		nset := fmt.Sprintf("flock-peer-%d-%d", gen, i)
		used := false
		for _, k := range advert.Kinds {
			std, large := communitiesFor(p.spec.Communities, k), communitiesFor(p.spec.LargeCommunities, k)
			if len(std) == 0 && len(large) == 0 {
				continue
			}
			used = true
			act := &api.Actions{}
			if len(std) > 0 {
				act.Community = &api.CommunityAction{Type: api.CommunityAction_TYPE_ADD, Communities: std}
			}
			if len(large) > 0 {
				act.LargeCommunity = &api.CommunityAction{Type: api.CommunityAction_TYPE_ADD, Communities: large}
			}
			stmts = append(stmts, &api.Statement{
				Name: fmt.Sprintf("flock-comm-%d-%d-%s", gen, i, k),
				Conditions: &api.Conditions{
					NeighborSet:       &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: nset},
					LargeCommunitySet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: kindSet(k)},
				},
				Actions: act,
			})
		}
		if used {
			sets = append(sets, &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: nset, List: []string{hostPrefixString(p.addr)}})
		}
	}
	var markers []string
	for _, k := range advert.Kinds {
		markers = append(markers, "^"+marker(asn, k)+"$")
	}
	stmts = append(stmts, &api.Statement{
		Name: fmt.Sprintf("flock-strip-%d", gen),
		Actions: &api.Actions{
			LargeCommunity: &api.CommunityAction{Type: api.CommunityAction_TYPE_REMOVE, Communities: markers},
			RouteAction:    api.RouteAction_ROUTE_ACTION_ACCEPT,
		},
	})
	return sets, stmts
}

func hostPrefixString(addr string) string {
	if strings.Contains(addr, ":") {
		return addr + "/128"
	}
	return addr + "/32"
}

// installBaseSets creates the sets every generation shares: the IPv4-ok
// neighbour set (dynamic) and one marker set per kind.
func (s *Speaker) installBaseSets(ctx context.Context) error {
	if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: ipv4OKSet}}); err != nil {
		return fmt.Errorf("bgp: defined set %s: %w", ipv4OKSet, err)
	}
	for _, k := range advert.Kinds {
		ds := &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_LARGE_COMMUNITY, Name: kindSet(k), List: []string{"^" + marker(s.asn, k) + "$"}}
		if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: ds}); err != nil {
			return fmt.Errorf("bgp: defined set %s: %w", ds.Name, err)
		}
	}
	return nil
}

// installExport builds a new generation of the export policy, switches the
// global export assignment to it in one step, then removes the old one.
func (s *Speaker) installExport(ctx context.Context, peers []policyPeer) error {
	gen := s.policyGen + 1
	sets, stmts := exportStatements(s.asn, gen, peers)
	for _, ds := range sets {
		if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: ds}); err != nil {
			return fmt.Errorf("bgp: defined set %s: %w", ds.Name, err)
		}
	}
	name := fmt.Sprintf("%s-%d", exportName, gen)
	if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{Name: name, Statements: stmts}}); err != nil {
		return fmt.Errorf("bgp: export policy: %w", err)
	}
	if err := s.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_EXPORT,
		Policies: []*api.Policy{{Name: name}}, DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
	}}); err != nil {
		return fmt.Errorf("bgp: export assignment: %w", err)
	}
	if s.policyGen > 0 {
		old := fmt.Sprintf("%s-%d", exportName, s.policyGen)
		if err := s.srv.DeletePolicy(ctx, &api.DeletePolicyRequest{Policy: &api.Policy{Name: old}, All: true}); err != nil {
			s.log.Warn("bgp: removing old export policy", "policy", old, "err", err)
		}
		for _, ds := range s.policySets {
			if err := s.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: ds, All: true}); err != nil {
				s.log.Warn("bgp: removing old defined set", "set", ds.Name, "err", err)
			}
		}
	}
	s.policyGen, s.policySets = gen, sets
	return nil
}

// setIPv4OK adds or removes a peer address from the IPv4-ok set.
func (s *Speaker) setIPv4OK(ctx context.Context, addr string, ok bool) error {
	ds := &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: ipv4OKSet, List: []string{hostPrefixString(addr)}}
	if ok {
		return s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: ds})
	}
	return s.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: ds})
}
