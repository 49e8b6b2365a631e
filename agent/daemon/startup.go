package daemon

import (
	"context"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"
)

// recovery is what start-up does, step by step; startup puts the steps in
// the order the design depends on.
type recovery interface {
	// start starts the components of a phase.
	start(ctx context.Context, p phase)
	// sync waits for the first lists of the informers restore, ADD and
	// the first origination read (Kubernetes mode); not for the Services'
	// and EndpointSlices', nor for every node's NodeConfig.
	sync(ctx context.Context) error
	// authorize makes the AddressPools the authority and hands their pod
	// CIDRs to IPAM.
	authorize()
	// restore recovers the allocations (agent.Restore).
	restore(ctx context.Context) error
	// hold keeps an uninstall's leave out from originating routes to
	// serving (it would find routes out and no loop to withdraw them);
	// release lets it in.
	hold() (release func())
	// originate hands the speaker the full set of the node's own routes.
	originate(ctx context.Context)
	// serve marks the agent ready (readyz).
	serve()
	// nodes waits until every node's NodeConfig is listed and the
	// summaries that overlap one of theirs are withheld from the speaker
	// (Kubernetes mode).
	nodes(ctx context.Context)
	// services waits, bounded, until the Service routes are decided and
	// in the speaker (Kubernetes mode).
	services(ctx context.Context)
	// peer adds the BGP peers.
	peer()
}

// startup runs the start-up in its order:
//
//  1. the components recovery needs (the speaker, the informers — the
//     Services' too, listing from now on —, metrics saying "not ready");
//  2. the first sync of the informers ADD and restore read: pod
//     readiness is known before anything is restored (a restart neither
//     withdraws nor re-announces anycast), the BGP passwords before a
//     peer is added, the AddressPools and the cluster's claims before an
//     address is authorized or a claim checked. Not the Services and
//     EndpointSlices, nor every node's NodeConfig: nothing of ADD reads
//     them, and at scale they are the largest lists;
//  3. the AddressPools become the authority — only after the sync;
//  4. the allocations are restored;
//  5. the speaker gets the node's own routes;
//  6. ready, and then everything that serves requests or changes state:
//     the CNI socket (bound before start-up, so a plugin call waits in
//     its backlog and is answered from the restored state), the admin
//     API, the reconcilers, the followers of config and pools, the
//     Services controller;
//  7. the peers, once every node's NodeConfig is listed and our summaries
//     that overlap one of theirs are withheld (no peer is sent a summary
//     another node owns), and once the Service routes are in the speaker too (or
//     after serviceRoutesWait), so each peer's first UPDATEs (and
//     End-of-RIB) carry all of it: a graceful-restart peer keeps the
//     routes of the agent before until that End-of-RIB, and one without
//     the Service routes would flush them until the Services are listed.
//
// An error stops start-up where it happened: nothing after it runs.
func startup(ctx context.Context, r recovery) error {
	r.start(ctx, duringRecovery)
	if err := r.sync(ctx); err != nil {
		return err
	}
	r.authorize()
	if err := r.restore(ctx); err != nil {
		return err
	}
	release := r.hold()
	r.originate(ctx)
	r.serve()
	release()
	r.start(ctx, whenServing)
	r.nodes(ctx)
	r.services(ctx)
	if ctx.Err() == nil { // stopping: no session to open
		r.peer()
	}
	return nil
}

// daemonStartup is the daemon's recovery.
type daemonStartup struct {
	d *daemon
	g *errgroup.Group
	// took is how long the steps before serving took, for the "serving"
	// line: what a slow start waited for.
	took []any
}

// timed notes the time since t0 as step's.
func (s *daemonStartup) timed(step string, t0 time.Time) {
	s.took = append(s.took, step, time.Since(t0).Round(time.Millisecond).String())
}

func (s *daemonStartup) start(ctx context.Context, p phase) { s.d.components.start(ctx, s.g, p) }

func (s *daemonStartup) sync(ctx context.Context) error {
	if s.d.kube == nil {
		return nil
	}
	defer s.timed("listed", time.Now())
	return s.d.kube.factory.WaitForSync(ctx)
}

func (s *daemonStartup) authorize() { s.d.applyPools() }

func (s *daemonStartup) restore(ctx context.Context) error {
	defer s.timed("restored", time.Now())
	return s.d.agent.Restore(ctx)
}

func (s *daemonStartup) hold() func() {
	s.d.startMu.Lock()
	return s.d.startMu.Unlock
}

func (s *daemonStartup) originate(ctx context.Context) {
	defer s.timed("originated", time.Now())
	if err := s.d.bgpLoop.Pass(ctx, true); err != nil {
		s.d.log.Error("bgp: initial sync; the reconciler retries", "err", err)
	}
}

func (s *daemonStartup) nodes(ctx context.Context) { s.d.waitNodeConfigs(ctx) }

func (s *daemonStartup) services(ctx context.Context) { s.d.waitServiceRoutes(ctx) }

func (s *daemonStartup) peer() { s.d.openPeers() }

func (s *daemonStartup) serve() {
	d := s.d
	d.publishConflist() // before Ready: a failure keeps it not Ready
	d.ready.Store(true)
	d.clearRestart() // this agent answers STATUS now
	d.statusChanged()
	d.mu.Lock()
	asn, peers := d.spec.ASN, len(d.spec.BGP.Peers)
	d.mu.Unlock()
	d.log.Info("serving", "cni-socket", d.o.CNISocket, "admin-socket", d.o.AdminSocket, "metrics", d.o.MetricsAddress,
		"state-dir", d.o.StateDir, "node", d.nodeName, "asn", asn, "peers", peers, "kubernetes", d.o.Kubernetes,
		slog.Group("took", s.took...))
}
