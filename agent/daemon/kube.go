package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/status"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/leakgc"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
	"code.fritzlab.net/fritzlab/flock/k8s/secrets"
)

// kubeMode holds what Kubernetes mode adds: clients, informers, leak GC
// and the NodeConfig status writer.
type kubeMode struct {
	o       Options
	factory *kubeclient.Factory // every informer
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
	f := kubeclient.NewFactory()
	k := &kubeMode{o: o, core: core, factory: f, nc: nodeconfigs.New(f, dyn, o.NodeName), allNC: nodeconfigs.NewAll(f, dyn), events: &podEvents{},
		kick: make(chan struct{}, 1), poolKick: make(chan struct{}, 1),
		pools: addresspools.New(f, dyn, core.Namespaces(), o.Log), claims: claims.New(f, dyn, o.NodeName, o.Log)}
	wait := o.NodeConfigWait
	if wait == 0 {
		wait = 5 * time.Minute
	}
	o.Log.Info("waiting for this node's NodeConfig", "node", o.NodeName)
	spec, gen, err := k.nc.Wait(ctx, wait)
	if err != nil {
		return nil, err
	}
	k.spec = spec
	k.gen.Store(gen)
	k.secrets = secrets.New(f, core.Secrets(o.Namespace), o.Namespace, secrets.DefaultName)
	k.pods = pods.New(f, func(ns string) pods.Client { return core.Pods(ns) }, o.NodeName, k.events)
	return k, nil
}

// wire connects the informer events to the agent and the leak GC.
func (k *kubeMode) wire(d *daemon) {
	grace := k.o.LeakGCGrace
	if grace == 0 {
		grace = 2 * time.Minute
	}
	k.gc = &leakgc.GC{Allocs: gcAllocs{d.agent}, API: k.pods, Grace: grace, Log: d.log, OnCollect: d.metrics.LeaksCollected.Inc}
	k.events.agent, k.events.gc = d.agent, k.gc
	k.claimGC = &claims.GC{
		Claims: k.claims, Grace: grace, Log: d.log, OnCollect: d.metrics.LeaksCollected.Inc,
		Holds: d.state.Holds,
		Pods:  k.pods.Exists,
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
	c.register("leak gc", whenServing, k.gc)
	c.register("claim gc", whenServing, k.claimGC)
	c.register("nodeconfig", whenServing, follow(func() { k.followNodeConfig(d) }, k.nc.Changed()))
	c.register("bgp passwords", whenServing, follow(d.reapplyPeers, k.secrets.Changed()))
	c.register("address pools", whenServing, follow(d.applyPools, k.pools.Changed(), k.allNC.Changed()))
	c.register("claims", whenServing, follow(d.agent.ClaimsChanged, k.claims.Changed()))
	c.register("addresspool status", whenServing, RunFunc(func(ctx context.Context) error { return k.writePoolStatus(ctx, d) }))
	c.register("nodeconfig status", whenServing, RunFunc(func(ctx context.Context) error { return k.writeStatus(ctx, d) }))
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
// and at once when the pools change. status.claims (the kubectl column):
// every agent computes the same numbers, so only the first writes.
// status.inUse: what is in use differs by node, so each agent writes only
// its own node's entry, and only when it changed (see UpdateInUse).
func (k *kubeMode) writePoolStatus(ctx context.Context, d *daemon) error {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := k.pools.UpdateClaims(c, k.claims.CountByPool()); err != nil && ctx.Err() == nil {
			d.log.Debug("AddressPool status", "err", err)
		}
		if err := k.pools.UpdateInUse(c, k.o.NodeName, d.inUseStatus(), k.allNC.Exists); err != nil && ctx.Err() == nil {
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
	if h.Node == c.k.o.NodeName && h.Pod.Same(cl.Pod) && h.Pod.Incarnation() != "" {
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
	return fmt.Errorf("%w: %v", agent.ErrClaimed, held)
}

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

// writeStatus keeps NodeConfig status current: on every change (at most
// one write a second) and every 30 s for the allocation count.
func (k *kubeMode) writeStatus(ctx context.Context, d *daemon) error {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	var last *v1alpha1.NodeConfigStatus
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-k.kick:
		case <-d.speaker.Changed():
		case <-t.C:
			last = nil // rewrite even if unchanged: someone may have edited it
		}
		st := nodeStatus(d.snapshot(), k.gen.Load())
		if last == nil || !sameStatus(*last, st) {
			c, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := k.nc.UpdateStatus(c, st); err != nil {
				d.log.Debug("NodeConfig status", "err", err)
			} else {
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

// sameStatus ignores the condition's transition time.
func sameStatus(a, b v1alpha1.NodeConfigStatus) bool {
	for _, s := range []*v1alpha1.NodeConfigStatus{&a, &b} {
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
	}
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
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
	st := v1alpha1.NodeConfigStatus{ObservedGeneration: gen, Allocations: int32(n.Allocations)}
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
