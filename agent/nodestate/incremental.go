package nodestate

import (
	"maps"
	"net/netip"
	"slices"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// The reconcilers read the desired sets on every change: computed from
// scratch that is O(node) per ADD — with 1,000 pods and 10,000 routes, tens
// of milliseconds on each reconciler, every time. So the state keeps both
// sets: a change marks the host prefixes (pod IPs, anycast, `addresses`) of
// the attachments it touches, and a read recomputes just those, from the
// attachments that hold them — found through the indexes the state keeps
// anyway (IPAM's owners, the claims). AdvertRoutes and HostRoutes (desired.go)
// still compute from scratch — for the operator's views, and as the oracle
// the tests hold this to.

// desiredSets is the incremental form of the two desired sets.
type desiredSets struct {
	adverts map[netip.Prefix]advert.Path         // the BGP set
	kernel  map[netip.Prefix][]dataplane.Nexthop // the kernel set
	// dirty prefixes to recompute before a read; summaries: all of them
	dirty     map[netip.Prefix]struct{}
	summaries bool
	// A read hands the map itself out, read-only, and the next change
	// copies it first: a full repair every 30 s copied 10,000 entries
	// of each when nothing had changed.
	advertsOut, kernelOut bool
}

func newDesiredSets() desiredSets {
	return desiredSets{adverts: map[netip.Prefix]advert.Path{},
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

// markLocked marks the prefixes of a record.
func (s *State) markLocked(r *store.Allocation) {
	eachHostPrefix(r, func(p netip.Prefix) { s.des.dirty[p] = struct{}{} })
}

// holdersLocked calls f for each attachment that holds ip: as its pod
// address (IPAM, or restored outside the pools) or as an anycast or
// `addresses` claim.
func (s *State) holdersLocked(ip netip.Addr, f func(id string)) {
	if o, ok := s.ipam.Owner(ip); ok {
		f(o)
	}
	if o, ok := s.outside[ip]; ok {
		f(o)
	}
	if c := s.claims[ip]; c != nil {
		for _, o := range c.owners {
			f(o)
		}
	}
}

// touchLocked marks the prefixes of an attachment (its phase changed).
func (s *State) touchLocked(id string) {
	if e := s.entries[id]; e != nil {
		s.markLocked(&e.rec)
	}
}

// touchPodLocked marks every attachment of a pod (its readiness changed).
func (s *State) touchPodLocked(k podKey) {
	for id := range s.pods[k] {
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
	if len(d.dirty) == 0 {
		return
	}
	if d.advertsOut {
		d.adverts, d.advertsOut = maps.Clone(d.adverts), false
	}
	if d.kernelOut {
		d.kernel, d.kernelOut = maps.Clone(d.kernel), false
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
		seen := ""
		s.holdersLocked(p.Addr(), func(id string) {
			if id == seen { // its pod address and a claim: once is enough
				return
			}
			seen = id
			e := s.entries[id]
			if e == nil || e.phase != Committed {
				return
			}
			r := &e.rec
			for _, ip := range r.IPs {
				if hostPrefix(ip) == p && !s.inSummary(ip) {
					better(advert.Pod)
				}
			}
			if !s.readyLocked(r.Pod) {
				return
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
		})
		switch sr, ok := s.services[p]; {
		case kind != "":
			d.adverts[p] = advert.Path{Kind: kind}
		case ok:
			d.adverts[p] = sr.Path
		default:
			delete(d.adverts, p)
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

// Adverts is the desired BGP set: prefix → path. It is the state's own
// map, never changed after it is handed out (a later change works on a
// copy): the caller must not change it either.
func (s *State) Adverts() (map[netip.Prefix]advert.Path, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaving {
		return map[netip.Prefix]advert.Path{}, s.gen
	}
	s.flushLocked()
	s.des.advertsOut = true
	return s.des.adverts, s.gen
}

// KernelRoutes is the desired kernel host route set: prefix → next hops,
// sorted. Read-only like Adverts', next-hop slices included.
func (s *State) KernelRoutes() (map[netip.Prefix][]dataplane.Nexthop, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	s.des.kernelOut = true
	return s.des.kernel, s.gen
}
