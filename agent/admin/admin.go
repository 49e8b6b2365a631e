// Package admin is the agent's operator API: HTTP+JSON on a unix socket
// (mode 0600, no TCP), read by flockctl. The types here, with the BGP
// sessions' (bgp/session) and the reconcilers' (agent/reconcile) status
// types as they are, are the wire format both sides share.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"syscall"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/bgp/session"
	"code.fritzlab.net/fritzlab/flock/cni/wire/unixsock"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// DefaultSocket is the admin socket path.
const DefaultSocket = "/run/flock/admin.sock"

// Pod is one attachment.
type Pod struct {
	ContainerID string    `json:"containerID"`
	podmeta.ID            // namespace, name, uid, staticUID
	IfName      string    `json:"ifName"`
	HostVeth    string    `json:"hostVeth"`
	IPs         []string  `json:"ips"`
	Addresses   []string  `json:"addresses,omitempty"`
	Anycast     []string  `json:"anycast,omitempty"`
	Phase       string    `json:"phase"` // committed, pending (ADD in progress), deleting, stuck
	Ready       bool      `json:"ready"`
	Created     time.Time `json:"created"`
}

// Pool is one IPAM pool's usage.
type Pool struct {
	// Name of the AddressPool; "" for the node's own summaries.
	Name string `json:"name,omitempty"`
	CIDR string `json:"cidr"`
	// Kind: summary (the node's own), addresspool, or nodeconfig (a
	// deprecated shared pool of the NodeConfig, read as an AddressPool).
	Kind       string   `json:"kind"`
	Use        []string `json:"use,omitempty"`
	Namespaces []string `json:"namespaces,omitempty"`
	Selector   string   `json:"selector,omitempty"`
	// Claims: addresses claimed from the pool — cluster-wide in
	// Kubernetes mode, on this node in standalone mode.
	Claims int `json:"claims"`
	// Used and Free count what this node's IPAM hands out of the CIDR
	// (summaries and pod pools); Held its addresses in use here as
	// anycast or `addresses` IPs, which IPAM never hands out.
	Used uint64 `json:"used"`
	Held uint64 `json:"held,omitempty"`
	Free string `json:"free,omitempty"` // decimal; may exceed 64 bits
	// Note: why a summary is not advertised, why a pool is ignored, and
	// which addresses of it are in use here as anycast or `addresses`.
	Note string `json:"note,omitempty"`
}

// Route is one anycast/addresses host route: what the kernel holds and
// what the node state wants.
type Route struct {
	Prefix   string   `json:"prefix"`
	Kind     string   `json:"kind,omitempty"`
	Nexthops []string `json:"nexthops"` // in the kernel
	Desired  []string `json:"desired"`  // wanted by the node state
	Owners   []string `json:"owners"`
	Synced   bool     `json:"synced"`
}

// BGPRoute is one path the node originates (or wants to).
type BGPRoute struct {
	Prefix string `json:"prefix"`
	Kind   string `json:"kind"`
	// Drain: sent with GRACEFUL_SHUTDOWN (a Service whose endpoints here
	// are all terminating); Weight: the link-bandwidth weight sent.
	Drain      bool     `json:"drain,omitempty"`
	Weight     uint32   `json:"weight,omitempty"`
	Owners     []string `json:"owners"` // "node", namespace/name of the pods or Services
	Advertised bool     `json:"advertised"`
}

// Status is the agent's health at a glance.
type Status struct {
	Ready        bool               `json:"ready"`
	Allocations  int                `json:"allocations"`
	PeersUp      int                `json:"peersEstablished"`
	Peers        int                `json:"peersConfigured"`
	Reconcilers  []reconcile.Status `json:"reconcilers"`
	Reaped       map[string]uint64  `json:"reaped,omitempty"`
	ReapFailures uint64             `json:"reapFailures,omitempty"`
	Stuck        []string           `json:"stuck,omitempty"`
	ConfigError  string             `json:"configError,omitempty"`
	Installer    string             `json:"installer,omitempty"` // the CNI installer's refusal
	Problems     []string           `json:"problems,omitempty"`
}

// Readiness is an operator's readiness report for a pod (standalone mode).
type Readiness struct {
	podmeta.ID      // namespace and name: every incarnation on the node
	Ready      bool `json:"ready"`
}

// Source is what the agent exposes.
type Source interface {
	Status() Status
	Pods() []Pod
	Pools() []Pool
	Routes() []Route
	Neighbors() []session.Neighbor
	BGPRoutes() []BGPRoute
	// Services: every Service address and what this node does with it.
	Services() []services.Address
	// SetReadiness records a pod's readiness and returns how many pod
	// incarnations it applied to.
	SetReadiness(r Readiness) (int, error)
}

// NotServing is implemented by a Source that does not know the node's
// state yet (an agent waiting for its NodeConfig, before it has read its
// store): while NotServing returns an error, every view but the status
// answers 503 with it. An empty list would be an answer, and a reader
// (flock-policy's tracker of extra pod IPs) would take it for "no pods".
type NotServing interface {
	NotServing() error
}

// Handler serves the API.
func Handler(src Source) http.Handler {
	mux := http.NewServeMux()
	notServing := func() error {
		if ns, ok := src.(NotServing); ok {
			return ns.NotServing()
		}
		return nil
	}
	get := func(path string, f func() any) {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, _ *http.Request) {
			if path != "/v1/status" {
				if err := notServing(); err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
			}
			w.Header().Set("Content-Type", "application/json")
			if err := json.NewEncoder(w).Encode(f()); err != nil {
				slog.Warn("admin: write response", "path", path, "err", err)
			}
		})
	}
	get("/v1/status", func() any { return src.Status() })
	get("/v1/pods", func() any { return src.Pods() })
	get("/v1/ipam", func() any { return src.Pools() })
	get("/v1/routes", func() any { return src.Routes() })
	get("/v1/bgp/neighbors", func() any { return src.Neighbors() })
	get("/v1/bgp/routes", func() any { return src.BGPRoutes() })
	get("/v1/services", func() any { return src.Services() })
	mux.HandleFunc("POST /v1/pods/readiness", func(w http.ResponseWriter, r *http.Request) {
		var req Readiness
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		n, err := src.SetReadiness(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int{"pods": n})
	})
	HandleProfiles(mux)
	return mux
}

// HandleProfiles serves Go's profiles (heap, goroutine, CPU, …) on mux,
// for `make bench`'s and `make scale`'s work and for an operator chasing
// a leak: on an admin socket only, root-only like the rest of it.
func HandleProfiles(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
}

// Listen binds the admin socket, mode 0600.
func Listen(path string) (net.Listener, error) {
	l, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	return l, nil
}

// Server is the admin API on its socket.
type Server struct {
	Listener net.Listener // bound by Listen; Run closes it
	Source   Source
}

// Run serves the API until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	return ServeHTTP(ctx, s.Listener, Handler(s.Source))
}

// ServeHTTP serves h on l until ctx ends, then shuts down gracefully
// (bounded): the one way the agent's HTTP endpoints run.
func ServeHTTP(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	stop := context.AfterFunc(ctx, func() {
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	})
	defer stop()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ErrNotRunning means nothing answers on the admin socket.
var ErrNotRunning = errors.New("flock agent is not running")

// Client reads the admin API.
type Client struct {
	Socket string
	http   *http.Client
}

// NewClient returns a client for the socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &Client{Socket: socket, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// Get decodes GET path into v.
func (c *Client) Get(ctx context.Context, path string, v any) error {
	return c.do(ctx, http.MethodGet, path, nil, v)
}

// Post sends body as JSON to path and decodes the answer into v.
func (c *Client) Post(ctx context.Context, path string, body, v any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, path, bytes.NewReader(b), v)
}

func (c *Client) do(ctx context.Context, method, path string, body io.Reader, v any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://flock"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("%w (no agent answers on %s; is flock-agent running, and is this the right --socket?)", ErrNotRunning, c.Socket)
		}
		return fmt.Errorf("admin %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("admin %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
