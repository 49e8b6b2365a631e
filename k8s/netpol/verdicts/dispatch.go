package verdicts

import (
	"maps"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// Most of a large cluster's pod churn that a node's program follows at
// all is pods elsewhere that a policy of their namespace selects, or that
// a rule of this node's pods' policies names as a peer. Each address of
// the first has, in the dispatch maps, the group of its policies built
// for the judged peers, which other pods of the same workload share; each
// address of the second is in the sets of peers of the terms of those
// rules. A change of either changes nothing else in the program (not a
// group, not a term), so the program is patched: the entries of its
// addresses and their membership of the sets, not a compile of the
// cluster.

// Dispatchable tells whether a pod's change from old to cur (nil: none),
// which Classify called Recompile with d, changes the program compiled
// with d only in the dispatch entries of their addresses and in which
// sets of peers hold them (Dispatch tells both): both are of another
// node, not on the host's network, without extra IPs (but those several
// pods elsewhere hold alike: stableSeveral), hold their addresses alone,
// written as the compile keys them, and none with
// container ports is a peer of a rule with named egress ports (those
// resolve on each peer, in a list of their own).
func (d *Deps) Dispatchable(l Live, old, cur *trim.Pod) bool {
	return d.Refusal(l, old, cur) == ""
}

// Refusal is why Dispatchable refuses a pod's change ("" if it does not),
// in a word or two: what a large cluster's loads come from.
func (d *Deps) Refusal(l Live, old, cur *trim.Pod) string {
	if d == nil || d.c.in.Admin {
		return "no-deps"
	}
	for _, p := range []*trim.Pod{old, cur} {
		if p == nil {
			continue
		}
		if why := d.refusal(l, p); why != "" {
			return why
		}
	}
	return ""
}

func (d *Deps) dispatchable(l Live, p *trim.Pod) bool { return d.refusal(l, p) == "" }

func (d *Deps) refusal(l Live, p *trim.Pod) string {
	if p.Spec.NodeName == l.Node || p.Spec.HostNetwork {
		return "local-or-host-network"
	}
	if l.ExtraPodIPs != nil {
		for _, ip := range l.ExtraPodIPs(p) {
			if !d.stableSeveral(l, ip) {
				return "extra-ip"
			}
		}
	}
	for _, ip := range p.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil || !canonical(a, ip.IP) {
			return "noncanonical-ip"
		}
		if d.c.prog.Selected[a] || l.Local(ip.IP) {
			return "judged-ip"
		}
		if l.PodsForIP != nil && len(l.PodsForIP(ip.IP)) > 0 {
			return "ip-held-as-extra"
		}
		for _, h := range l.Holders(ip.IP) {
			if h.Namespace != p.Namespace || h.Name != p.Name {
				return "ip-held-twice"
			}
		}
	}
	if d.namedPeer(p) {
		return "named-port-peer"
	}
	return ""
}

// namedPeer: p has container ports and a rule of the judged addresses'
// policies has named egress ports (Deps.peer, as conservatively).
func (d *Deps) namedPeer(p *trim.Pod) bool {
	ports := false
	for i := range p.Spec.Containers {
		ports = ports || len(p.Spec.Containers[i].Ports) > 0
	}
	if !ports {
		return false
	}
	for _, lr := range d.local {
		if lr.named {
			return true
		}
	}
	return false
}

// Entry is an address's groups in the dispatch maps (none: no entry), and
// the sets of peers (by Addrs id) that hold it.
type Entry struct {
	Egress, Ingress []int
	in              []int32
}

// Dispatch is the entry that a compile with d's context would give a, an
// address Dispatchable changes, in p (compiled with d's context, maybe
// patched since), with the cluster as l tells it now, the groups found by
// key in groups (p.GroupIndex()). False when that needs a compile: a is
// held by several pods, or its pod's change is more than its entries, or
// it needs a group the program does not have.
func (d *Deps) Dispatch(l Live, p *Program, groups map[string]int, a netip.Addr) (Entry, bool) {
	if d == nil || d.c.in.Admin || d.c.prog.Selected[a] {
		return Entry{}, false
	}
	s := a.String()
	if l.PodsForIP != nil && len(l.PodsForIP(s)) > 0 {
		return Entry{}, false
	}
	hs := l.Holders(s)
	switch {
	case len(hs) == 0:
		return d.peersOf(p, nil, a)
	case len(hs) > 1 || !d.dispatchable(l, hs[0]):
		return Entry{}, false
	}
	h := hs[0]
	e, ok := d.peersOf(p, h, a)
	if !ok {
		return Entry{}, false
	}
	selecting := d.c.selecting(h, d.c.policies[h.Namespace])
	for _, t := range []networkingv1.PolicyType{networkingv1.PolicyTypeEgress, networkingv1.PolicyTypeIngress} {
		nps := isolating(t, selecting)
		if len(nps) == 0 {
			continue
		}
		named := false
		if t == networkingv1.PolicyTypeIngress {
			for _, np := range nps {
				named = named || namedIngress(np)
			}
		}
		var ports string
		if named {
			ports = resolved(nps, h)
		}
		g, ok := groups[groupKey(t, h.Namespace, nps, named, ports, true)]
		if !ok {
			return Entry{}, false
		}
		if t == networkingv1.PolicyTypeEgress {
			e.Egress = []int{g}
		} else {
			e.Ingress = []int{g}
		}
	}
	return e, true
}

// peersOf is the entry of a, held by h alone (nil: by none), with only
// the sets of p's peers that hold it; false if the rules of one are not
// known.
func (d *Deps) peersOf(p *Program, h *trim.Pod, a netip.Addr) (Entry, bool) {
	var e Entry
	for i, srcs := range p.peerFrom {
		if srcs == nil {
			return Entry{}, false
		}
		for _, src := range srcs {
			if d.holds(src, h, a) {
				e.in = append(e.in, int32(i+1))
				break
			}
		}
	}
	return e, true
}

// holds is peerMatches for src's rule: a in one of its ipBlocks, or h
// (nil: none) matching one of its selectors. The rules are those of the
// judged addresses' policies, whose selectors the compile parsed.
func (d *Deps) holds(src peerSource, h *trim.Pod, a netip.Addr) bool {
	if _, ok := contains(src.blocks, a); ok {
		return true
	}
	return h != nil && d.c.selectorsMatch(src.ns, src.r, h)
}

// GroupIndex is each group's index by its key.
func (p *Program) GroupIndex() map[string]int {
	out := make(map[string]int, len(p.Groups))
	for i, g := range p.Groups {
		out[g.Key] = i
	}
	return out
}

// Change is what a patch changes in a program: the entries of some
// addresses (by address), and the sets of peers (by id) that they change:
// which of their ranges go, and which come.
type Change struct {
	Entries map[netip.Addr]Entry
	peers   map[int32]peerEdit
}

// peerEdit is a set of peers' ranges that a change replaces (was) and
// those it puts in their place (now): only the ranges about the addresses
// it adds or cuts. A set of a large cluster's pods holds tens of
// thousands; a copy of it for each patch was most of flock-policy's
// garbage under churn.
type peerEdit struct{ was, now []Range }

// Change is the change es makes to p; false if p cannot take it in place:
// es adds to a set of peers an address of a family it holds none of (its
// rule for that family is not in the program: a compile makes it).
func (p *Program) Change(es map[netip.Addr]Entry) (*Change, bool) {
	ch := &Change{Entries: es}
	for i, s := range p.peerSets {
		id := int32(i + 1)
		var add, cut []netip.Addr
		for a, e := range es {
			in := slices.Contains(e.in, id)
			switch {
			case s.Contains(a) == in:
			case !in:
				cut = append(cut, a)
			case len(family(s.r, a.Is4())) == 0:
				return nil, false
			default:
				add = append(add, a)
			}
		}
		if len(add)+len(cut) == 0 {
			continue
		}
		if ch.peers == nil {
			ch.peers = map[int32]peerEdit{}
		}
		was := around(s.r, add, cut)
		ch.peers[id] = peerEdit{was: was, now: edited(was, add, cut)}
	}
	return ch, true
}

// around are the ranges of rs (normalized) that holding the addresses of
// add (none in rs) and not those of cut (all in rs) can change: those
// holding one of cut, and those next to one of add (it joins them). The
// others stay as they are: none is next to an address added, or to a
// range of these (rs's ranges are not next to each other).
func around(rs []Range, add, cut []netip.Addr) []Range {
	var at []int
	for _, a := range cut {
		if i, ok := contains(rs, a); ok {
			at = append(at, i)
		}
	}
	for _, a := range add {
		i, _ := contains(rs, a) // the first range after a
		if i > 0 && rs[i-1].To.BitLen() == a.BitLen() && rs[i-1].To.Next() == a {
			at = append(at, i-1)
		}
		if i < len(rs) && rs[i].From.BitLen() == a.BitLen() && a.Next() == rs[i].From {
			at = append(at, i)
		}
	}
	slices.Sort(at)
	out := make([]Range, 0, len(at))
	for _, i := range slices.Compact(at) {
		out = append(out, rs[i])
	}
	return out
}

// replaced is rs (normalized) with the ranges of e.was (all in rs) taken
// out and those of e.now put in, in place (rs's array is reused).
func replaced(rs []Range, e peerEdit) []Range {
	for _, r := range e.was {
		if i, ok := slices.BinarySearchFunc(rs, r.From, func(x Range, a netip.Addr) int { return x.From.Compare(a) }); ok {
			rs = slices.Delete(rs, i, i+1)
		}
	}
	for _, r := range e.now {
		i, _ := slices.BinarySearchFunc(rs, r.From, func(x Range, a netip.Addr) int { return x.From.Compare(a) })
		rs = slices.Insert(rs, i, r)
	}
	return rs
}

// Peers is how many sets of peers ch changes.
func (ch *Change) Peers() int { return len(ch.peers) }

// Patched is p with ch made (p.Change): a new Program sharing with p all
// but the dispatch maps and the sets of peers (and the groups holding
// them) that ch changes.
func (p *Program) Patched(ch *Change) *Program {
	out := *p
	out.Egress, out.Ingress = maps.Clone(p.Egress), maps.Clone(p.Ingress)
	out.applyEntries(ch.Entries)
	if len(ch.peers) == 0 {
		return &out
	}
	out.peerSets = slices.Clone(p.peerSets)
	for id, e := range ch.peers {
		out.peerSets[id-1] = &Addrs{r: replaced(slices.Clone(p.peerSets[id-1].r), e), id: id}
	}
	out.Groups = slices.Clone(p.Groups)
	for i, g := range out.Groups {
		if !slices.ContainsFunc(g.Terms, func(t Term) bool { return t.Peers != nil && changes(ch, t.Peers) }) {
			continue
		}
		ng := *g
		ng.Terms = slices.Clone(g.Terms)
		for j, t := range ng.Terms {
			if t.Peers != nil && changes(ch, t.Peers) {
				ng.Terms[j].Peers = out.peerSets[t.Peers.id-1]
			}
		}
		out.Groups[i] = &ng
	}
	return &out
}

// changes: ch edits the set a (of p's peer sets).
func changes(ch *Change, a *Addrs) bool {
	_, ok := ch.peers[a.id]
	return a.id != 0 && ok
}

// Apply makes ch (p.Change) in p, in place: its dispatch maps and its
// sets of peers change, also those it shares with programs Patched from
// it. Its owner alone may read it meanwhile (a cluster's maps are too
// large to copy for each patch).
func (p *Program) Apply(ch *Change) {
	p.applyEntries(ch.Entries)
	for id, e := range ch.peers {
		p.peerSets[id-1].r = replaced(p.peerSets[id-1].r, e)
	}
}

func (p *Program) applyEntries(es map[netip.Addr]Entry) {
	for a, e := range es {
		for _, m := range []struct {
			by map[netip.Addr][]int
			gs []int
		}{{p.Egress, e.Egress}, {p.Ingress, e.Ingress}} {
			if len(m.gs) == 0 {
				delete(m.by, a)
			} else {
				m.by[a] = m.gs
			}
		}
	}
}
