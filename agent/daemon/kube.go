package daemon

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/agent/metrics"
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

// podEvents fans informer events out to the agent and the leak GC.
type podEvents struct {
	agent *agent.Agent
	gc    *leakgc.GC
}

func (e *podEvents) PodReady(id podmeta.ID, ready bool) {
	if e.agent != nil {
		e.agent.SetPodReady(id, ready)
	}
}

func (e *podEvents) PodGone(id podmeta.ID) {
	if e.agent != nil {
		e.agent.ForgetPod(id)
	}
	if e.gc != nil {
		e.gc.PodGone(id)
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

// newKube connects to the API, waits (bounded) for this node's NodeConfig
// and syncs the password Secret; the pod informer starts later (startPods).
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
	if err := k.secrets.Start(ctx); err != nil {
		return nil, err
	}
	k.pods = pods.New(cs, o.NodeName, k.events)
	return k, nil
}

// startPods connects the informer to the agent and waits for its sync.
func (k *kubeMode) startPods(ctx context.Context, a *agent.Agent, m *metrics.Metrics) error {
	grace := k.o.LeakGCGrace
	if grace == 0 {
		grace = 2 * time.Minute
	}
	k.gc = &leakgc.GC{Allocs: a, API: k.pods, Grace: grace, Log: k.o.Log, OnCollect: m.LeaksCollected.Inc}
	k.events.agent, k.events.gc = a, k.gc
	return k.pods.Start(ctx)
}

// afterStart begins the leak GC, live NodeConfig and Secret updates, and
// the status writer.
func (k *kubeMode) afterStart(ctx context.Context, d *daemon) {
	k.gc.Start(ctx)
	k.nc.OnChange = func(spec *v1alpha1.NodeConfigSpec, gen int64) {
		if k.gen.Swap(gen) == gen {
			return
		}
		d.log.Info("NodeConfig changed", "generation", gen)
		if err := d.applySpec(spec); err != nil {
			d.log.Error("NodeConfig: keeping the running config", "err", err)
		}
	}
	k.nc.Start(ctx)
	k.secrets.OnChange = d.reapplyPeers
	go k.writeStatus(ctx, d)
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
func (k *kubeMode) writeStatus(ctx context.Context, d *daemon) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.kick:
		case <-t.C:
		}
		st := d.nodeStatus(k.gen.Load())
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := k.nc.UpdateStatus(c, st); err != nil {
			d.log.Debug("NodeConfig status", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// reportError puts a startup error into the NodeConfig status, where an
// operator running `kubectl get nodeconfigs` sees it.
func (k *kubeMode) reportError(ctx context.Context, err error) {
	st := v1alpha1.NodeConfigStatus{LastError: err.Error(), ObservedGeneration: k.gen.Load()}
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = k.nc.UpdateStatus(c, st)
}

// nodeStatus builds the NodeConfig status from the live state.
func (d *daemon) nodeStatus(gen int64) v1alpha1.NodeConfigStatus {
	st := v1alpha1.NodeConfigStatus{ObservedGeneration: gen, Allocations: int32(d.agent.Count())}
	d.mu.Lock()
	st.LastError = d.lastErr
	d.mu.Unlock()
	if sp := d.speaker.get(); sp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for _, n := range sp.Neighbors(ctx) {
			ps := v1alpha1.PeerStatus{Peer: n.Peer, State: n.State}
			if !n.Since.IsZero() {
				t := metav1.NewTime(n.Since)
				ps.Since = &t
			}
			if len(n.Warnings) > 0 {
				ps.Warning = n.Warnings[0]
			} else if n.LastError != "" && n.State != "Established" {
				ps.Warning = n.LastError
			}
			st.PeerStates = append(st.PeerStates, ps)
			st.PeersConfigured++
			if n.State == "Established" {
				st.PeersEstablished++
			}
		}
		cancel()
	}
	st.Peers = fmt.Sprintf("%d/%d", st.PeersEstablished, st.PeersConfigured)
	cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Serving", Message: "allocations recovered, CNI served", LastTransitionTime: metav1.Now(), ObservedGeneration: gen}
	if st.LastError != "" {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "Error", st.LastError
	}
	st.Conditions = []metav1.Condition{cond}
	return st
}
