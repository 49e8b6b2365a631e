package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/metrics"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/agent/status"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/bgp/session"
	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/leakgc"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
	"code.fritzlab.net/fritzlab/flock/k8s/secrets"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
	"code.fritzlab.net/fritzlab/flock/k8s/uninstall"
)

// kubeMode holds what Kubernetes mode adds: clients, informers, leak GC
// and the NodeConfig status writer.
type kubeMode struct {
	// svcFactory has the Services' informer (the Services controller
	// watches the EndpointSlices of those it decides itself): the largest
	// lists at scale, and nothing of ADD reads them, so start-up does not
	// wait for them (the Services controller does).
	svcFactory *kubeclient.Factory

	o       Options
	factory *kubeclient.Factory // every other informer: start-up waits for them
	// nodesFactory has every node's NodeConfig (allNC): only the summaries'
	// overlaps read them, and those matter once the peers are added, so
	// serving CNI does not wait for them (waitNodeConfigs). At 5,000
	// nodes they were most of an agent's start.
	nodesFactory *kubeclient.Factory

	spec    *v1alpha1.NodeConfigSpec
	gen     atomic.Int64
	core    *kubeclient.Client
	nc      *nodeconfigs.Watcher
	allNC   *nodeconfigs.All // every node's summaries, for overlaps
	pods    *pods.Source
	secrets *secrets.Passwords
	pools   *addresspools.Watcher
	claims  *claims.Claims
	events  *podEvents
	gc      *leakgc.GC
	claimGC *claims.GC
	kick    chan struct{}
	// poolKick asks for the AddressPools' status at once (a pool changed).
	poolKick chan struct{}
	// templates renders this node's NodeConfig from the NodeConfigTemplate
	// selecting it (nodetemplate.go).
	templates *templates
	// services decides the Service routes (LoadBalancer and external IPs).
	services *services.Controller
	dyn      dynamic.Interface
	// leaving says what a refusal (403, 401) at a planned stop means (uninstall.go):
	// flock's namespace followed from the start.
	leaving uninstall.Namespace
}

// podEvents fans informer events out to the agent and the leak GC. Both
// are set (wire) before the informer starts.
type podEvents struct {
	agent *agent.Agent
	gc    *leakgc.GC
}

func (e *podEvents) PodReady(id podmeta.ID, ready bool) { e.agent.SetPodReady(id, ready) }

func (e *podEvents) PodGone(id podmeta.ID) {
	e.agent.ForgetPod(id)
	e.gc.PodGone(id)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

// newKube connects to the API and waits (bounded) for this node's
// NodeConfig; the informers start later (startInformers).
func newKube(ctx context.Context, o Options) (*kubeMode, error) {
	if o.NodeName == "" {
		return nil, fmt.Errorf("--node-name is required in Kubernetes mode (set it from spec.nodeName)")
	}
	if o.Namespace == "" {
		o.Namespace = os.Getenv("POD_NAMESPACE")
	}
	if o.Namespace == "" {
		o.Namespace = "flock-system"
	}
	cfg, err := restConfig(o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "flock-agent/" + o.NodeName
	// client-go's default (5 requests/s) would make every claimed ADD
	// queue behind the last: a claim is one create, its DEL a get and a
	// delete. kubelet's own defaults.
	cfg.QPS, cfg.Burst = 50, 100
	core, err := kubeclient.New(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	disc, err := kubeclient.NewDiscovery(cfg)
	if err != nil {
		return nil, err
	}
	f, nf := kubeclient.NewFactory(), kubeclient.NewFactory()
	k := &kubeMode{o: o, core: core, factory: f, nodesFactory: nf, dyn: dyn, nc: nodeconfigs.NewNamed(f, dyn, o.NodeName), allNC: nodeconfigs.NewAll(nf, dyn, o.NodeName), events: &podEvents{},
		kick: make(chan struct{}, 1), poolKick: make(chan struct{}, 1),
		pools: addresspools.New(f, dyn, core.Namespaces(), o.Log), claims: claims.New(f, dyn, o.NodeName, o.Log)}
	wait := o.NodeConfigWait
	if wait == 0 {
		wait = 5 * time.Minute
	}
	if o.PodName != "" && o.Namespace != "" {
		k.leaving = uninstall.WatchNamespace(ctx, dyn, o.Namespace)
	}
	k.startTemplates(ctx, dyn, core) // before the wait: it may create the NodeConfig
	_, spec, gen, err := waitNodeConfigWith(ctx, o, k.nc, wait, 0, func(w *nodeConfigWait) {
		w.mu.Lock()
		w.explain = k.templates.explain
		w.mu.Unlock()
	})
	if err != nil {
		return nil, k.templates.waitError(err)
	}
	k.spec = spec
	k.gen.Store(gen)
	k.secrets = secrets.New(f, core.Secrets(o.Namespace), o.Namespace, secrets.DefaultName)
	k.pods = pods.New(f, func(ns string) pods.Client { return core.Pods(ns) }, o.NodeName, k.events)
	// Nothing is authorized until wire hands it the daemon's AddressPools.
	k.svcFactory = kubeclient.NewFactory()
	k.services = services.New(k.svcFactory, services.Clients{Services: core.Services(""), EndpointSlices: disc.EndpointSlices("")},
		services.Options{Node: o.NodeName}, o.Log.With("component", "services"))
	return k, nil
}

// waitNodeConfigWith waits (up to wait; poll 0: the default) for this
// node's NodeConfig. Nothing else serves yet, so while it waits it serves
// what an operator looks at itself: /healthz, /readyz (503, saying what it
// waits for) and /metrics (empty) on the metrics address, and the admin
// API's status (not Ready, configError) on the admin socket; both are
// closed again before it returns, for the agent's own. What keeps the
// NodeConfig from being read (RBAC, no CRD, credentials, the API server
// unreachable) is logged at once, at Error and once per distinct error,
// and shown there until it clears; a NodeConfig that does not exist yet is
// waited for as before. started, if set, is called with the wait's state
// once it serves.
func waitNodeConfigWith(ctx context.Context, o Options, nc *nodeconfigs.Watcher, wait, poll time.Duration, started func(*nodeConfigWait)) (*nodeConfigWait, *v1alpha1.NodeConfigSpec, int64, error) {
	w := &nodeConfigWait{node: o.NodeName, log: o.Log}
	stop := w.serve(ctx, o)
	defer stop()
	if started != nil {
		started(w)
	}
	o.Log.Info("waiting for this node's NodeConfig", "node", o.NodeName, "for", wait)
	spec, gen, err := nc.Wait(ctx, nodeconfigs.WaitOptions{Timeout: wait, Poll: poll, Progress: w.progress})
	if err == nil {
		w.progress(nil)
	}
	return w, spec, gen, err
}

// nodeConfigWait is the agent's state while it waits for its NodeConfig.
type nodeConfigWait struct {
	node string
	log  *slog.Logger

	mu     sync.Mutex
	tried  bool   // a read has returned
	err    error  // what keeps the NodeConfig from being read; nil: nothing (it does not exist yet)
	logged string // the error last logged ("": none, or it cleared)
	// metricsAddr is where /readyz is served while waiting (tests).
	metricsAddr net.Addr
	// explain, if set, says why no NodeConfig is rendered for the node
	// from a NodeConfigTemplate (nodetemplate.go).
	explain func() error
}

// progress records the outcome of a read (nil: the NodeConfig does not
// exist, or was read) and logs a new error, or its clearing, once.
func (w *nodeConfigWait) progress(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tried, w.err = true, err
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == w.logged {
		return
	}
	if err != nil {
		w.log.Error("cannot read this node's NodeConfig; still waiting", "node", w.node, "err", err)
	} else {
		w.log.Info("this node's NodeConfig can be read again", "node", w.node, "was", w.logged)
	}
	w.logged = msg
}

// apiError is what keeps the NodeConfig from being read (nil: nothing).
func (w *nodeConfigWait) apiError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// readiness is /readyz's answer while waiting: never ready, and why.
func (w *nodeConfigWait) readiness() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.err != nil:
		return fmt.Errorf("waiting for NodeConfig %q: %w", w.node, w.err)
	case w.explain != nil && w.explain() != nil:
		return fmt.Errorf("waiting for NodeConfig %q: %w", w.node, w.explain())
	case w.tried:
		return fmt.Errorf("waiting for NodeConfig %q: it does not exist yet: create one for this node (see deploy/examples/nodeconfig.yaml)", w.node)
	}
	return fmt.Errorf("waiting for NodeConfig %q", w.node)
}

// serve serves /healthz, /readyz and the admin status until stop, which
// returns once both listeners are closed. A listener that cannot be bound
// is skipped (the agent's own binds it later, and reports).
func (w *nodeConfigWait) serve(ctx context.Context, o Options) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	run := func(l net.Listener, h http.Handler) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = admin.ServeHTTP(ctx, l, h)
		}()
	}
	if o.MetricsAddress != "" {
		if l, err := net.Listen("tcp", o.MetricsAddress); err != nil {
			o.Log.Warn("no /readyz while waiting for the NodeConfig", "err", err)
		} else {
			w.mu.Lock()
			w.metricsAddr = l.Addr()
			w.mu.Unlock()
			m := &metrics.Server{Metrics: &metrics.Metrics{Registry: prometheus.NewRegistry()}, Ready: w.readiness}
			run(l, m.Handler())
		}
	}
	if o.AdminSocket != "" {
		if l, err := admin.Listen(o.AdminSocket); err != nil {
			o.Log.Warn("no admin API while waiting for the NodeConfig", "err", err)
		} else {
			run(l, admin.Handler(waitingSource{w}))
		}
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// waitingSource is the admin API while waiting for the NodeConfig:
// nothing is served yet but the status. The store is not read yet, so
// the agent does not know its pods: every other view answers 503
// (NotServing), never an empty list that a reader would take for "no
// pods here" (flock-policy's tracker would drop their extra IPs from
// NetworkPolicy).
type waitingSource struct{ w *nodeConfigWait }

// NotServing says why the views are unavailable.
func (s waitingSource) NotServing() error {
	return fmt.Errorf("the agent does not know this node's pods yet: %w", s.w.readiness())
}

func (s waitingSource) Status() admin.Status {
	n := status.Node{}
	if err := s.w.apiError(); err != nil {
		n.ConfigError = s.w.readiness().Error()
	}
	st := admin.Status{Reconcilers: []reconcile.Status{}, ConfigError: n.ConfigError, Problems: n.Problems()}
	if st.ConfigError == "" {
		st.Problems = []string{s.w.readiness().Error()}
	}
	return st
}

func (waitingSource) Pods() []admin.Pod             { return []admin.Pod{} }
func (waitingSource) Pools() []admin.Pool           { return []admin.Pool{} }
func (waitingSource) Routes() []admin.Route         { return []admin.Route{} }
func (waitingSource) Neighbors() []session.Neighbor { return []session.Neighbor{} }
func (waitingSource) BGPRoutes() []admin.BGPRoute   { return []admin.BGPRoute{} }
func (waitingSource) Services() []services.Address  { return []services.Address{} }
func (s waitingSource) SetReadiness(admin.Readiness) (int, error) {
	return 0, s.w.readiness()
}

// wire connects the informer events to the agent and the leak GC.
func (k *kubeMode) wire(d *daemon) {
	grace := k.o.LeakGCGrace
	if grace == 0 {
		grace = 2 * time.Minute
	}
	k.gc = &leakgc.GC{Allocs: gcAllocs{d.agent}, API: k.pods, Grace: grace, Log: d.log, OnCollect: d.metrics.LeaksCollected.Inc}
	k.events.agent, k.events.gc = d.agent, k.gc
	k.services.SetOptions(d.serviceOptions())
	k.claimGC = &claims.GC{
		Claims: k.claims, Grace: grace, Log: d.log, OnCollect: d.metrics.LeaksCollected.Inc,
		Holds:       d.state.Holds,
		Pods:        k.pods.Exists,
		Peers:       k.allNC.Names,
		PeersSynced: k.allNC.HasSynced,
		Nodes: func(ctx context.Context, name string) (bool, error) {
			_, err := k.core.Nodes().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		},
	}
}

// register adds what Kubernetes mode runs: the informers (during
// recovery: restore needs their facts, see startup), then the followers
// of the NodeConfig, the Secret, the AddressPools and the claims, the
// garbage collectors and the status writers.
func (k *kubeMode) register(d *daemon, c *components) {
	c.register("informers", duringRecovery, k.factory)
	c.register("nodeconfig informer", duringRecovery, k.nodesFactory) // listing from the start; the peers wait for it
	c.register("leak gc", whenServing, k.gc)
	c.register("claim gc", whenServing, k.claimGC)
	c.register("nodeconfig", whenServing, follow(func() { k.followNodeConfig(d) }, k.nc.Changed()))
	c.register("bgp passwords", whenServing, follow(d.reapplyPeers, k.secrets.Changed()))
	c.register("address pools", whenServing, follow(d.applyPools, k.pools.Changed(), k.allNC.Changed()))
	c.register("claims", whenServing, follow(d.agent.ClaimsChanged, k.claims.Changed()))
	c.register("addresspool status", whenServing, RunFunc(func(ctx context.Context) error { return k.writePoolStatus(ctx, d) }))
	c.register("nodeconfig status", whenServing, RunFunc(func(ctx context.Context) error { return k.writeStatus(ctx, d) }))
	c.register("nodeconfig templates", duringRecovery, k.templates)
	c.register("nodeconfig template errors", whenServing, follow(d.statusChanged, k.templateChanged()))
	k.registerServices(d, c)
	c.register("service claims", whenServing, follow(k.services.Refresh, k.claims.ServicesChanged()))
}

// registerServices adds the Service routes: the informers list from the
// start (start-up does not wait for them), the controller decides once
// the agent serves, and its routes go to the node state.
func (k *kubeMode) registerServices(d *daemon, c *components) {
	c.register("service informers", duringRecovery, k.svcFactory)
	c.register("services", whenServing, k.services)
	c.register("service routes", whenServing, follow(func() { d.applyServiceRoutes() }, k.services.Changed()))
}

// followNodeConfig applies a new generation of this node's NodeConfig.
func (k *kubeMode) followNodeConfig(d *daemon) {
	spec, gen, err := k.nc.Current()
	if err != nil {
		d.log.Error("NodeConfig: keeping the running config", "err", err)
		d.setConfigError(err)
		return
	}
	if k.gen.Swap(gen) == gen {
		return
	}
	d.log.Info("NodeConfig changed", "generation", gen)
	if err := d.applySpec(spec); err != nil {
		d.log.Error("NodeConfig: keeping the running config", "err", err)
	}
}

// writePoolStatus keeps every AddressPool's status current, every 15 s
// and at once when the pools change. The Ready condition (True, or False
// with the validation error): judged on the AddressPools alone — not with
// this node's deprecated shared pools, which differ by node — so every
// agent reaches the same verdict and only the first writes it (see
// UpdateReady). status.claims (the kubectl column): every agent computes
// the same numbers, so only the first writes. status.inUse: what is in
// use differs by node, so each agent writes only its own node's entry,
// and only when it changed (see UpdateInUse).
func (k *kubeMode) writePoolStatus(ctx context.Context, d *daemon) error {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := k.pools.UpdateReady(c, poolVerdicts(k.pools.Pools())); err != nil && ctx.Err() == nil {
			d.log.Debug("AddressPool status", "err", err)
		}
		if err := k.pools.UpdateClaims(c, k.claims.CountByPool()); err != nil && ctx.Err() == nil {
			d.log.Debug("AddressPool status", "err", err)
		}
		if err := k.pools.UpdateInUse(c, k.o.NodeName, d.inUseStatus(), k.liveNodes()); err != nil && ctx.Err() == nil {
			d.log.Debug("AddressPool status", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-k.poolKick:
		}
	}
}

// liveNodes tells UpdateInUse which nodes' entries stay: those with a
// NodeConfig. Until every NodeConfig is listed (the agent serves before,
// waitNodeConfigs), a node not cached yet is no node gone: nil, every
// entry stays.
func (k *kubeMode) liveNodes() func(node string) bool {
	if !k.allNC.HasSynced() {
		return nil
	}
	return k.allNC.Exists
}

// poolVerdicts are the errors of the invalid AddressPools, by name, as
// authz.Compile finds them in the pools alone.
func poolVerdicts(pools []v1alpha1.AddressPool) map[string]error {
	set, _ := authz.Compile(pools)
	return set.Invalid()
}

func (k *kubeMode) poolStatusChanged() {
	select {
	case k.poolKick <- struct{}{}:
	default:
	}
}

// kubeClaims adapts the API's claims to the agent.
type kubeClaims struct {
	k *kubeMode
	d *daemon
}

func (c kubeClaims) Claim(ctx context.Context, cl agent.Claim) error {
	want := claims.Claim{IP: cl.IP, Use: cl.Use, Pool: cl.Pool, Pod: cl.Pod, Node: c.k.o.NodeName, ContainerID: cl.ContainerID}
	err := c.k.claims.Claim(ctx, want)
	var held *claims.ClaimedError
	if !errors.As(err, &held) {
		return err
	}
	h := held.Holder
	if h.Service == nil && h.Node == c.k.o.NodeName && h.Pod.Same(cl.Pod) && h.Pod.Incarnation() != "" {
		if _, _, live := c.d.state.Get(h.ContainerID); !live {
			// An earlier sandbox of the same pod on this node, gone
			// without giving its claim back: the pod's own to reuse.
			if rerr := c.k.claims.Release(ctx, cl.IP, h.ContainerID); rerr == nil {
				if err = c.k.claims.Claim(ctx, want); !errors.As(err, &held) {
					return err
				}
			}
		}
	}
	return claimedError{held}
}

// claimedError is the API's refusal as the agent's ErrClaimed. Its message
// is the holder's: "192.0.2.1 is claimed by pod ns/name (uid …) on node
// …, container …", or "… is claimed by Service ns/name (uid …)" for a
// LoadBalancer address.
type claimedError struct{ *claims.ClaimedError }

func (e claimedError) Unwrap() []error { return []error{agent.ErrClaimed, e.ClaimedError} }

func (c kubeClaims) Release(ctx context.Context, ip netip.Addr, containerID string) error {
	return c.k.claims.Release(ctx, ip, containerID)
}

func (c kubeClaims) Taken(ip netip.Addr) bool {
	_, ok := c.k.claims.Taken(ip)
	return ok
}

func (c kubeClaims) Node() []agent.Claim {
	var out []agent.Claim
	for _, cl := range c.k.claims.Node() {
		out = append(out, agent.Claim{IP: cl.IP, Use: cl.Use, Pool: cl.Pool, Pod: cl.Pod, ContainerID: cl.ContainerID})
	}
	return out
}

func (k *kubeMode) statusChanged() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// writeStatus keeps NodeConfig status current: on every change an
// operator must see (peers, readiness, errors, generation; at most one
// write a second), and a status someone else changed put back within
// 30 s. It is compared with the cache, so an unchanged status is never
// written again: every write reaches every node that watches NodeConfigs
// (kubelet's heartbeats moved to Leases for the same reason).
func (k *kubeMode) writeStatus(ctx context.Context, d *daemon) error {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	var last *v1alpha1.NodeConfigStatus // the last written, while the cache has no object
	var lastErr string                  // the last write's error, logged at Warn once per distinct text
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-k.kick:
		case <-d.speaker.Changed():
		case <-t.C:
		}
		// Compared with the cache, which has our last write a second
		// later (a write of the same status again changes nothing: the
		// API server makes no event of it), and shows anyone else's,
		// a status removed included.
		have := last
		if cached, ok := k.nc.Status(); ok {
			have = &cached
		}
		write, st := planStatus(nodeStatus(d.snapshot(), k.gen.Load()), have)
		if write {
			c, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := k.nc.UpdateStatus(c, st); err != nil {
				if err.Error() != lastErr && ctx.Err() == nil {
					d.log.Warn("NodeConfig status not written; retrying", "err", err)
				} else {
					d.log.Debug("NodeConfig status", "err", err)
				}
				lastErr = err.Error()
			} else {
				if lastErr != "" {
					d.log.Info("NodeConfig status written again")
					lastErr = ""
				}
				last = &st
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// planStatus decides whether want is written over have (nil: none known)
// and what exactly: the Ready condition keeps have's transition time while
// its status holds, so an unchanged status compares equal.
func planStatus(want v1alpha1.NodeConfigStatus, have *v1alpha1.NodeConfigStatus) (bool, v1alpha1.NodeConfigStatus) {
	if have == nil {
		return true, want
	}
	want.Conditions = slices.Clone(want.Conditions)
	for i := range want.Conditions {
		if old := meta.FindStatusCondition(have.Conditions, want.Conditions[i].Type); old != nil && old.Status == want.Conditions[i].Status {
			want.Conditions[i].LastTransitionTime = old.LastTransitionTime
		}
	}
	return !sameStatus(*have, want), want
}

// sameStatus compares a and b as the API server stores them (JSON, times
// to the second: a time read back from the cache has lost its
// nanoseconds), ignoring the condition's transition time. It works on
// copies of the conditions: zeroing the callers' (the slices share their
// arrays) made every later write fail the CRD's required
// lastTransitionTime.
func sameStatus(a, b v1alpha1.NodeConfigStatus) bool {
	for _, s := range []*v1alpha1.NodeConfigStatus{&a, &b} {
		s.Conditions = slices.Clone(s.Conditions)
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
	}
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// reportError puts a start-up error into the NodeConfig status, where an
// operator running `kubectl get nodeconfigs` sees it.
func (k *kubeMode) reportError(ctx context.Context, err error) {
	st := v1alpha1.NodeConfigStatus{LastError: err.Error(), ObservedGeneration: k.gen.Load()}
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = k.nc.UpdateStatus(c, st)
}

// nodeStatus renders the status snapshot as NodeConfig status.
func nodeStatus(n status.Node, gen int64) v1alpha1.NodeConfigStatus {
	st := v1alpha1.NodeConfigStatus{ObservedGeneration: gen}
	for _, p := range n.Neighbors {
		ps := v1alpha1.PeerStatus{Peer: p.Peer, State: string(p.State)}
		if !p.Since.IsZero() {
			t := metav1.NewTime(p.Since)
			ps.Since = &t
		}
		if len(p.Warnings) > 0 {
			ps.Warning = p.Warnings[0]
		} else if p.LastError != "" && !p.Established() {
			ps.Warning = p.LastError
		}
		st.PeerStates = append(st.PeerStates, ps)
	}
	up, total := n.Peers()
	st.PeersEstablished, st.PeersConfigured = int32(up), int32(total)
	st.Peers = fmt.Sprintf("%d/%d", up, total)
	for _, r := range n.Reconcilers {
		rs := v1alpha1.ReconcilerStatus{Target: r.Target, Errors: int64(r.Errors), Failing: r.Failing, LastError: r.LastError}
		if !r.LastErrorAt.IsZero() {
			t := metav1.NewTime(r.LastErrorAt)
			rs.LastErrorTime = &t
		}
		st.Reconcilers = append(st.Reconcilers, rs)
	}
	problems := n.Problems()
	st.LastError = strings.Join(problems, "; ")
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Serving", Message: "allocations recovered, CNI served, routes reconciled", LastTransitionTime: metav1.Now(), ObservedGeneration: gen}
	switch {
	case !n.Ready:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Starting", "recovering allocations"
	case n.Installer != "":
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "InstallerRefused", n.Installer
	case n.ConfigError != "":
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "ConfigError", n.ConfigError
	case len(problems) > 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "ReconcileFailing", st.LastError
	}
	st.Conditions = []metav1.Condition{cond}
	return st
}

// gcAllocs shows the agent's attachments to the leak GC.
type gcAllocs struct{ *agent.Agent }

func attachments(recs []store.Allocation) []leakgc.Attachment {
	out := make([]leakgc.Attachment, 0, len(recs))
	for _, r := range recs {
		out = append(out, leakgc.Attachment{ContainerID: r.ContainerID, Pod: r.Pod, IPs: r.IPs})
	}
	return out
}

func (g gcAllocs) Attachments() []leakgc.Attachment { return attachments(g.Allocations()) }

func (g gcAllocs) PodAttachments(id podmeta.ID) []leakgc.Attachment {
	return attachments(g.PodAllocations(id))
}
