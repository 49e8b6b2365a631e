// Package metrics exposes the agent's Prometheus metrics and its health
// endpoints on one HTTP listener (loopback by default).
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultAddress serves metrics on loopback only.
const DefaultAddress = "127.0.0.1:9476"

// Metrics are flock's own instruments.
type Metrics struct {
	Registry        *prometheus.Registry
	CNIRequests     *prometheus.CounterVec
	CNIDuration     *prometheus.HistogramVec
	ReconcileTime   *prometheus.HistogramVec
	LeaksCollected  prometheus.Counter
	ReloadsTotal    *prometheus.CounterVec
	rfc5549Mismatch *prometheus.GaugeVec
}

// Source is read at scrape time.
type Source struct {
	// Pools returns per pool: cidr, used, free (approximate for huge pools).
	Pools func() []PoolUsage
	// Advertised counts the paths the speaker originates per kind.
	Advertised func() map[string]int
	// Sessions reports per peer whether it is established, and whether the
	// RFC 5549 guard holds IPv4 back from it.
	Sessions func() []Session
}

// PoolUsage of one IPAM pool.
type PoolUsage struct {
	CIDR       string
	Used, Free float64
}

// Session of one peer.
type Session struct {
	Peer        string
	Established bool
	Mismatch    bool
}

// New registers flock's metrics plus the Go and process collectors and any
// extra collectors (GoBGP's own).
func New(src Source, extra ...prometheus.Collector) *Metrics {
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
			Name: "flock_bgp_reconcile_duration_seconds", Help: "Time to push desired-set changes into the BGP speaker (full = periodic resync).",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5},
		}, []string{"full"}),
		LeaksCollected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "flock_leaked_allocations_collected_total", Help: "Allocations released because their pod no longer exists.",
		}),
		ReloadsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flock_config_reloads_total", Help: "NodeConfig reloads, by result.",
		}, []string{"result"}),
	}
	r.MustRegister(m.CNIRequests, m.CNIDuration, m.ReconcileTime, m.LeaksCollected, m.ReloadsTotal,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&scrape{src: src})
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

// ObserveReconcile records one BGP reconcile pass.
func (m *Metrics) ObserveReconcile(full bool, d time.Duration, _ error) {
	m.ReconcileTime.WithLabelValues(strconv.FormatBool(full)).Observe(d.Seconds())
}

var (
	descPool       = prometheus.NewDesc("flock_ipam_addresses", "Addresses per IPAM pool, by state (used, free).", []string{"pool", "state"}, nil)
	descAdvertised = prometheus.NewDesc("flock_bgp_advertised_routes", "Paths the node originates, by kind.", []string{"kind"}, nil)
	descSession    = prometheus.NewDesc("flock_bgp_session_established", "1 if the BGP session to the peer is established.", []string{"peer"}, nil)
	descMismatch   = prometheus.NewDesc("flock_bgp_rfc5549_mismatch", "1 if IPv4 routes are withheld from the peer because it did not negotiate the extended next hop capability.", []string{"peer"}, nil)
)

// scrape reads gauges from the agent at scrape time, so nothing polls.
type scrape struct{ src Source }

func (s *scrape) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPool
	ch <- descAdvertised
	ch <- descSession
	ch <- descMismatch
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (s *scrape) Collect(ch chan<- prometheus.Metric) {
	if s.src.Pools != nil {
		for _, p := range s.src.Pools() {
			ch <- prometheus.MustNewConstMetric(descPool, prometheus.GaugeValue, p.Used, p.CIDR, "used")
			ch <- prometheus.MustNewConstMetric(descPool, prometheus.GaugeValue, p.Free, p.CIDR, "free")
		}
	}
	if s.src.Advertised != nil {
		for k, n := range s.src.Advertised() {
			ch <- prometheus.MustNewConstMetric(descAdvertised, prometheus.GaugeValue, float64(n), k)
		}
	}
	if s.src.Sessions != nil {
		for _, x := range s.src.Sessions() {
			ch <- prometheus.MustNewConstMetric(descSession, prometheus.GaugeValue, b2f(x.Established), x.Peer)
			ch <- prometheus.MustNewConstMetric(descMismatch, prometheus.GaugeValue, b2f(x.Mismatch), x.Peer)
		}
	}
}

// Serve runs /metrics, /healthz and /readyz on addr until ctx ends. ready
// reports whether the agent has recovered its state and serves CNI.
func Serve(ctx context.Context, addr string, m *Metrics, ready func() bool) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready: recovering allocations\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(c)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
