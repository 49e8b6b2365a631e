// Package daemon wires flock-agent together: node config, node state,
// allocation store, pod handler, BGP speaker, the two route reconcilers,
// admin API, metrics, and live reconfiguration — from a file (standalone)
// or from the API server (Kubernetes mode). cmd/flock-agent only parses
// flags.
//
// Every long-running part is a component with Run(ctx) error, started in
// one errgroup. The order is the design: the facts restore needs (pod
// readiness from the API) are synced first, then allocations are restored,
// then the speaker originates the node's routes, and only then are the
// CNI and admin sockets served — so nothing is ever served from a
// half-restored state — and last, once the Service routes are in the
// speaker too, the peers added (see startup).
package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/memtrim"
	"code.fritzlab.net/fritzlab/flock/agent/metrics"
	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/agent/status"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/bgp"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/dataplane/anycast"
	"code.fritzlab.net/fritzlab/flock/dataplane/kubeproxy"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Options are the agent's command-line settings.
type Options struct {
	NodeConfig     string // standalone: NodeConfig file
	CNISocket      string
	AdminSocket    string
	StateDir       string
	MetricsAddress string // "" disables the metrics listener
	Log            *slog.Logger
	// InstallerStatus is the CNI installer's report ("" reads none): a
	// refusal there keeps the agent from being Ready.
	InstallerStatus string
	// Release is this flock's version (VERSION), stamped on the state
	// directory it adopts and named when it refuses a newer one's.
	Release string
	// CNIConfDir is where the runtime reads network configs: a conflist
	// the installer staged (its report's Staged) is published there once
	// the agent serves. "": never.
	CNIConfDir string
	// RestartGrace is how long the restart marker a planned stop leaves
	// keeps the node Ready without an agent (0: none; at most
	// wire.MaxRestartGrace).
	RestartGrace time.Duration

	// Kubernetes mode: NodeConfig, pods and BGP passwords come from the API.
	Kubernetes     bool
	Kubeconfig     string        // "" = in-cluster
	NodeName       string        // this node
	Namespace      string        // flock's namespace (the password Secret lives there)
	NodeConfigWait time.Duration // how long to wait for this node's NodeConfig
	LeakGCGrace    time.Duration // how long a deleted pod's allocation waits for kubelet's DEL
	// PodName is the agent's own pod (in Namespace): at a planned stop the
	// API tells whether it goes for good (an uninstall: uninstall.go).
	// "": every stop is a restart.
	PodName string
	// UninstallRemove are the paths an uninstall removes last (the plugin
	// binary, the state and run directories, as mounted).
	UninstallRemove []string

	// Repair is the period of the reconcilers' full repair and of the
	// netns check (default 30 s).
	Repair time.Duration

	// Hooks are for tests only.
	Hooks agent.Hooks
}

// spareRecords is how many empty record files the store keeps ready for
// pending records: about the pods a node starts at once.
const spareRecords = 16

// bfdShutdown is how long a planned stop spends repeating BFD AdminDown.
const bfdShutdown = 150 * time.Millisecond

// Run serves until outer ends (a planned stop). Kernel state and BGP
// sessions are not torn down on the way out: pods keep working, graceful
// restart keeps their routes at the ToR and the restart marker the node
// Ready until the agent is back.
func Run(outer context.Context, o Options) error {
	gc := tuneGC()
	// A planned stop leaves the restart marker before anything stops; an
	// uninstall (uninstall.go) withdraws every route instead, and BFD's
	// AdminDown waits for that (decided): the ToR must hear the
	// withdrawals while the session is up.
	var (
		running  atomic.Pointer[daemon]
		leaving  atomic.Bool
		decided  = make(chan struct{})
		decideMu sync.Once
	)
	decide := func() { decideMu.Do(func() { close(decided) }) }
	ctx, cancel := plannedStop(outer, func() {
		defer decide()
		d := running.Load()
		if d == nil {
			return
		}
		if d.uninstalling() {
			leaving.Store(true)
			d.leave()
			return
		}
		decide()
		d.markRestart()
		if d.ready.Load() {
			d.drainServices(time.Sleep)
		}
	})
	defer cancel()
	stopping := ctx // ends once the planned stop's preparations are done
	g, ctx := errgroup.WithContext(ctx)
	// stop ends every component and returns the error that mattered: a
	// component's own failure cancels ctx, so the start-up step that then
	// sees "context canceled" is not the cause.
	stop := func(err error) error {
		cancel()
		werr := g.Wait()
		if err == nil || errors.Is(err, context.Canceled) {
			if outer.Err() != nil {
				return nil // told to stop: not a failure
			}
			return cmp.Or(werr, err)
		}
		return err
	}

	// SIGHUP reloads the standalone config; caught from the start, so one
	// sent while the agent recovers does not kill it.
	hup := hangups(ctx)
	d, err := newDaemon(ctx, o)
	if err != nil {
		return stop(err)
	}
	d.gc = gc
	running.Store(d)
	// Last of all (after the store is closed): an uninstall takes the
	// dataplane and the files away.
	defer func() {
		if leaving.Load() {
			d.removeNode()
		}
	}()
	defer d.store.Close() // after stop: every component is done with it
	// A planned stop (SIGTERM, a rollout): BFD peers hear AdminDown first,
	// which RFC 5882 §3.2 says is no failure, so a ToR keeps the routes
	// graceful restart is about to protect. A crash sends nothing.
	bfdDone := make(chan struct{})
	cancelBFD := context.AfterFunc(outer, func() {
		defer close(bfdDone)
		select {
		case <-decided:
		case <-stopping.Done(): // the preparations never ran (a failure)
		}
		d.speaker.ShutdownBFD(bfdShutdown)
	})
	defer func() {
		if !cancelBFD() { // already running: let the AdminDowns go out
			<-bfdDone
		}
	}()
	// Bind the sockets before recovery: a plugin call during start-up waits
	// in the backlog and is answered once the state is restored.
	cl, err := wire.Listen(o.CNISocket)
	if err != nil {
		return stop(err)
	}
	defer cl.Close()
	al, err := admin.Listen(o.AdminSocket)
	if err != nil {
		return stop(err)
	}
	defer al.Close()
	d.register(cl, al, hup)

	if err := startup(ctx, &daemonStartup{d: d, g: g}); err != nil {
		d.reportStartError(ctx, err)
		return stop(err)
	}
	err = g.Wait()
	d.agent.Wait() // veths DELs left to unregister (a crash leaves them to the next start)
	return stop(err)
}

// register lists every component of the agent, with the phase it starts
// in (see startup). One place, so adding one is one line.
func (d *daemon) register(cni, adminSocket net.Listener, hup <-chan os.Signal) {
	c := &d.components
	if d.o.MetricsAddress != "" {
		c.register("metrics", duringRecovery, &metrics.Server{Addr: d.o.MetricsAddress, Metrics: d.metrics, Ready: d.readiness})
	}
	c.register("bgp speaker", duringRecovery, d.speaker)
	c.register("bgp reconciler", whenServing, d.bgpLoop)
	c.register("kernel reconciler", whenServing, d.kernelLoop)
	c.register("pod repair", whenServing, d.agent)
	c.register("link watch", whenServing, RunFunc(d.watchLinks))
	c.register("cni server", whenServing, &wire.Server{Listener: cni, Handler: wire.HandlerFunc(d.handleCNI), Logger: d.log})
	c.register("admin api", whenServing, &admin.Server{Listener: adminSocket, Source: d})
	c.register("memory trimmer", whenServing, RunFunc(func(ctx context.Context) error { return memtrim.Run(ctx, memtrim.Every, d.log) }))
	if d.kube != nil {
		d.kube.register(d, c)
		return
	}
	w := &nodeconfig.FileWatcher{Path: d.o.NodeConfig, Log: d.log, Hup: hup, Baseline: d.loaded}
	c.register("node-config file watch", whenServing, w)
	c.register("node-config file", whenServing, follow(d.reloadFile, w.Changed()))
}

// watchLinks follows flock veths that vanish without a DEL (a pod's netns
// destroyed): their routes are re-programmed and the pod reaped at once.
func (d *daemon) watchLinks(ctx context.Context) error {
	return d.dp.WatchLinks(ctx, func(veth string) {
		switch {
		case veth == "":
			d.kernel.MarkStale()
			d.kernelLoop.Kick()
		case d.kernel.LinkGone(veth):
			d.kernelLoop.Kick()
		}
		if veth != "" {
			d.agent.VethGone(veth)
		}
	})
}

type daemon struct {
	o          Options
	gc         *burstGC
	log        *slog.Logger
	nodeName   string
	state      *nodestate.State
	store      *store.Store
	agent      *agent.Agent
	speaker    *bgp.Speaker
	kernel     *anycast.Routes
	dp         *dataplane.Netlink
	bgpLoop    *reconcile.Loop[map[netip.Prefix]advert.Path]
	kernelLoop *reconcile.Loop[map[netip.Prefix][]dataplane.Nexthop]
	metrics    *metrics.Metrics
	kube       *kubeMode // nil in standalone mode
	components components
	ready      atomic.Bool
	draining   atomic.Bool // a planned stop drains the Service routes
	// confMu orders publishing the conflist and an uninstall's removing
	// it; confGone: removed, never to be published again by this agent.
	confMu   sync.Mutex
	confGone bool
	// startMu is held from originating routes to serving (startup.go).
	startMu    sync.Mutex
	installer  string                 // the CNI installer's refusal (set before anything runs)
	staged     string                 // the conflist the installer staged for publishConflist
	publishErr atomic.Pointer[string] // why publishConflist failed (read by readiness and status)
	loaded     []byte                 // standalone: the node-config file as loaded
	filePools  []v1alpha1.AddressPool // standalone: the file's AddressPools as last loaded (under mu once serving)

	// authority is the current AddressPool decision (swapped whole when
	// the pools change).
	authority atomic.Pointer[authorityView]
	// poolsMu serializes applyPools and checkOverlaps (lockPools); it
	// guards inUseLogged.
	poolsMu     sync.Mutex
	inUseLogged map[string]string  // pod pool → its addresses in use, as last logged
	poolHook    func(point string) // tests only: see hook

	// peersMu orders every apply of the peers (NodeConfig change, Secret
	// rotation, file reload): a slower one must not undo a newer one.
	peersMu sync.Mutex
	// peersOpen: start-up has added the peers (openPeers); before, a
	// change only updates the spec, which openPeers applies. Under peersMu.
	peersOpen bool
	// svcMu orders the writes of the Service routes (applyServiceRoutes,
	// drainServices): each reads what it writes under it, so an older
	// answer never lands after a newer one.
	svcMu sync.Mutex
	// kubeProxy asks the kernel whether kube-proxy's rules deliver a
	// waiting Service address, for the Services controller.
	kubeProxy kubeproxy.Reader

	mu           sync.Mutex
	spec         v1alpha1.NodeConfigSpec // the running config
	cfgErr       string
	reaped       map[string]uint64
	reapFailures uint64
	warned       map[string]bool // deprecation warnings already logged
}

// newDaemon reads the node config (in Kubernetes mode waiting for it) and
// builds every part; nothing runs yet.
func newDaemon(ctx context.Context, o Options) (*daemon, error) {
	d := &daemon{o: o, log: o.Log, reaped: map[string]uint64{agent.ReapNetnsGone: 0, agent.ReapInterrupted: 0}, warned: map[string]bool{}}
	d.installer = d.readInstaller(o.InstallerStatus)
	var (
		spec      *v1alpha1.NodeConfigSpec
		source    podmeta.Source = podmeta.Standalone{}
		passwords bgp.PasswordSource
	)
	if o.Kubernetes {
		k, err := newKube(ctx, o)
		if err != nil {
			return nil, err
		}
		d.kube, spec, source, passwords, d.nodeName = k, k.spec, k.pods, k.secrets.Password, o.NodeName
	} else {
		nc, err := nodeconfig.Load(o.NodeConfig)
		if err != nil {
			return nil, err
		}
		spec, passwords, d.nodeName, d.loaded, d.filePools = &nc.Spec, bgp.FilePasswords, nc.Metadata.Name, nc.Raw, nc.AddressPools
	}
	d.spec = *spec
	fail := func(err error) (*daemon, error) {
		err = fmt.Errorf("node config: %w", err)
		d.reportStartError(ctx, err)
		return nil, err
	}
	if err := nodeconfig.Validate(spec); err != nil {
		return fail(err)
	}
	st, err := store.Open(o.StateDir)
	if err != nil {
		return nil, err
	}
	// Before anything reads the state: a directory a newer release wrote
	// is refused, naming both, and left as it is.
	release := o.Release
	if release == "" {
		release = "dev"
	}
	if was, err := st.Adopt(release); err != nil {
		d.reportStartError(ctx, err)
		return nil, err
	} else if was.Release != "" && was.Release != release {
		d.log.Info("state directory adopted", "dir", o.StateDir, "from", was.Release, "release", release, "format", store.StateFormat)
	}
	st.KeepSpares(spareRecords)
	d.store = st
	// Standalone: nothing reports readiness but the operator (flockctl
	// ready), so a committed pod counts as Ready.
	if d.state, err = nodestate.New(spec, !o.Kubernetes); err != nil {
		return fail(err)
	}
	dp := &dataplane.Netlink{Log: d.log}
	d.dp, d.kernel = dp, anycast.New(dp)
	d.speaker, err = bgp.New(bgp.Config{
		ASN: spec.ASN, RouterID: spec.RouterID, BGP: spec.BGP, Log: d.log, Passwords: passwords,
		StateFile: filepath.Join(o.StateDir, "bgp-state.json"),
	})
	if err != nil {
		return nil, err
	}
	d.metrics = metrics.New(d.snapshot, d.speaker.Collector())
	d.bgpLoop = &reconcile.Loop[map[netip.Prefix]advert.Path]{
		Name: "bgp", Target: d.speaker, Desired: d.state.Adverts, Wake: d.state.Changed(),
		Repair: o.Repair, Log: d.log, Observe: d.observeReconcile,
	}
	d.kernelLoop = &reconcile.Loop[map[netip.Prefix][]dataplane.Nexthop]{
		Name: "kernel", Target: d.kernel, Desired: d.state.KernelRoutes, Wake: d.state.Changed(),
		Repair: o.Repair, Log: d.log, Observe: d.observeReconcile,
	}
	var cl agent.Claims
	if d.kube != nil {
		cl = kubeClaims{k: d.kube, d: d}
	}
	d.agent, err = agent.New(agent.Config{
		Spec: spec, State: d.state, Store: st, Dataplane: dp, Source: source, Log: d.log, Hooks: o.Hooks,
		Authority: d, Claims: cl,
		Settle: func(ctx context.Context, gen uint64) error {
			return errors.Join(d.bgpLoop.Wait(ctx, gen), d.kernelLoop.Wait(ctx, gen))
		},
		Reaped: d.countReaped,
		ReapFailed: func() {
			d.mu.Lock()
			d.reapFailures++
			d.mu.Unlock()
		},
		ReapInterval: o.Repair,
	})
	if err != nil {
		return fail(err)
	}
	if d.kube != nil {
		d.kube.wire(d)
	}
	return d, nil
}

func (d *daemon) handleCNI(ctx context.Context, req wire.Request) wire.Response {
	start := time.Now()
	if req.Op == wire.OpAdd || req.Op == wire.OpDel {
		d.gc.request() // not STATUS: runtimes poll it every few seconds
	}
	resp := d.agent.Handle(ctx, req)
	d.metrics.ObserveCNI(string(req.Op), resp.Error == nil, time.Since(start))
	return resp
}

func (d *daemon) observeReconcile(target string, full bool, dur time.Duration, err error) {
	d.metrics.ObserveReconcile(target, full, dur, err)
	d.statusChanged()
}

func (d *daemon) countReaped(reason string) {
	d.mu.Lock()
	d.reaped[reason]++
	d.mu.Unlock()
}

func (d *daemon) setConfigError(err error) {
	d.mu.Lock()
	d.cfgErr = ""
	if err != nil {
		d.cfgErr = err.Error()
	}
	d.mu.Unlock()
	d.statusChanged()
}

func (d *daemon) statusChanged() {
	if d.kube != nil {
		d.kube.statusChanged()
	}
}

func (d *daemon) reportStartError(ctx context.Context, err error) {
	if d.kube != nil {
		d.kube.reportError(ctx, err)
	}
}

// peersWait is what the BGP peers wait for (waitNodeConfigs), "" if
// nothing.
func (d *daemon) peersWait() string {
	if k := d.kube; k != nil && k.allNC != nil && !k.allNC.HasSynced() {
		return "every node's NodeConfig is not listed yet (a summary that overlaps another node's is not to be advertised)"
	}
	return ""
}

// snapshot is the one status snapshot (see package status).
func (d *daemon) snapshot() status.Node {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := status.Node{
		Time: time.Now(), Ready: d.ready.Load(), Allocations: d.state.Count(), Pools: d.state.IPAM(),
		Neighbors:   d.speaker.Neighbors(ctx),
		Advertised:  map[advert.Kind]int{},
		Reconcilers: []reconcile.Status{d.bgpLoop.Status(), d.kernelLoop.Status()},
		Reaped:      map[string]uint64{},
	}
	for _, p := range d.speaker.Held() {
		n.Advertised[p.Kind]++
	}
	if k := d.kube; k != nil && k.services != nil {
		n.Services = map[string]int{}
		for _, a := range k.services.Addresses() {
			n.Services[a.State]++
		}
		n.ServiceRouteChanges = k.services.Changes()
	}
	for _, a := range d.state.Attachments(nodestate.Stuck) {
		n.Stuck = append(n.Stuck, a.ContainerID+": "+a.Reason)
	}
	for _, why := range d.state.Suppressed() {
		n.Suppressed = append(n.Suppressed, why)
	}
	slices.Sort(n.Suppressed)
	n.PeersWait = d.peersWait()
	d.mu.Lock()
	n.ConfigError = joinProblems(d.cfgErr, d.kube.templateError())
	n.Installer = d.installer
	if e := d.publishErr.Load(); e != nil && n.Installer == "" {
		n.Installer = *e
	}
	for r, c := range d.reaped {
		n.Reaped[r] = c
	}
	n.ReapFailures = d.reapFailures
	d.mu.Unlock()
	return n
}

// applySpec applies a changed NodeConfig: peers are added, removed or
// updated live; other changes need a restart and are reported as such.
func (d *daemon) applySpec(spec *v1alpha1.NodeConfigSpec) error {
	d.peersMu.Lock()
	defer d.peersMu.Unlock()
	if err := nodeconfig.Validate(spec); err != nil {
		d.metrics.ReloadsTotal.WithLabelValues("error").Inc()
		d.setConfigError(err)
		return err
	}
	d.mu.Lock()
	oldRest, newRest := d.spec, *spec
	d.mu.Unlock()
	oldRest.BGP.Peers, newRest.BGP.Peers = nil, nil
	oldRest.Services, newRest.Services = v1alpha1.Services{}, v1alpha1.Services{}
	if !reflect.DeepEqual(oldRest, newRest) {
		d.log.Warn("reload: changes outside spec.bgp.peers and spec.services (pools, defaults, asn, routerID, listen port, import policy) take effect at the next agent restart")
	}
	if d.peersOpen {
		if err := d.speaker.ApplyPeers(spec.BGP.Peers); err != nil {
			d.metrics.ReloadsTotal.WithLabelValues("error").Inc()
			d.setConfigError(err)
			return err
		}
	}
	d.mu.Lock()
	d.spec.BGP.Peers = spec.BGP.Peers
	d.spec.Services = spec.Services
	d.mu.Unlock()
	if d.kube != nil && d.kube.services != nil {
		d.kube.services.SetOptions(d.serviceOptions())
	}
	d.metrics.ReloadsTotal.WithLabelValues("success").Inc()
	d.setConfigError(nil)
	d.log.Info("reload: node config applied", "peers", len(spec.BGP.Peers))
	return nil
}

// openPeers adds the peers: start-up's last step.
func (d *daemon) openPeers() {
	d.peersMu.Lock()
	d.peersOpen = true
	d.peersMu.Unlock()
	d.reapplyPeers()
}

// reapplyPeers re-reads passwords (a rotated Secret): only sessions whose
// password changed are re-created. Nothing before openPeers.
func (d *daemon) reapplyPeers() {
	d.peersMu.Lock()
	defer d.peersMu.Unlock()
	if !d.peersOpen {
		return
	}
	d.mu.Lock()
	peers := d.spec.BGP.Peers
	d.mu.Unlock()
	if err := d.speaker.ApplyPeers(peers); err != nil {
		d.log.Error("bgp: peers", "err", err)
		d.setConfigError(err)
		return
	}
	d.setConfigError(nil)
}

// reloadFile re-reads the standalone file.
func (d *daemon) reloadFile() {
	d.log.Info("reload: node config", "file", d.o.NodeConfig)
	nc, err := nodeconfig.Load(d.o.NodeConfig)
	if err == nil {
		if err = d.applySpec(&nc.Spec); err == nil {
			d.mu.Lock()
			d.filePools = nc.AddressPools
			d.mu.Unlock()
			d.applyPools()
		}
	} else {
		d.metrics.ReloadsTotal.WithLabelValues("error").Inc()
		d.setConfigError(err)
	}
	if err != nil {
		d.log.Error("reload: keeping the running config", "err", err)
	}
}
