package services

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// TestAggregateProperties checks aggregation on random Services: it never
// changes what a node does with an address (state, reason), only the
// route it goes out as; an aggregate goes out exactly while some
// advertised Cluster address of its pool does; Local and draining
// addresses always go out on their own; every advertised address is
// covered by the route its row names, with its Service among the owners.
// FLOCK_SEED=<n> repeats a run.
func TestAggregateProperties(t *testing.T) {
	seed := testutil.Seed(t)
	r := rand.New(rand.NewPCG(uint64(seed), 0))
	pool6, pool4 := netip.MustParsePrefix("2001:db8:1b::/120"), netip.MustParsePrefix("203.0.113.128/28")
	aggregate := func(use string, ip netip.Addr) netip.Prefix {
		for _, p := range []netip.Prefix{pool6, pool4} {
			if use == v1alpha1.UseLoadBalancer && p.Contains(ip) {
				return p
			}
		}
		return netip.Prefix{}
	}
	universe := []string{"2001:db8:1b::1", "2001:db8:1b::2", "2001:db8:1b::3", "203.0.113.129", "203.0.113.130", "2001:db8:e::5"}
	states := []string{"ready", "terminating", "down"}
	rounds := 3000
	if testing.Short() {
		rounds = 300
	}
	for round := range rounds {
		var svcs []*corev1.Service
		eps := map[string][]*discoveryv1.EndpointSlice{}
		for i := range 1 + r.IntN(6) {
			name := fmt.Sprintf("s%d", i)
			var opts []svcOpt
			opts = append(opts, ingress(universe[r.IntN(5)]))
			if r.IntN(2) == 0 {
				opts = append(opts, local)
			}
			if r.IntN(3) == 0 {
				opts = append(opts, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{universe[5]} })
			}
			svcs = append(svcs, svc(name, opts...))
			var es []ep
			for j := range r.IntN(4) {
				nd := node
				if r.IntN(2) == 0 {
					nd = "node-b"
				}
				es = append(es, ep{nd, fmt.Sprintf("fd00:10::%d", j+1), states[r.IntN(3)]}, ep{nd, fmt.Sprintf("10.1.0.%d", j+1), states[r.IntN(3)]})
			}
			eps["shop/"+name] = slicesFor(name, es...)
		}
		slicesOf := func(k string) []*discoveryv1.EndpointSlice { return eps[k] }
		plain, plainRoutes := Compute(Options{Node: node, Authorize: authorize}, svcs, slicesOf)
		agg, routes := Compute(Options{Node: node, Authorize: authorize, Aggregate: aggregate}, svcs, slicesOf)
		if len(plain) != len(agg) {
			t.Fatalf("round %d: %d rows with aggregation, %d without", round, len(agg), len(plain))
		}
		wantAgg := map[netip.Prefix]bool{}
		for i, a := range agg {
			p := plain[i]
			if a.Service != p.Service || a.IP != p.IP || a.State != p.State || a.Reason != p.Reason {
				t.Fatalf("round %d: aggregation changed a row: %+v → %+v", round, p, a)
			}
			host := netip.PrefixFrom(a.IP, a.IP.BitLen())
			switch {
			case a.State == StateNotAdvertised:
				if a.Route.IsValid() {
					t.Fatalf("round %d: %+v goes out though not advertised", round, a)
				}
				continue
			case a.Local || a.State == StateDraining || a.Source == SourceExternalIP:
				if a.Route != host {
					t.Fatalf("round %d: %+v (Local, draining or unaggregated pool) not on its own", round, a)
				}
			default:
				if agg := aggregate(v1alpha1.UseLoadBalancer, a.IP); a.Route != agg {
					t.Fatalf("round %d: %+v (Cluster) not as its pool's CIDR %s", round, a, agg)
				}
				wantAgg[a.Route] = true
			}
			rt, ok := routes[a.Route]
			if !ok || !a.Route.Contains(a.IP) || !slices.Contains(rt.Owners, a.Service) {
				t.Fatalf("round %d: %+v: route %v missing or not its Service's: %v", round, a, a.Route, routes)
			}
			if p.Route != host {
				t.Fatalf("round %d: without aggregation %+v goes out as %v", round, p, p.Route)
			}
		}
		for pfx, rt := range routes {
			isAgg := pfx == pool6 || pfx == pool4
			if isAgg && !wantAgg[pfx] {
				t.Fatalf("round %d: aggregate %s out with no advertised Cluster address of its pool", round, pfx)
			}
			if isAgg && rt.Path.Drain {
				t.Fatalf("round %d: aggregate %s drains", round, pfx)
			}
		}
		for pfx := range wantAgg {
			if _, ok := routes[pfx]; !ok {
				t.Fatalf("round %d: aggregate %s missing", round, pfx)
			}
		}
		for pfx := range plainRoutes {
			if pfx.Bits() != pfx.Addr().BitLen() {
				t.Fatalf("round %d: %s without aggregation", round, pfx)
			}
		}
	}
}
