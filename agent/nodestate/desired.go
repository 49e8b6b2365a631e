package nodestate

import (
	"net/netip"
	"slices"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// What the node routes and advertises is a pure function of the state:
//
//   - BGP: every node summary; a /128 or /32 for each committed pod address
//     outside the summaries; the anycast and `addresses` IPs of committed
//     attachments whose pod is Ready (one path per IP however many
//     replicas).
//   - Kernel: for each anycast or `addresses` IP of a Ready committed
//     attachment, a host route via the pod's eth0 address of the same
//     family on its host veth; several replicas make one ECMP route.
//
// Pending, Deleting and Stuck attachments contribute nothing.

// HostRoute is one desired kernel host route.
type HostRoute struct {
	Prefix   netip.Prefix
	Kind     Kind
	Nexthops []dataplane.Nexthop // sorted
	Owners   []string            // container IDs, sorted
}

func hostPrefix(ip netip.Addr) netip.Prefix { return netip.PrefixFrom(ip, ip.BitLen()) }

func (s *State) inSummary(ip netip.Addr) bool {
	for _, p := range s.summaries {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// routedLocked calls f for every attachment that routes: committed, with
// its pod's readiness.
func (s *State) routedLocked(f func(rec *entry, ready bool)) {
	for _, e := range s.entries {
		if e.phase == Committed {
			f(e, s.readyLocked(e.rec.Pod))
		}
	}
}

// AdvertRoutes is the desired BGP set with the owners of each path (the
// node for summaries, Services as namespace/name for their routes,
// container IDs otherwise), sorted by prefix. When an
// IP is claimed as several kinds, the first of advert.Kinds wins.
func (s *State) AdvertRoutes() ([]advert.Route, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	type acc struct {
		kind   advert.Kind
		owners []string
	}
	m := map[netip.Prefix]*acc{}
	add := func(p netip.Prefix, k advert.Kind, owner string) {
		a := m[p]
		if a == nil {
			a = &acc{kind: k}
			m[p] = a
		} else if advert.Rank(k) < advert.Rank(a.kind) {
			a.kind = k
		}
		a.owners = append(a.owners, owner)
	}
	for _, p := range s.summaries {
		if _, no := s.suppressed[p]; !no {
			add(p, advert.Summary, advert.NodeOwner)
		}
	}
	s.routedLocked(func(e *entry, ready bool) {
		r := &e.rec
		for _, ip := range r.IPs {
			if !s.inSummary(ip) {
				add(hostPrefix(ip), advert.Pod, r.ContainerID)
			}
		}
		if !ready {
			return
		}
		for _, ip := range r.Anycast {
			add(hostPrefix(ip), advert.Anycast, r.ContainerID)
		}
		for _, ip := range r.Addresses {
			add(hostPrefix(ip), advert.Address, r.ContainerID)
		}
	})
	out := make([]advert.Route, 0, len(m)+len(s.services))
	for p, a := range m {
		slices.Sort(a.owners)
		out = append(out, advert.Route{Prefix: p, Kind: a.kind, Owners: slices.Compact(a.owners)})
	}
	for p, r := range s.services {
		if m[p] == nil { // a pod's route outranks it
			out = append(out, advert.Route{Prefix: p, Kind: r.Path.Kind, Drain: r.Path.Drain, Weight: r.Path.Weight, Owners: slices.Clone(r.Owners)})
		}
	}
	slices.SortFunc(out, func(a, b advert.Route) int { return advert.ComparePrefixes(a.Prefix, b.Prefix) })
	return out, s.gen
}

// HostRoutes is the desired kernel host route set, sorted by prefix.
func (s *State) HostRoutes() ([]HostRoute, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[netip.Prefix]*HostRoute{}
	s.routedLocked(func(e *entry, ready bool) {
		if !ready {
			return
		}
		r := &e.rec
		for _, set := range []struct {
			kind Kind
			ips  []netip.Addr
		}{{KindAnycast, r.Anycast}, {KindAddress, r.Addresses}} {
			for _, ip := range set.ips {
				nh, ok := nexthop(r.IPs, r.HostVeth, ip)
				if !ok {
					continue // validated at ADD: the pod has that family
				}
				p := hostPrefix(ip)
				h := m[p]
				if h == nil {
					h = &HostRoute{Prefix: p, Kind: set.kind}
					m[p] = h
				}
				if set.kind == KindAddress {
					h.Kind = KindAddress
				}
				h.Nexthops = append(h.Nexthops, nh)
				h.Owners = append(h.Owners, r.ContainerID)
			}
		}
	})
	out := make([]HostRoute, 0, len(m))
	for _, h := range m {
		slices.SortFunc(h.Nexthops, dataplane.CompareNexthops)
		h.Nexthops = slices.Compact(h.Nexthops)
		slices.Sort(h.Owners)
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b HostRoute) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	return out, s.gen
}

// nexthop is the pod address of ip's family on its veth.
func nexthop(podIPs []netip.Addr, veth string, ip netip.Addr) (dataplane.Nexthop, bool) {
	for _, a := range podIPs {
		if a.Is4() == ip.Is4() {
			return dataplane.Nexthop{Gateway: a, Dev: veth}, true
		}
	}
	return dataplane.Nexthop{}, false
}
