package main

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol"
)

// /metrics is the default registry (where the engine registers its
// kube_network_policies_* series), /healthz answers while the process
// runs, /readyz only while the engine enforces, else 503 with the reason.
func TestMetricsHandler(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "flock_policy_test_total", Help: "a series of the default registry"})
	prometheus.MustRegister(c)
	t.Cleanup(func() { prometheus.Unregister(c) })
	c.Add(3)
	notReady := errors.New("no process reads NFQUEUE 100 yet")
	h := metricsHandler(func() error { return notReady })
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "flock_policy_test_total 3") || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics: %d, want 200 with the default registry's series:\n%s", code, body)
	}
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q, want 200", code, body)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || body != "not ready: no process reads NFQUEUE 100 yet\n" {
		t.Errorf("/readyz not enforcing: %d %q, want 503 with the reason on one line", code, body)
	}
	notReady = nil
	if code, body := get("/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz enforcing: %d %q, want 200", code, body)
	}
}

// Each change of the readiness answer is logged once, with its reason:
// the kubelet's events show only the 503.
func TestLoggedReadyLogsChanges(t *testing.T) {
	var buf strings.Builder
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	var answer error = errors.New("nftables table inet flock-netpol does not exist yet")
	ready := loggedReady(func() error { return answer }, log)
	for range 3 {
		if err := ready(); err != answer {
			t.Fatalf("ready() = %v, want the answer it wraps", err)
		}
	}
	answer = nil
	_, _ = ready(), ready()
	answer = errors.New("no process reads NFQUEUE 100 yet")
	_ = ready()
	want := `level=WARN msg="not ready" why="nftables table inet flock-netpol does not exist yet"
level=INFO msg="ready: NetworkPolicy is enforced on this node"
level=WARN msg="not ready" why="no process reads NFQUEUE 100 yet"
`
	if buf.String() != want {
		t.Errorf("logged:\n%s\nwant each change once:\n%s", buf.String(), want)
	}
}

// A taken metrics address or an admin socket path that is not a socket
// fails the start, naming it, before the engine touches the kernel.
func TestListenersFailTheStart(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	notSocket := filepath.Join(dir, "policy.sock")
	if err := os.WriteFile(notSocket, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := netpol.Config{NodeName: "n1", QueueID: 100}
	for _, tc := range []struct {
		ep   endpoints
		want string
	}{
		{endpoints{metrics: taken.Addr().String()}, "metrics on " + taken.Addr().String()},
		{endpoints{admin: notSocket}, notSocket + " exists and is not a socket"},
		{endpoints{metrics: "127.0.0.1:0", admin: notSocket}, "not a socket"},
	} {
		if err := run(cfg, kubeconfig, tc.ep, lbConfig{}, log); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", tc.ep, err, tc.want)
		}
	}
	if b, _ := os.ReadFile(notSocket); string(b) != "keep" {
		t.Error("a file at the admin socket's path was touched")
	}
}

// The admin socket serves the policy view and Go's profiles (make scale
// reads flock-policy's CPU profile there).
func TestAdminHandler(t *testing.T) {
	view := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("view")) })
	h := adminHandler(view)
	for path, want := range map[string]string{"/v1/policies": "view", "/debug/pprof/": "goroutine"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s: %d, body without %q", path, rec.Code, want)
		}
	}
}

// flock-policy runs on one thread unless GOMAXPROCS says otherwise.
func TestProcs(t *testing.T) {
	for _, tc := range []struct {
		env       string
		cur, want int
	}{
		{"", 64, 1},
		{"", 1, 1},
		{"4", 4, 4},
		{"1", 1, 1},
	} {
		if got := procs(tc.env, tc.cur); got != tc.want {
			t.Errorf("procs(%q, %d) = %d, want %d", tc.env, tc.cur, got, tc.want)
		}
	}
}
