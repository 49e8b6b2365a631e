package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/agent/status"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/leakgc"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
	"code.fritzlab.net/fritzlab/flock/k8s/secrets"
)

// kubeMode holds what Kubernetes mode adds: clients, informers, leak GC
// and the NodeConfig status writer.
type kubeMode struct {
	o       Options
	spec    *v1alpha1.NodeConfigSpec
	gen     atomic.Int64
	nc      *nodeconfigs.Watcher
	pods    *pods.Source
	secrets *secrets.Passwords
	events  *podEvents
	gc      *leakgc.GC
	kick    chan struct{}
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
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	k := &kubeMode{o: o, nc: nodeconfigs.New(dyn, o.NodeName), events: &podEvents{}, kick: make(chan struct{}, 1)}
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
	k.secrets = secrets.New(cs, o.Namespace, secrets.DefaultName)
	k.pods = pods.New(cs, o.NodeName, k.events)
	return k, nil
}

// wire connects the informer events to the agent and the leak GC.
func (k *kubeMode) wire(d *daemon) {
	grace := k.o.LeakGCGrace
	if grace == 0 {
		grace = 2 * time.Minute
	}
	k.gc = &leakgc.GC{Allocs: d.agent, API: k.pods, Grace: grace, Log: d.log, OnCollect: d.metrics.LeaksCollected.Inc}
	k.events.agent, k.events.gc = d.agent, k.gc
}

// startInformers runs the pod and Secret informers and waits for their
// first sync: every pod's readiness is known before allocations are
// restored (so a restart neither withdraws nor re-announces anycast), and
// the BGP passwords before the first peer is added.
func (k *kubeMode) startInformers(ctx context.Context, g *errgroup.Group) error {
	g.Go(func() error { return k.pods.Run(ctx) })
	g.Go(func() error { return k.secrets.Run(ctx) })
	if err := k.pods.WaitSynced(ctx); err != nil {
		return err
	}
	return k.secrets.WaitSynced(ctx)
}

// startServing begins the leak GC, live NodeConfig and Secret updates, and
// the status writer.
func (k *kubeMode) startServing(ctx context.Context, g *errgroup.Group, d *daemon) {
	g.Go(func() error { return k.gc.Run(ctx) })
	g.Go(func() error {
		return k.nc.Run(ctx, func(spec *v1alpha1.NodeConfigSpec, gen int64) {
			if k.gen.Swap(gen) == gen {
				return
			}
			d.log.Info("NodeConfig changed", "generation", gen)
			if err := d.applySpec(spec); err != nil {
				d.log.Error("NodeConfig: keeping the running config", "err", err)
			}
		})
	})
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-k.secrets.Changed():
				d.reapplyPeers()
			}
		}
	})
	g.Go(func() error { return k.writeStatus(ctx, d) })
	k.statusChanged()
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
	case n.ConfigError != "":
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "ConfigError", n.ConfigError
	case len(problems) > 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "ReconcileFailing", st.LastError
	}
	st.Conditions = []metav1.Condition{cond}
	return st
}
