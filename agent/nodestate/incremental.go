package nodestate

import (
	"maps"
	"net/netip"
	"slices"

	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/bgp/advert"
	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// The reconcilers read the desired sets on every change: computed from
// scratch that is O(node) per ADD — with 1,000 pods and 10,000 routes, tens
// of milliseconds on each reconciler, every time. So the state keeps both
// sets: every host prefix an attachment names (pod IP, anycast, `addresses`)
// is indexed to the attachments naming it, a change marks the prefixes of
// the attachments it touches, and a read recomputes just those, from the
// attachments that name them. AdvertRoutes and HostRoutes (desired.go)
// still compute from scratch — for the operator's views, and as the oracle
// the tests hold this to.

// desiredSets is the incremental form of the two desired sets.
type desiredSets struct {
	// byPrefix: the attachments whose record names the host prefix.
	byPrefix map[netip.Prefix][]string
	adverts  map[netip.Prefix]advert.Kind         // the BGP set
	kernel   map[netip.Prefix][]dataplane.Nexthop // the kernel set
	// dirty prefixes to recompute before a read; summaries: all of them
	dirty     map[netip.Prefix]struct{}
	summaries bool
}

func newDesiredSets() desiredSets {
	return desiredSets{byPrefix: map[netip.Prefix][]string{}, adverts: map[netip.Prefix]advert.Kind{},
		kernel: map[netip.Prefix][]dataplane.Nexthop{}, dirty: map[netip.Prefix]struct{}{}, summaries: true}
}

// eachHostPrefix calls f for every host prefix a record names.
func eachHostPrefix(r *store.Allocation, f func(netip.Prefix)) {
	for _, set := range [][]netip.Addr{r.IPs, r.Anycast, r.Addresses} {
		for _, ip := range set {
			f(hostPrefix(ip))
		}
	}
}

// indexLocked adds (or, with remove, drops) an attachment in byPrefix and
// marks its prefixes.
func (s *State) indexLocked(r *store.Allocation, remove bool) {
	d := &s.des
	eachHostPrefix(r, func(p netip.Prefix) {
		d.dirty[p] = struct{}{}
		ids := d.byPrefix[p]
		if remove {
			ids = slices.DeleteFunc(ids, func(id string) bool { return id == r.ContainerID })
		} else if !slices.Contains(ids, r.ContainerID) {
			ids = append(ids, r.ContainerID)
		}
		if len(ids) == 0 {
			delete(d.byPrefix, p)
		} else {
			d.byPrefix[p] = ids
		}
	})
}

// touchLocked marks the prefixes of an attachment (its phase changed).
func (s *State) touchLocked(id string) {
	if e := s.entries[id]; e != nil {
		eachHostPrefix(&e.rec, func(p netip.Prefix) { s.des.dirty[p] = struct{}{} })
	}
}

// touchPodLocked marks every attachment of a pod (its readiness changed).
func (s *State) touchPodLocked(pod podmeta.ID) {
	for id := range s.pods[pod] {
		s.touchLocked(id)
	}
}

// flushLocked brings the desired sets up to date with the marks.
func (s *State) flushLocked() {
	d := &s.des
	if d.summaries {
		for _, p := range s.summaries {
			d.dirty[p] = struct{}{}
		}
		d.summaries = false
	}
	var nhs []dataplane.Nexthop
	for p := range d.dirty {
		kind := advert.Kind("")
		better := func(k advert.Kind) {
			if kind == "" || advert.Rank(k) < advert.Rank(kind) {
				kind = k
			}
		}
		if slices.Contains(s.summaries, p) {
			if _, no := s.suppressed[p]; !no {
				better(advert.Summary)
			}
		}
		nhs = nhs[:0]
		for _, id := range d.byPrefix[p] {
			e := s.entries[id]
			if e == nil || e.phase != Committed {
				continue
			}
			r := &e.rec
			for _, ip := range r.IPs {
				if hostPrefix(ip) == p && !s.inSummary(ip) {
					better(advert.Pod)
				}
			}
			if !s.readyLocked(r.Pod) {
				continue
			}
			for _, set := range []struct {
				kind advert.Kind
				ips  []netip.Addr
			}{{advert.Anycast, r.Anycast}, {advert.Address, r.Addresses}} {
				for _, ip := range set.ips {
					if hostPrefix(ip) != p {
						continue
					}
					better(set.kind)
					if nh, ok := nexthop(r.IPs, r.HostVeth, ip); ok {
						nhs = append(nhs, nh)
					}
				}
			}
		}
		if kind == "" {
			delete(d.adverts, p)
		} else {
			d.adverts[p] = kind
		}
		if len(nhs) == 0 {
			delete(d.kernel, p)
		} else {
			slices.SortFunc(nhs, dataplane.CompareNexthops)
			d.kernel[p] = slices.Clone(slices.Compact(nhs))
		}
	}
	clear(d.dirty)
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
