// Package daemon wires flock-agent together: node config, allocation store,
// pod handler, BGP speaker and its reconcile loop, admin API, metrics, and
// live reconfiguration. cmd/flock-agent only parses flags.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"time"

	"code.fritzlab.net/fritzlab/flock/admin"
	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/bgp"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/metrics"
	"code.fritzlab.net/fritzlab/flock/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/podmeta"
	"code.fritzlab.net/fritzlab/flock/store"
)

// Options are the agent's command-line settings.
type Options struct {
	NodeConfig     string // standalone NodeConfig file
	CNISocket      string
	AdminSocket    string
	StateDir       string
	MetricsAddress string // "" disables the metrics listener
	Log            *slog.Logger
	// Hooks are for tests only.
	Hooks agent.Hooks
}

// Run serves until ctx ends. Kernel state and BGP sessions are not torn
// down on the way out: pods keep working and graceful restart keeps their
// routes at the ToR until the agent is back.
func Run(ctx context.Context, o Options) error {
	log := o.Log
	nc, err := nodeconfig.Load(o.NodeConfig)
	if err != nil {
		return err
	}
	st, err := store.Open(o.StateDir)
	if err != nil {
		return err
	}
	adverts := advert.NewSet()
	a, err := agent.New(agent.Config{
		Spec: &nc.Spec, Store: st, Dataplane: &dataplane.Netlink{Log: log},
		Source: podmeta.Standalone{}, Log: log, ReadyOnCommit: true, Adverts: adverts, Hooks: o.Hooks,
	})
	if err != nil {
		return fmt.Errorf("node config %s: %w", o.NodeConfig, err)
	}
	d := &daemon{log: log, agent: a, adverts: adverts, spec: nc.Spec}
	m := metrics.New(d.metricsSource())
	d.metrics = m

	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
	parent := outer
	fail := func(err error) error {
		cancel()
		for range servers {
			<-errc
		}
		if parent.Err() != nil && errors.Is(err, context.Canceled) {
			return nil // told to stop while starting: not a failure
		}
		return err
	}

	if err := a.Start(ctx); err != nil {
		return fail(err)
	}
	sp, err := bgp.New(ctx, bgp.Config{
		ASN: nc.Spec.ASN, RouterID: nc.Spec.RouterID, BGP: nc.Spec.BGP, Log: log,
		StateFile: filepath.Join(o.StateDir, "bgp-state.json"),
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
	if err := sp.ApplyPeers(nc.Spec.BGP.Peers); err != nil {
		log.Error("bgp: peers", "err", err)
	}
	go bgp.Reconcile(ctx, adverts, sp, bgp.MinResync, m.ObserveReconcile)
	go d.watchConfig(ctx, o.NodeConfig)
	log.Info("serving", "cni-socket", o.CNISocket, "admin-socket", o.AdminSocket, "metrics", o.MetricsAddress,
		"state-dir", o.StateDir, "node", nc.Metadata.Name, "asn", nc.Spec.ASN, "peers", len(nc.Spec.BGP.Peers))

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
	spec    nodeconfigSpec
	speaker speakerRef
}

func (d *daemon) handleCNI(ctx context.Context, req wire.Request) wire.Response {
	start := time.Now()
	resp := d.agent.Handle(ctx, req)
	d.metrics.ObserveCNI(string(req.Op), resp.Error == nil, time.Since(start))
	return resp
}

// reload applies a changed NodeConfig: peers are added, removed or updated
// live; other changes need a restart and are reported as such.
func (d *daemon) reload(path string) error {
	nc, err := nodeconfig.Load(path)
	if err != nil {
		d.metrics.ReloadsTotal.WithLabelValues("error").Inc()
		return err
	}
	sp := d.speaker.get()
	if sp == nil {
		return errors.New("reload: speaker not started")
	}
	old := d.spec
	oldRest, newRest := old, nc.Spec
	oldRest.BGP.Peers, newRest.BGP.Peers = nil, nil
	if !reflect.DeepEqual(oldRest, newRest) {
		d.log.Warn("reload: changes outside spec.bgp.peers (pools, defaults, asn, routerID, listen port, import policy) take effect at the next agent restart")
	}
	if err := sp.ApplyPeers(nc.Spec.BGP.Peers); err != nil {
		d.metrics.ReloadsTotal.WithLabelValues("error").Inc()
		return err
	}
	d.spec.BGP.Peers = nc.Spec.BGP.Peers
	d.metrics.ReloadsTotal.WithLabelValues("success").Inc()
	d.log.Info("reload: node config applied", "peers", len(nc.Spec.BGP.Peers))
	return nil
}
