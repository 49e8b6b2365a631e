package nodestate

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
)

// checkClaimsLocked: an anycast or `addresses` IP is never another
// attachment's pod address; an `addresses` IP belongs to one attachment;
// an anycast IP may be shared, but never with an attachment that holds it
// as an `addresses` IP. A new one (ADD) must not lie inside a pod pool
// either (IPAM hands those out). A restored one may: a pod pool that
// arrived over it while it was in use leaves it where it is (IPAM holds
// it), since nothing in use moves.
func (s *State) checkClaimsLocked(rec store.Allocation, restoring bool) error {
	id := rec.ContainerID
	for _, set := range []struct {
		key string
		ips []netip.Addr
	}{{annotations.Anycast, rec.Anycast}, {annotations.Addresses, rec.Addresses}} {
		for _, ip := range set.ips {
			// Inside a pod pool is bad input whoever holds the IP now, so
			// it is named first: the answer must not depend on which
			// address IPAM happened to hand out.
			if !restoring {
				if err := s.NotInPodPool(set.key, ip); err != nil {
					return err
				}
			}
			if o, ok := s.ipam.Owner(ip); ok && o != id {
				return &ConflictError{Key: set.key, IP: ip, Reason: fmt.Sprintf("is the pod address of container %s", o)}
			}
			if o, ok := s.outside[ip]; ok && o != id {
				return &ConflictError{Key: set.key, IP: ip, Reason: fmt.Sprintf("is the pod address of container %s", o)}
			}
		}
	}
	for _, ip := range rec.Addresses {
		if c := s.claims[ip]; c != nil {
			if o := c.other(id); o != "" {
				return &ConflictError{Key: annotations.Addresses, IP: ip, Reason: fmt.Sprintf("is already claimed by container %s (as %s)", o, c.kind)}
			}
		}
	}
	for _, ip := range rec.Anycast {
		if c := s.claims[ip]; c != nil && c.kind == KindAddress {
			if o := c.other(id); o != "" {
				return &ConflictError{Key: annotations.Anycast, IP: ip, Reason: fmt.Sprintf("is an `addresses` IP of container %s, not anycast", o)}
			}
		}
	}
	return nil
}

func (c *claim) other(id string) string {
	var out []string
	for _, o := range c.owners {
		if o != id {
			out = append(out, o)
		}
	}
	if len(out) == 0 {
		return ""
	}
	slices.Sort(out)
	return out[0]
}

// NotInPodPool refuses an anycast or `addresses` IP (named by its
// annotation key) inside a pod pool, where IPAM hands addresses out.
func (s *State) NotInPodPool(key string, ip netip.Addr) error {
	if p, ok := s.ipam.PoolOf(ip); ok {
		return &annotations.Error{Key: key, Value: ip.String(), Reason: fmt.Sprintf("inside pod pool %s, where IPAM hands addresses out", p.Prefix)}
	}
	return nil
}

// InUse is an anycast or `addresses` IP in use on the node.
type InUse struct {
	IP   netip.Addr
	Kind Kind
	// Pods holding it, as namespace/name, sorted.
	Pods []string
}

func (u InUse) String() string {
	return fmt.Sprintf("%s (%s: %s)", u.IP, u.Kind, strings.Join(u.Pods, ", "))
}

// InUseIn lists the anycast and `addresses` IPs in use on the node (in
// any phase) inside p, sorted: what a pod pool over p must leave alone.
func (s *State) InUseIn(p netip.Prefix) []InUse {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []InUse
	for ip, c := range s.claims {
		if !p.Contains(ip) {
			continue
		}
		u := InUse{IP: ip, Kind: c.kind}
		for _, o := range c.owners {
			if e := s.entries[o]; e != nil {
				u.Pods = append(u.Pods, e.rec.Pod.Namespace+"/"+e.rec.Pod.Name)
			}
		}
		slices.Sort(u.Pods)
		u.Pods = slices.Compact(u.Pods)
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b InUse) int { return a.IP.Compare(b.IP) })
	return out
}
