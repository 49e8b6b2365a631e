package nodestate

import (
	"net/netip"
	"slices"
)

// Holds tells whether the attachment id (in any phase) holds ip as a pod
// IP or an `addresses` IP: a cluster-wide claim of this node that no
// attachment holds is garbage.
func (s *State) Holds(id string, ip netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[id]
	return e != nil && (slices.Contains(e.rec.IPs, ip) || slices.Contains(e.rec.Addresses, ip))
}
