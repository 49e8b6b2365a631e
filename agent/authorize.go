package agent

import (
	"fmt"
	"net/netip"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Authority decides whether a pod's namespace may use an address (or a
// cidr6/cidr4 range) for a use: v1alpha1.UsePod, UseAnycast or
// UseAddresses. It returns the AddressPool that allows it.
type Authority interface {
	Authorize(use string, want netip.Prefix, namespace string) (pool string, err error)
}

// AuthError is a value a pod asked for that no AddressPool allows it.
type AuthError struct {
	Pod podmeta.ID
	Key string // the annotation
	Err error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("pod %s: annotation %s: %v", e.Pod, e.Key, e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }

// grants are the pools that authorized a pod's values.
type grants map[netip.Addr]string

// authorize checks every anycast, addresses, cidr6 and cidr4 value a pod
// asks for. A range inside one of the node's summaries needs no pool: the
// node's own addresses are open to every pod.
func (a *Agent) authorize(pod podmeta.Pod, req annotations.Request) (grants, map[netip.Prefix]string, error) {
	ips := grants{}
	ranges := map[netip.Prefix]string{}
	if a.cfg.Authority == nil {
		return ips, ranges, nil
	}
	check := func(key, use string, want netip.Prefix) (string, error) {
		pool, err := a.cfg.Authority.Authorize(use, want, pod.Namespace)
		if err != nil {
			return "", &AuthError{Pod: pod.ID, Key: key, Err: err}
		}
		return pool, nil
	}
	for _, r := range []struct {
		key string
		rng netip.Prefix
	}{{annotations.CIDR6, req.CIDR6}, {annotations.CIDR4, req.CIDR4}} {
		if !r.rng.IsValid() || a.inSummary(r.rng) {
			continue
		}
		pool, err := check(r.key, v1alpha1.UsePod, r.rng)
		if err != nil {
			return nil, nil, err
		}
		ranges[r.rng] = pool
	}
	for _, set := range []struct {
		key, use string
		ips      []netip.Addr
	}{{annotations.Anycast, v1alpha1.UseAnycast, req.Anycast}, {annotations.Addresses, v1alpha1.UseAddresses, req.Addresses}} {
		for _, ip := range set.ips {
			// The more precise reason first: a pod pool is IPAM's.
			if err := a.state.NotInPodPool(set.key, ip); err != nil {
				return nil, nil, err
			}
			pool, err := check(set.key, set.use, netip.PrefixFrom(ip, ip.BitLen()))
			if err != nil {
				return nil, nil, err
			}
			ips[ip] = pool
		}
	}
	return ips, ranges, nil
}

func (a *Agent) inSummary(p netip.Prefix) bool {
	for _, s := range a.state.Summaries() {
		if s.Bits() <= p.Bits() && s.Contains(p.Addr()) {
			return true
		}
	}
	return false
}
