package agent_test

// "Pools changed under load" for the randomized model (model_test.go): a
// worker now and then replaces the node's pod pools (AddressPools of use
// pod) while the others ADD and DEL, sometimes with pools laid over the
// anycast and `addresses` IPs the workers ask for, and pods ask for
// addresses from those pools with the sequential allocator, which tries
// the lowest addresses — the in-use ones — first. At every quiescent point
// no IP is held twice: a pod address is never an anycast or `addresses`
// IP in use, and IPAM counts exactly the live pod addresses as used and
// the live anycast and `addresses` IPs inside its pools as held.

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/ipam"
)

// Pod pools an operator may lay over addresses in use: over the anycast
// IPs of modelAnycast, over the `addresses` IPs of modelAddrs.
var (
	overAnycast6 = netip.MustParsePrefix("2001:db8:ff::/124")
	overAnycast4 = netip.MustParsePrefix("203.0.113.0/28")
	overAddrs6   = netip.MustParsePrefix("2001:db8:aa::/124")
)

// modelPodPoolSets are what a pool change picks from; shared6 is always
// there.
var modelPodPoolSets = [][]netip.Prefix{
	nil,
	{overAnycast6, overAnycast4},
	{overAddrs6},
	{overAnycast6, overAnycast4, overAddrs6},
}

// podPools are the node's pod pools now.
func (m *model) podPools() []netip.Prefix {
	m.poolsMu.Lock()
	defer m.poolsMu.Unlock()
	return append([]netip.Prefix{shared6}, m.pools...)
}

// changePools replaces the node's pod pools, as an AddressPool change
// does, while the other workers run.
func (m *model) changePools(rnd *rand.Rand) {
	m.poolsMu.Lock()
	defer m.poolsMu.Unlock()
	m.pools = modelPodPoolSets[rnd.IntN(len(modelPodPoolSets))]
	if skipped, err := m.e.state.SetPodPools(append([]netip.Prefix{shared6}, m.pools...)); err != nil || skipped != nil {
		m.t.Errorf("SetPodPools(%v): skipped %v, %v", m.pools, skipped, err)
	}
}

// rangeArgs are the cidr6/cidr4 annotations (if any) of one ADD: the
// shared pool, or one of the pools over addresses in use, taken in
// order. An ADD from a pool not configured now fails, as it would.
func rangeArgs(rnd *rand.Rand) []string {
	seq := annotations.IPAlgo + "=sequential"
	switch rnd.IntN(9) {
	case 0, 1, 2:
		return []string{annotations.CIDR6 + "=" + shared6.String()}
	case 3:
		return []string{annotations.CIDR6 + "=" + overAnycast6.String(), seq}
	case 4:
		return []string{annotations.CIDR6 + "=" + overAddrs6.String(), seq}
	case 5:
		return []string{annotations.CIDR4 + "=" + overAnycast4.String(), seq}
	}
	return nil
}

// checkInUse: no live pod address is an anycast or `addresses` IP of a
// live attachment (its own or another's), and IPAM counts each pod pool
// right: the live pod addresses inside it used, the live anycast and
// `addresses` IPs inside it (its usable part) held.
func (m *model) checkInUse(when string, recs []store.Allocation) {
	t := m.t
	t.Helper()
	podIP := map[netip.Addr]string{}
	claimed := map[netip.Addr]bool{}
	for _, r := range recs {
		for _, ip := range r.IPs {
			podIP[ip] = r.ContainerID
		}
		for _, ip := range append(slices.Clone(r.Anycast), r.Addresses...) {
			claimed[ip] = true
		}
	}
	for _, r := range recs {
		for _, ip := range append(slices.Clone(r.Anycast), r.Addresses...) {
			if o, dup := podIP[ip]; dup {
				t.Errorf("%s: %s is the pod address of %s and an anycast/addresses IP of %s", when, ip, o, r.ContainerID)
			}
		}
	}
	for _, st := range m.e.state.IPAM() {
		p := st.Pool.Prefix
		if p == pool6 || p == pool4 {
			continue // the summaries: model_test.go counts them
		}
		var used, held uint64
		for ip := range podIP {
			if p.Contains(ip) {
				used++
			}
		}
		first, last := p.Masked().Addr(), lastAddr(p)
		for ip := range claimed {
			if p.Contains(ip) && ip != first && ip != last {
				held++
			}
		}
		if st.Used != used || st.Held != held {
			t.Errorf("%s: IPAM %s used %d held %d; live pod addresses %d, live anycast/addresses IPs %d", when, p, st.Used, st.Held, used, held)
		}
	}
	if got, want := fmt.Sprint(ipamPrefixes(m.e.state.IPAM())), fmt.Sprint(append([]netip.Prefix{pool6, pool4}, m.podPools()...)); got != want {
		t.Errorf("%s: IPAM pools %s, want %s", when, got, want)
	}
}

func ipamPrefixes(stats []ipam.PoolStats) []netip.Prefix {
	var out []netip.Prefix
	for _, st := range stats {
		out = append(out, st.Pool.Prefix)
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(a)*8; i++ {
		a[i/8] |= 1 << (7 - i%8)
	}
	out, _ := netip.AddrFromSlice(a)
	return out
}

// claimedByLive tells whether ip is an anycast or `addresses` IP of a
// live attachment (a deleted pod's address may have become one).
func claimedByLive(recs []store.Allocation, ip netip.Addr) bool {
	return slices.ContainsFunc(recs, func(r store.Allocation) bool {
		return slices.Contains(r.Anycast, ip) || slices.Contains(r.Addresses, ip)
	})
}
