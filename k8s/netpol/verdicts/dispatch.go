package verdicts

import (
	"maps"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// Most of a large cluster's pod churn that a node's program follows at
// all is pods elsewhere that a policy of their namespace selects: each
// address of such a pod has, in the dispatch maps, the group of its
// policies built for the judged peers, which other pods of the same
// workload share. A change of one changes nothing else in the program
// (not a peer set, not a group), so the program is patched: the entries
// of its addresses, not a compile of the cluster.

// Dispatchable tells whether a pod's change from old to cur (nil: none),
// which Classify called Recompile with d, changes the program compiled
// with d only in the dispatch entries of their addresses (Dispatch tells
// them): both are of another node, not on the host's network, without
// extra IPs, hold their addresses alone, written as the compile keys
// them, and are no peer of a rule of the judged addresses' policies.
func (d *Deps) Dispatchable(l Live, old, cur *corev1.Pod) bool {
	if d == nil || d.c.in.Admin {
		return false
	}
	for _, p := range []*corev1.Pod{old, cur} {
		if p != nil && !d.dispatchable(l, p) {
			return false
		}
	}
	return true
}

func (d *Deps) dispatchable(l Live, p *corev1.Pod) bool {
	if p.Spec.NodeName == l.Node || p.Spec.HostNetwork {
		return false
	}
	if l.ExtraPodIPs != nil && len(l.ExtraPodIPs(p)) > 0 {
		return false
	}
	for _, ip := range p.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil || a.String() != ip.IP || d.c.prog.Selected[a] || l.Local(ip.IP) {
			return false
		}
		if l.PodsForIP != nil && len(l.PodsForIP(ip.IP)) > 0 {
			return false
		}
		for _, h := range l.Holders(ip.IP) {
			if h.Namespace != p.Namespace || h.Name != p.Name {
				return false
			}
		}
	}
	return !d.peer(p)
}

// Entry is an address's groups in the dispatch maps (none: no entry).
type Entry struct {
	Egress, Ingress []int
}

// Dispatch is the entry that a compile with d's context would give a, an
// address Dispatchable changes, with the cluster as l tells it now, the
// groups found by key in groups (Program.GroupIndex). False when that
// needs a compile: a is held by several pods, or its pod's change is more
// than its entries, or it needs a group the program does not have.
func (d *Deps) Dispatch(l Live, groups map[string]int, a netip.Addr) (Entry, bool) {
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
		return Entry{}, true
	case len(hs) > 1 || !d.dispatchable(l, hs[0]):
		return Entry{}, false
	}
	h := hs[0]
	var e Entry
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

// GroupIndex is each group's index by its key.
func (p *Program) GroupIndex() map[string]int {
	out := make(map[string]int, len(p.Groups))
	for i, g := range p.Groups {
		out[g.Key] = i
	}
	return out
}

// Patched is p with the entries of es (by address) in place of its own:
// a new Program sharing everything with p but the dispatch maps.
func (p *Program) Patched(es map[netip.Addr]Entry) *Program {
	out := *p
	out.Egress, out.Ingress = maps.Clone(p.Egress), maps.Clone(p.Ingress)
	out.Apply(es)
	return &out
}

// Apply puts the entries of es (by address) in p's dispatch maps in place
// of their own. p is changed: its owner alone may read it meanwhile (a
// cluster's maps are too large to copy for each patch).
func (p *Program) Apply(es map[netip.Addr]Entry) {
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
