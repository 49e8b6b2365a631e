package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/status"
)

// The Service and LoadBalancer figures of the snapshot reach /metrics.
func TestServiceMetrics(t *testing.T) {
	snap := status.Node{
		Services:            map[string]int{"advertised": 2, "draining": 1, "not advertised": 3},
		ServiceRouteChanges: 7,
		LoadBalancer: &status.LoadBalancer{Leader: true, Failures: map[string]uint64{"Exhausted": 4},
			Pools: []status.LoadBalancerPool{{Name: "lb", Used: 5, Size: 16}}},
	}
	m := New(func() status.Node { return snap })
	srv := httptest.NewServer((&Server{Metrics: m, Ready: func() error { return nil }}).Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`flock_service_addresses{state="advertised"} 2`,
		`flock_service_addresses{state="draining"} 1`,
		`flock_service_addresses{state="not advertised"} 3`,
		`flock_service_route_changes_total 7`,
		`flock_loadbalancer_leader 1`,
		`flock_loadbalancer_pool_addresses{pool="lb",state="used"} 5`,
		`flock_loadbalancer_pool_addresses{pool="lb",state="size"} 16`,
		`flock_loadbalancer_assignment_failures_total{reason="Exhausted"} 4`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
