// Package daemon wires flock-agent together: node config, allocation store,
// pod handler, BGP speaker and its reconcile loop, admin API, metrics, and
// live reconfiguration — from a file (standalone) or from the API server
// (Kubernetes mode). cmd/flock-agent only parses flags.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/metrics"
	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/bgp"
	"code.fritzlab.net/fritzlab/flock/bgp/advert"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// Options are the agent's command-line settings.
type Options struct {
	NodeConfig     string // standalone: NodeConfig file
	CNISocket      string
	AdminSocket    string
	StateDir       string
	MetricsAddress string // "" disables the metrics listener
	Log            *slog.Logger

	// Kubernetes mode: NodeConfig, pods and BGP passwords come from the API.
	Kubernetes     bool
	Kubeconfig     string        // "" = in-cluster
	NodeName       string        // this node
	Namespace      string        // flock's namespace (the password Secret lives there)
	NodeConfigWait time.Duration // how long to wait for this node's NodeConfig
	LeakGCGrace    time.Duration // how long a deleted pod's allocation waits for kubelet's DEL

	// Hooks are for tests only.
	Hooks agent.Hooks
}

// Run serves until ctx ends. Kernel state and BGP sessions are not torn
// down on the way out: pods keep working and graceful restart keeps their
// routes at the ToR until the agent is back.
func Run(ctx context.Context, o Options) error {
	log := o.Log
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		spec      *v1alpha1.NodeConfigSpec
		source    podmeta.Source = podmeta.Standalone{}
		passwords bgp.PasswordReader
		kube      *kubeMode
		nodeName  string
	)
	if o.Kubernetes {
		k, err := newKube(ctx, o)
		if err != nil {
			return err
		}
		kube, spec, source, passwords, nodeName = k, k.spec, k.pods, k.secrets.Password, o.NodeName
	} else {
		nc, err := nodeconfig.Load(o.NodeConfig)
		if err != nil {
			return err
		}
		spec, passwords, nodeName = &nc.Spec, bgp.FilePasswords, nc.Metadata.Name
	}
	st, err := store.Open(o.StateDir)
	if err != nil {
		return err
	}
	adverts := advert.NewSet()
	a, err := agent.New(agent.Config{
		Spec: spec, Store: st, Dataplane: &dataplane.Netlink{Log: log},
		Source: source, Log: log, ReadyOnCommit: !o.Kubernetes, Adverts: adverts, Hooks: o.Hooks,
	})
	if err != nil {
		if kube != nil {
			kube.reportError(ctx, err)
		}
		return fmt.Errorf("node config: %w", err)
	}
	d := &daemon{log: log, agent: a, adverts: adverts, spec: *spec, kube: kube}
	m := metrics.New(d.metricsSource())
	d.metrics = m

	// Bind the sockets before recovery, so a plugin call during startup
	// gets "starting, try again" instead of "not running".
	cl, err := wire.Listen(o.CNISocket)
	if err != nil {
		return err
	}
	al, err := admin.Listen(o.AdminSocket)
	if err != nil {
		cl.Close()
		return err
	}
	errc := make(chan error, 4)
	servers := 2
	go func() {
		srv := &wire.Server{Handler: wire.HandlerFunc(d.handleCNI), Logger: log}
		errc <- srv.Serve(ctx, cl)
	}()
	go func() { errc <- admin.Serve(ctx, al, d) }()
	if o.MetricsAddress != "" {
		servers++
		go func() {
			if err := metrics.Serve(ctx, o.MetricsAddress, m, a.Ready); err != nil {
				errc <- fmt.Errorf("metrics on %s: %w", o.MetricsAddress, err)
				return
			}
			errc <- nil
		}()
	}
	fail := func(err error) error {
		cancel()
		for range servers {
			<-errc
		}
		if outer.Err() != nil && errors.Is(err, context.Canceled) {
			return nil // told to stop while starting: not a failure
		}
		return err
	}

	if kube != nil {
		// Readiness of every pod is known before allocations are restored,
		// so a restart neither withdraws nor re-announces anycast routes.
		if err := kube.startPods(ctx, a, m); err != nil {
			return fail(err)
		}
	}
	if err := a.Start(ctx); err != nil {
		return fail(err)
	}
	sp, err := bgp.New(ctx, bgp.Config{
		ASN: spec.ASN, RouterID: spec.RouterID, BGP: spec.BGP, Log: log, Passwords: passwords,
		StateFile: filepath.Join(o.StateDir, "bgp-state.json"),
		OnChange:  d.statusChanged,
	})
	if err != nil {
		return fail(err)
	}
	d.setSpeaker(sp)
	if err := m.Registry.Register(sp.Collector()); err != nil {
		log.Warn("metrics: GoBGP collector", "err", err)
	}
	// Originate everything before any session comes up, so each peer's
	// first UPDATEs (and End-of-RIB) carry the complete set.
	if err := sp.Resync(adverts.Desired()); err != nil {
		log.Error("bgp: initial sync", "err", err)
	}
	if err := sp.ApplyPeers(spec.BGP.Peers); err != nil {
		log.Error("bgp: peers", "err", err)
		d.setLastError(err)
	}
	go bgp.Reconcile(ctx, adverts, sp, bgp.MinResync, m.ObserveReconcile)
	if kube != nil {
		kube.afterStart(ctx, d)
	} else {
		go d.watchConfig(ctx, o.NodeConfig)
	}
	log.Info("serving", "cni-socket", o.CNISocket, "admin-socket", o.AdminSocket, "metrics", o.MetricsAddress,
		"state-dir", o.StateDir, "node", nodeName, "asn", spec.ASN, "peers", len(spec.BGP.Peers), "kubernetes", o.Kubernetes)

	var first error
	for range servers {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

type daemon struct {
	log     *slog.Logger
	agent   *agent.Agent
	adverts *advert.Set
	metrics *metrics.Metrics
	kube    *kubeMode
	speaker speakerRef

	mu      sync.Mutex
	spec    v1alpha1.NodeConfigSpec
	lastErr string
}

func (d *daemon) handleCNI(ctx context.Context, req wire.Request) wire.Response {
	start := time.Now()
	resp := d.agent.Handle(ctx, req)
	d.metrics.ObserveCNI(string(req.Op), resp.Error == nil, time.Since(start))
	return resp
}

func (d *daemon) setLastError(err error) {
	d.mu.Lock()
	if err == nil {
		d.lastErr = ""
	} else {
		d.lastErr = err.Error()
	}
	d.mu.Unlock()
	d.statusChanged()
}

func (d *daemon) statusChanged() {
	if d.kube != nil {
		d.kube.statusChanged()
	}
}

// applySpec applies a changed NodeConfig: peers are added, removed or
// updated live; other changes need a restart and are reported as such.
func (d *daemon) applySpec(spec *v1alpha1.NodeConfigSpec) error {
	if err := nodeconfig.Validate(spec); err != nil {
		d.metrics.ReloadsTotal.WithLabelValues("error").Inc()
		d.setLastError(err)
		return err
	}
	sp := d.speaker.get()
	if sp == nil {
		return errors.New("reload: speaker not started")
	}
	d.mu.Lock()
	oldRest, newRest := d.spec, *spec
	d.mu.Unlock()
	oldRest.BGP.Peers, newRest.BGP.Peers = nil, nil
	if !reflect.DeepEqual(oldRest, newRest) {
		d.log.Warn("reload: changes outside spec.bgp.peers (pools, defaults, asn, routerID, listen port, import policy) take effect at the next agent restart")
	}
	if err := sp.ApplyPeers(spec.BGP.Peers); err != nil {
		d.metrics.ReloadsTotal.WithLabelValues("error").Inc()
		d.setLastError(err)
		return err
	}
	d.mu.Lock()
	d.spec.BGP.Peers = spec.BGP.Peers
	d.mu.Unlock()
	d.metrics.ReloadsTotal.WithLabelValues("success").Inc()
	d.setLastError(nil)
	d.log.Info("reload: node config applied", "peers", len(spec.BGP.Peers))
	return nil
}

// reapplyPeers re-reads passwords (a rotated Secret): only sessions whose
// password changed are re-created.
func (d *daemon) reapplyPeers() {
	d.mu.Lock()
	spec := d.spec
	d.mu.Unlock()
	if sp := d.speaker.get(); sp != nil {
		if err := sp.ApplyPeers(spec.BGP.Peers); err != nil {
			d.log.Error("bgp: peers", "err", err)
			d.setLastError(err)
			return
		}
		d.setLastError(nil)
	}
}

// reload re-reads the standalone file.
func (d *daemon) reload(path string) error {
	nc, err := nodeconfig.Load(path)
	if err != nil {
		d.metrics.ReloadsTotal.WithLabelValues("error").Inc()
		return err
	}
	return d.applySpec(&nc.Spec)
}
