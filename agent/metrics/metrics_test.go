package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/status"
)

// The Service figures of the snapshot reach /metrics (the route changes
// even when nothing changed: a counter at 0 is still a series).
func TestServiceMetrics(t *testing.T) {
	snap := status.Node{
		Services:            map[string]int{"advertised": 2, "draining": 1, "not advertised": 3},
		ServiceRouteChanges: 7,
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
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
