// Package metrics exposes the agent's Prometheus metrics and its health
// endpoints on one HTTP listener (loopback by default).
package metrics

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/status"
)

// DefaultAddress serves metrics on loopback only.
const DefaultAddress = "127.0.0.1:9476"

// Metrics are flock's own instruments.
type Metrics struct {
	Registry       *prometheus.Registry
	CNIRequests    *prometheus.CounterVec
	CNIDuration    *prometheus.HistogramVec
	ReconcileTime  *prometheus.HistogramVec
	LeaksCollected prometheus.Counter
	ReloadsTotal   *prometheus.CounterVec
}

// New registers flock's metrics, the gauges read from the status snapshot
// at scrape time, the Go and process collectors and any extra collectors
// (GoBGP's own).
func New(snapshot func() status.Node, extra ...prometheus.Collector) *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		CNIRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flock_cni_requests_total", Help: "CNI requests served by the agent, by op and result.",
		}, []string{"op", "result"}),
		CNIDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flock_cni_request_duration_seconds", Help: "Agent-side CNI request latency, by op and result.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"op", "result"}),
		ReconcileTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flock_reconcile_duration_seconds", Help: "Time of one reconcile pass, by target (bgp, kernel) and whether it was a full repair.",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5},
		}, []string{"target", "full"}),
		LeaksCollected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flock_leaked_allocations_collected_total", Help: "Allocations released because their pod no longer exists.",
		}),
		ReloadsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flock_config_reloads_total", Help: "NodeConfig reloads, by result.",
		}, []string{"result"}),
	}
	r.MustRegister(m.CNIRequests, m.CNIDuration, m.ReconcileTime, m.LeaksCollected, m.ReloadsTotal,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&scrape{snapshot: snapshot})
	for _, c := range extra {
		r.MustRegister(c)
	}
	return m
}

// ObserveCNI records one CNI request.
func (m *Metrics) ObserveCNI(op string, ok bool, d time.Duration) {
	res := "success"
	if !ok {
		res = "error"
	}
	m.CNIRequests.WithLabelValues(op, res).Inc()
	m.CNIDuration.WithLabelValues(op, res).Observe(d.Seconds())
}

// ObserveReconcile records one reconcile pass.
func (m *Metrics) ObserveReconcile(target string, full bool, d time.Duration, _ error) {
	m.ReconcileTime.WithLabelValues(target, strconv.FormatBool(full)).Observe(d.Seconds())
}

var (
	descPool            = prometheus.NewDesc("flock_ipam_addresses", "Addresses per IPAM pool, by state (used, free).", []string{"pool", "state"}, nil)
	descAdvertised      = prometheus.NewDesc("flock_bgp_advertised_routes", "Paths the node originates, by kind.", []string{"kind"}, nil)
	descSession         = prometheus.NewDesc("flock_bgp_session_established", "1 if the BGP session to the peer is established.", []string{"peer"}, nil)
	descMismatch        = prometheus.NewDesc("flock_bgp_rfc5549_mismatch", "1 if IPv4 routes are withheld from the peer because it did not negotiate the extended next hop capability.", []string{"peer"}, nil)
	descReconcileErrors = prometheus.NewDesc("flock_reconcile_errors_total", "Failed reconcile passes, by target (bgp, kernel).", []string{"target"}, nil)
	descReconcileFail   = prometheus.NewDesc("flock_reconcile_failing", "1 while the last reconcile pass of the target failed.", []string{"target"}, nil)
	descReapFailures    = prometheus.NewDesc("flock_reap_failures_total", "Reaps (of allocations whose network namespace is gone) that failed; each is retried with back-off.", nil, nil)
	descReaped          = prometheus.NewDesc("flock_allocations_reaped_total", "Allocations torn down without a DEL, by reason (netns-gone: the pod's network namespace vanished, e.g. a reboot; interrupted-add: a crash mid-ADD).", []string{"reason"}, nil)
	descAllocations     = prometheus.NewDesc("flock_allocations", "Committed pod attachments on this node.", nil, nil)
	descServiceAddrs    = prometheus.NewDesc("flock_service_addresses", "Service addresses (LoadBalancer and external IPs) by what this node does with them: advertised, draining, not advertised.", []string{"state"}, nil)
	descServiceChanges  = prometheus.NewDesc("flock_service_route_changes_total", "Changes of this node's Service routes (advertised, drained, withdrawn).", nil, nil)
)

// scrape renders the status snapshot at scrape time, so nothing polls.
type scrape struct{ snapshot func() status.Node }

func (s *scrape) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPool, descAdvertised, descSession, descMismatch, descReconcileErrors, descReconcileFail, descReaped, descReapFailures, descAllocations,
		descServiceAddrs, descServiceChanges} {
		ch <- d
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (s *scrape) Collect(ch chan<- prometheus.Metric) {
	if s.snapshot == nil {
		return
	}
	n := s.snapshot()
	ch <- prometheus.MustNewConstMetric(descAllocations, prometheus.GaugeValue, float64(n.Allocations))
	for _, p := range n.Pools {
		ch <- prometheus.MustNewConstMetric(descPool, prometheus.GaugeValue, float64(p.Used), p.Pool.Prefix.String(), "used")
		ch <- prometheus.MustNewConstMetric(descPool, prometheus.GaugeValue, p.FreeApprox, p.Pool.Prefix.String(), "free")
	}
	for k, c := range n.Advertised {
		ch <- prometheus.MustNewConstMetric(descAdvertised, prometheus.GaugeValue, float64(c), string(k))
	}
	for _, p := range n.Neighbors {
		ch <- prometheus.MustNewConstMetric(descSession, prometheus.GaugeValue, b2f(p.Established()), p.Peer)
		ch <- prometheus.MustNewConstMetric(descMismatch, prometheus.GaugeValue, b2f(p.RFC5549Mismatch), p.Peer)
	}
	for _, r := range n.Reconcilers {
		ch <- prometheus.MustNewConstMetric(descReconcileErrors, prometheus.CounterValue, float64(r.Errors), r.Target)
		ch <- prometheus.MustNewConstMetric(descReconcileFail, prometheus.GaugeValue, b2f(r.Failing), r.Target)
	}
	ch <- prometheus.MustNewConstMetric(descReapFailures, prometheus.CounterValue, float64(n.ReapFailures))
	for reason, c := range n.Reaped {
		ch <- prometheus.MustNewConstMetric(descReaped, prometheus.CounterValue, float64(c), reason)
	}
	for state, c := range n.Services {
		ch <- prometheus.MustNewConstMetric(descServiceAddrs, prometheus.GaugeValue, float64(c), state)
	}
	if n.Services != nil { // Kubernetes mode
		ch <- prometheus.MustNewConstMetric(descServiceChanges, prometheus.CounterValue, float64(n.ServiceRouteChanges))
	}
}

// Server is /metrics, /healthz and /readyz on one TCP address.
type Server struct {
	Addr    string
	Metrics *Metrics
	// Ready is nil once the agent has recovered its state, serves CNI and
	// nothing keeps it from being Ready (a CNI installer's refusal); else
	// why not, which /readyz answers with 503.
	Ready func() error
}

// Handler serves the three endpoints.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.Metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	l, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("metrics on %s: %w", s.Addr, err)
	}
	return admin.ServeHTTP(ctx, l, s.Handler())
}
