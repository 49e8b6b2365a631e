package nodestate

import (
	"maps"
	"net/netip"
	"slices"

	"code.fritzlab.net/fritzlab/flock/advert"
)

// ServiceRoute is a Service address this node delivers (see k8s/delivery):
// how it goes out, and the Services (namespace/name) it is for.
type ServiceRoute struct {
	Path   advert.Path // Kind advert.Service
	Owners []string    // sorted
}

func (r ServiceRoute) equal(o ServiceRoute) bool {
	return r.Path == o.Path && slices.Equal(r.Owners, o.Owners)
}

// SetServiceRoutes replaces the Service routes (the full set, as the
// services controller derives it) and returns the new generation, or the
// current one when nothing changed. They join the BGP set under the pod
// routes: a prefix that is also a pod's route is advertised as that
// (AddressPool validation keeps them apart). No kernel route: kube-proxy
// delivers what arrives.
func (s *State) SetServiceRoutes(routes map[netip.Prefix]ServiceRoute) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if maps.EqualFunc(routes, s.services, ServiceRoute.equal) {
		return s.gen
	}
	for p, r := range s.services {
		if n, ok := routes[p]; !ok || !n.equal(r) {
			s.des.dirty[p] = struct{}{}
		}
	}
	next := make(map[netip.Prefix]ServiceRoute, len(routes))
	for p, r := range routes {
		if o, ok := s.services[p]; !ok || !o.equal(r) {
			s.des.dirty[p] = struct{}{}
		}
		r.Owners = slices.Clone(r.Owners)
		next[p] = r
	}
	s.services = next
	return s.changedLocked()
}

// ServiceRoutes returns the Service routes last set.
func (s *State) ServiceRoutes() map[netip.Prefix]ServiceRoute {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.services)
}
