package nodestate

import (
	"maps"
	"net/netip"
	"slices"

	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/bgp/advert"
	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// The reconcilers read the desired sets on every change: computed from
// scratch that is O(node) per ADD — with 1,000 pods and 10,000 routes, tens
// of milliseconds on each reconciler, every time. So the state keeps them:
// each attachment's contribution is recorded, a change marks the
// attachments it touches, and a read first replaces their contributions
// and recomputes only the prefixes those touched. AdvertRoutes and
// HostRoutes (desired.go) still compute from scratch — for the operator's
// views, and as the oracle the tests hold this to.

type advKey struct {
	owner string
	kind  advert.Kind
}

type hostKey struct {
	owner string
	nh    dataplane.Nexthop
}

// contribution is what one attachment (or the node, for summaries) adds
// to the desired sets.
type contribution struct {
	adv  []advPart
	host []hostPart
}

type advPart struct {
	p netip.Prefix
	k advKey
}

type hostPart struct {
	p netip.Prefix
	k hostKey
}

// desiredSets is the incremental form of the two desired sets.
type desiredSets struct {
	contrib map[string]contribution              // by container ID (summaries: advert.NodeOwner)
	adv     map[netip.Prefix]map[advKey]int      // who advertises a prefix, as what
	host    map[netip.Prefix]map[hostKey]int     // who routes a prefix, via what
	adverts map[netip.Prefix]advert.Kind         // the BGP set
	kernel  map[netip.Prefix][]dataplane.Nexthop // the kernel set
	// dirty attachments (and summaries) to recompute before a read
	dirty map[string]bool
}

func newDesiredSets() desiredSets {
	return desiredSets{
		contrib: map[string]contribution{}, adv: map[netip.Prefix]map[advKey]int{}, host: map[netip.Prefix]map[hostKey]int{},
		adverts: map[netip.Prefix]advert.Kind{}, kernel: map[netip.Prefix][]dataplane.Nexthop{},
		dirty: map[string]bool{advert.NodeOwner: true},
	}
}

// touchLocked marks an attachment's contribution for recomputation.
func (s *State) touchLocked(id string) { s.des.dirty[id] = true }

// touchPodLocked marks every attachment of a pod (its readiness changed).
func (s *State) touchPodLocked(pod podmeta.ID) {
	for id := range s.pods[pod] {
		s.des.dirty[id] = true
	}
}

// contributionLocked is what id adds now (see desired.go for the rules).
func (s *State) contributionLocked(id string) contribution {
	var c contribution
	if id == advert.NodeOwner {
		for _, p := range s.summaries {
			if _, no := s.suppressed[p]; !no {
				c.adv = append(c.adv, advPart{p, advKey{advert.NodeOwner, advert.Summary}})
			}
		}
		return c
	}
	e := s.entries[id]
	if e == nil || e.phase != Committed {
		return c
	}
	r := &e.rec
	for _, ip := range r.IPs {
		if !s.inSummary(ip) {
			c.adv = append(c.adv, advPart{hostPrefix(ip), advKey{id, advert.Pod}})
		}
	}
	if !s.readyLocked(r.Pod) {
		return c
	}
	for _, set := range []struct {
		kind advert.Kind
		ips  []netip.Addr
	}{{advert.Anycast, r.Anycast}, {advert.Address, r.Addresses}} {
		for _, ip := range set.ips {
			p := hostPrefix(ip)
			c.adv = append(c.adv, advPart{p, advKey{id, set.kind}})
			if nh, ok := nexthop(r.IPs, r.HostVeth, ip); ok {
				c.host = append(c.host, hostPart{p, hostKey{id, nh}})
			}
		}
	}
	return c
}

// flushLocked brings the desired sets up to date with the dirty marks.
func (s *State) flushLocked() {
	d := &s.des
	if len(d.dirty) == 0 {
		return
	}
	advChanged, hostChanged := map[netip.Prefix]bool{}, map[netip.Prefix]bool{}
	for id := range d.dirty {
		for _, a := range d.contrib[id].adv {
			if d.adv[a.p][a.k]--; d.adv[a.p][a.k] == 0 {
				delete(d.adv[a.p], a.k)
			}
			advChanged[a.p] = true
		}
		for _, h := range d.contrib[id].host {
			if d.host[h.p][h.k]--; d.host[h.p][h.k] == 0 {
				delete(d.host[h.p], h.k)
			}
			hostChanged[h.p] = true
		}
		c := s.contributionLocked(id)
		if len(c.adv)+len(c.host) == 0 {
			delete(d.contrib, id)
		} else {
			d.contrib[id] = c
		}
		for _, a := range c.adv {
			if d.adv[a.p] == nil {
				d.adv[a.p] = map[advKey]int{}
			}
			d.adv[a.p][a.k]++
			advChanged[a.p] = true
		}
		for _, h := range c.host {
			if d.host[h.p] == nil {
				d.host[h.p] = map[hostKey]int{}
			}
			d.host[h.p][h.k]++
			hostChanged[h.p] = true
		}
	}
	clear(d.dirty)
	for p := range advChanged {
		if len(d.adv[p]) == 0 {
			delete(d.adv, p)
			delete(d.adverts, p)
			continue
		}
		best := advert.Kind("")
		for k := range d.adv[p] {
			if best == "" || advert.Rank(k.kind) < advert.Rank(best) {
				best = k.kind
			}
		}
		d.adverts[p] = best
	}
	for p := range hostChanged {
		if len(d.host[p]) == 0 {
			delete(d.host, p)
			delete(d.kernel, p)
			continue
		}
		nhs := make([]dataplane.Nexthop, 0, len(d.host[p]))
		for k := range d.host[p] {
			nhs = append(nhs, k.nh)
		}
		slices.SortFunc(nhs, dataplane.CompareNexthops)
		d.kernel[p] = slices.Compact(nhs)
	}
}

// Adverts is the desired BGP set: prefix → kind (a copy).
func (s *State) Adverts() (map[netip.Prefix]advert.Kind, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	return maps.Clone(s.des.adverts), s.gen
}

// KernelRoutes is the desired kernel host route set: prefix → next hops,
// sorted (a copy; the next-hop slices are shared and must not be changed).
func (s *State) KernelRoutes() (map[netip.Prefix][]dataplane.Nexthop, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	return maps.Clone(s.des.kernel), s.gen
}
