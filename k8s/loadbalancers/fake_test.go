package loadbalancers

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
)

// fakeClaims is the cluster-wide claims, Services' and pods', with the
// rules of k8s/claims: one claim per IP; a Service's claim held by its
// holders under a sharing key, which another Service of their namespace
// joins only with the same non-empty key; a holder's key and terms are
// the claim's, its key changed only while it holds the claim alone; the
// claim goes with its last holder; a pod's claim is never shared.
type fakeClaims struct {
	mu     sync.Mutex
	svc    map[netip.Addr]*fakeClaim
	pods   map[netip.Addr]string
	failOn netip.Addr // a pod takes it between reserve and claim
	// writes counts Claim and Release calls that changed something.
	writes int
}

type fakeClaim struct {
	key     string
	holders []ServiceRef // the first is spec.service
}

func newFakeClaims() *fakeClaims {
	return &fakeClaims{svc: map[netip.Addr]*fakeClaim{}, pods: map[netip.Addr]string{}}
}

// sameSvc is claims.ServiceRef.Same.
func sameSvc(a, b ServiceRef) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && (a.UID == "" || b.UID == "" || a.UID == b.UID)
}

func (c *fakeClaim) heldBy(s ServiceRef) bool {
	return slices.ContainsFunc(c.holders, func(h ServiceRef) bool { return sameSvc(h, s) })
}

func (c *fakeClaim) describe() string {
	return fmt.Sprintf("Service %v (sharing key %q)", c.holders, c.key)
}

func (f *fakeClaims) Claim(_ context.Context, ip netip.Addr, _ string, s ServiceRef, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ip == f.failOn {
		f.pods[ip] = "pod shop/racer"
		f.failOn = netip.Addr{}
	}
	if h, ok := f.pods[ip]; ok {
		return &HeldError{IP: ip, Holder: h}
	}
	c := f.svc[ip]
	i := -1
	if c != nil {
		i = slices.IndexFunc(c.holders, func(h ServiceRef) bool { return sameSvc(h, s) })
	}
	switch {
	case c == nil:
		f.svc[ip] = &fakeClaim{key: key, holders: []ServiceRef{s}}
	case i >= 0 && c.key == key && c.holders[i].Terms == s.Terms:
		return nil
	case i >= 0 && (c.key == key || len(c.holders) == 1):
		c.key, c.holders[i].Terms = key, s.Terms
	case i < 0 && key != "" && c.key == key && c.holders[0].Namespace == s.Namespace:
		c.holders = append(c.holders, s)
	default:
		return &HeldError{IP: ip, Holder: c.describe(), Services: slices.Clone(c.holders)}
	}
	f.writes++
	return nil
}

func (f *fakeClaims) Release(_ context.Context, ip netip.Addr, s ServiceRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.svc[ip]
	if c == nil || !c.heldBy(s) {
		return nil
	}
	c.holders = slices.DeleteFunc(c.holders, func(h ServiceRef) bool { return sameSvc(h, s) })
	if len(c.holders) == 0 {
		delete(f.svc, ip)
	}
	f.writes++
	return nil
}

func (f *fakeClaims) Services() map[netip.Addr][]ServiceRef {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[netip.Addr][]ServiceRef, len(f.svc))
	for ip, c := range f.svc {
		out[ip] = slices.Clone(c.holders)
	}
	return out
}

func (f *fakeClaims) Others() map[netip.Addr]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[netip.Addr]string, len(f.pods))
	for ip, by := range f.pods {
		out[ip] = by
	}
	return out
}
