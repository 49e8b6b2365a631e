package policyips

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// AgentPollInterval is how often the agent's bindings are read: a binding
// is covered before it exists through its claim or annotation (both seen
// by informers at once); the agent's record only narrows what this node's
// pods hold once they run.
const AgentPollInterval = time.Second

// Tracker keeps Owners current for a running engine. Its methods are safe
// for concurrent use; PodsForIP and ExtraPodIPs never block on the API.
type Tracker struct {
	node    string
	agent   *admin.Client // nil: no agent to ask
	log     *slog.Logger
	claims  cache.SharedIndexInformer
	pools   cache.SharedIndexInformer
	current atomic.Pointer[Owners]
	kick    chan struct{}
}

// NewTracker watches AddressClaims and AddressPools through dyn; agentSocket
// ("" for none) is this node's agent's admin socket.
func NewTracker(node string, dyn dynamic.Interface, agentSocket string, log *slog.Logger) *Tracker {
	t := &Tracker{node: node, log: log, kick: make(chan struct{}, 1),
		claims: kubeclient.NewDynamicInformer(dyn, claims.GVR, nil),
		pools:  kubeclient.NewDynamicInformer(dyn, addresspools.GVR, nil)}
	if agentSocket != "" {
		t.agent = admin.NewClient(agentSocket)
	}
	for _, inf := range []cache.SharedIndexInformer{t.claims, t.pools} {
		_, _ = inf.AddEventHandler(t.Handler())
	}
	return t
}

// PodsForIP answers for the engine (Config.PodsForIP).
func (t *Tracker) PodsForIP(ip string) []string { return t.current.Load().PodsForIP(ip) }

// ExtraPodIPs answers for the engine (Config.ExtraPodIPs).
func (t *Tracker) ExtraPodIPs(p *corev1.Pod) []string { return t.current.Load().ExtraPodIPs(p) }

// Handler recomputes on any change of the objects it is added to (the
// engine's pod and namespace informers).
func (t *Tracker) Handler() cache.ResourceEventHandler {
	kick := func() {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: func(any) { kick() }, UpdateFunc: func(any, any) { kick() }, DeleteFunc: func(any) { kick() }}
}

// Run keeps the owners current from the informers and the agent until ctx
// ends, calling changed after every change of the answer.
func (t *Tracker) Run(ctx context.Context, podLister corelisters.PodLister, nsLister corelisters.NamespaceLister, synced []cache.InformerSynced, changed func()) error {
	go t.claims.Run(ctx.Done())
	go t.pools.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), append(synced, t.claims.HasSynced, t.pools.HasSynced)...) {
		return nil // ctx ended
	}
	tick := time.NewTicker(AgentPollInterval)
	defer tick.Stop()
	var lastLocal []admin.Pod
	var agentErr string
	for {
		local, err := t.readAgent(ctx)
		if err != nil && err.Error() != agentErr {
			t.log.Warn("cannot read the agent's bindings; this node's pods are judged by their claims and AddressPools", "err", err)
		}
		agentErr = ""
		if err != nil {
			agentErr = err.Error()
		}
		lastLocal = local
		if o := t.compute(podLister, nsLister, lastLocal); !o.Equal(t.current.Load()) {
			t.current.Store(o)
			t.log.Info("extra pod IPs under policy changed", "ips", o.Len())
			changed()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-t.kick:
		}
	}
}

func (t *Tracker) readAgent(ctx context.Context) ([]admin.Pod, error) {
	if t.agent == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var out []admin.Pod
	if err := t.agent.Get(ctx, "/v1/pods", &out); err != nil {
		return nil, err
	}
	if out == nil {
		out = []admin.Pod{}
	}
	return out, nil
}

func (t *Tracker) compute(podLister corelisters.PodLister, nsLister corelisters.NamespaceLister, local []admin.Pod) *Owners {
	in := Inputs{Node: t.node, Local: local, Namespaces: map[string]labels.Set{}}
	in.Pods, _ = podLister.List(labels.Everything())
	nss, _ := nsLister.List(labels.Everything())
	for _, ns := range nss {
		in.Namespaces[ns.Name] = ns.Labels
	}
	for _, obj := range t.claims.GetStore().List() {
		var c v1alpha1.AddressClaim
		if u, ok := obj.(*unstructured.Unstructured); ok && runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c) == nil {
			in.Claims = append(in.Claims, c)
		}
	}
	var aps []v1alpha1.AddressPool
	for _, obj := range t.pools.GetStore().List() {
		var ap v1alpha1.AddressPool
		if u, ok := obj.(*unstructured.Unstructured); ok && runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ap) == nil {
			aps = append(aps, ap)
		}
	}
	// Invalid pools authorize nothing; the valid ones still do.
	in.Pools, _ = authz.Compile(aps)
	return Compute(in)
}
