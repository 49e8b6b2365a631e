package policyips

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
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
	synced  atomic.Bool                 // the first answer is computed
	local   atomic.Pointer[[]admin.Pod] // the agent's answer; nil while it does not answer
	// lastGood is the agent's last answer, kept while it does not answer
	// (Inputs.Stale).
	lastGood atomic.Pointer[[]admin.Pod]
	kick     chan struct{}
	// claimedPods are the keys of the pods `addresses` claims name, as of
	// the claims the last compute read (nil before it: every pod
	// matters). It is stored before that compute reads any pod, so a pod
	// change the handler skips for not being in it is read by a compute
	// that follows.
	claimedPods atomic.Pointer[map[string]bool]
	// anycast are the keys of the pods that carry the anycast annotation,
	// kept by the pod informer's handler: a compute reads those pods, not
	// the cluster's.
	anycastMu sync.Mutex
	anycast   map[string]bool

	// BindingsFile, if set before Run, keeps lastGood across restarts of
	// this process: flock-policy and the agent are restarted together (a
	// rollout), and until the agent serves again only this file knows
	// what it bound. Set by flock-policy to DefaultBindingsFile.
	BindingsFile string
}

// DefaultBindingsFile is where flock-policy keeps the agent's last answer
// (tmpfs: a reboot starts every pod anew, and the file with them).
const DefaultBindingsFile = "/run/flock/policy-bindings.json"

// bindingsVersion is the format of BindingsFile; a file of another
// version is not read (its bindings are judged by claims and pools).
const bindingsVersion = 1

type bindingsFile struct {
	Version int         `json:"version"`
	Node    string      `json:"node"`
	Pods    []admin.Pod `json:"pods"`
}

// loadBindings reads BindingsFile into lastGood, if it is this node's and
// of this format.
func (t *Tracker) loadBindings() {
	if t.BindingsFile == "" {
		return
	}
	b, err := os.ReadFile(t.BindingsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var f bindingsFile
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	switch {
	case err != nil:
		t.log.Warn("cannot read the agent's last bindings; until it answers, this node's pods are judged by their claims and AddressPools", "file", t.BindingsFile, "err", err)
	case f.Version != bindingsVersion:
		t.log.Warn("the agent's last bindings are of another format; until it answers, this node's pods are judged by their claims and AddressPools", "file", t.BindingsFile, "version", f.Version, "supported", bindingsVersion)
	case f.Node != t.node:
		t.log.Warn("the agent's last bindings are another node's; ignored", "file", t.BindingsFile, "node", f.Node, "this node", t.node)
	default:
		pods := f.Pods
		if pods == nil {
			pods = []admin.Pod{}
		}
		t.lastGood.Store(&pods)
		t.log.Info("until the agent answers, this node's pods keep what it last said they bound", "file", t.BindingsFile, "pods", len(pods))
	}
}

// saveBindings writes the agent's answer to BindingsFile (atomically: a
// crash leaves the old one or the new one).
func (t *Tracker) saveBindings(pods []admin.Pod) error {
	if t.BindingsFile == "" {
		return nil
	}
	b, err := json.Marshal(bindingsFile{Version: bindingsVersion, Node: t.node, Pods: pods})
	if err != nil {
		return err
	}
	tmp := t.BindingsFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("agent bindings: %w", err)
	}
	if err := os.Rename(tmp, t.BindingsFile); err != nil {
		return fmt.Errorf("agent bindings: %w", err)
	}
	return nil
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

// HasSynced reports whether the first answer is there; the engine syncs
// its rules only after it (Config.ExtraIPsSynced).
func (t *Tracker) HasSynced() bool { return t.synced.Load() }

// PodsForIP answers for the engine (Config.PodsForIP).
func (t *Tracker) PodsForIP(ip string) []string { return t.current.Load().PodsForIP(ip) }

// ExtraPodIPs answers for the engine (Config.ExtraPodIPs).
func (t *Tracker) ExtraPodIPs(p *trim.Pod) []string { return t.current.Load().ExtraPodIPs(p) }

// Handler recomputes on a change of the objects it is added to (the
// engine's pod and namespace informers, the tracker's claims and pools),
// but not on an update of a pod or namespace that changes nothing Compute
// reads (trim.Unchanged: the kubelet's status updates, a relist), nor on
// any change of a pod that cannot hold an extra IP: one of another node
// that no `addresses` claim names and that asks for no anycast IP. Every
// pod change of the cluster reaches it; a recompute reads every claim.
func (t *Tracker) Handler() cache.ResourceEventHandler {
	kick := func() {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if t.podEvent(nil, obj) {
				kick()
			}
		},
		DeleteFunc: func(obj any) {
			if t.podEvent(obj, nil) {
				kick()
			}
		},
		UpdateFunc: func(old, cur any) {
			if !trim.Unchanged(old, cur) && t.podEvent(old, cur) {
				kick()
			}
		}}
}

// podEvent follows a pod's anycast annotation from old to cur (nil: added,
// or deleted) and says whether the change can move an extra IP: true for
// objects that are not pods.
func (t *Tracker) podEvent(old, cur any) bool {
	if d, ok := old.(cache.DeletedFinalStateUnknown); ok {
		old = d.Obj
	}
	op, _ := old.(*trim.Pod)
	cp, _ := cur.(*trim.Pod)
	if op == nil && cp == nil {
		return true
	}
	t.anycastMu.Lock()
	if t.anycast == nil {
		t.anycast = map[string]bool{}
	}
	switch {
	case cp != nil && cp.Annotations[annotations.Anycast] != "":
		t.anycast[podKey(cp)] = true
	case cp != nil:
		delete(t.anycast, podKey(cp))
	default:
		delete(t.anycast, podKey(op))
	}
	t.anycastMu.Unlock()
	return t.matters(op) || t.matters(cp)
}

// matters says whether p (nil: none) can hold an extra IP now, or held one
// by the last compute's reading.
func (t *Tracker) matters(p *trim.Pod) bool {
	if p == nil {
		return false
	}
	if p.Spec.NodeName == t.node || p.Annotations[annotations.Anycast] != "" {
		return true
	}
	claimed := t.claimedPods.Load()
	return claimed == nil || (*claimed)[podKey(p)]
}

func podKey(p *trim.Pod) string { return p.Namespace + "/" + p.Name }

// Run keeps the owners current from the informers and the agent until ctx
// ends, calling changed after every change of the answer with the IPs
// whose holders changed and the pods (namespace/name) whose extra IPs did
// (Owners.Diff).
func (t *Tracker) Run(ctx context.Context, podLister trim.PodLister, nsLister corelisters.NamespaceLister, synced []cache.InformerSynced, changed func(ips, pods []string)) error {
	t.loadBindings()
	go t.claims.Run(ctx.Done())
	go t.pools.Run(ctx.Done())
	engine := func() bool {
		for _, s := range synced {
			if !s() {
				return false
			}
		}
		return true
	}
	if !kubeclient.WaitLogged(ctx, t.log, "extra pod IPs under policy", kubeclient.SyncWarnAfter,
		kubeclient.Synced{Name: "pods and namespaces", Synced: engine},
		kubeclient.Synced{Name: "AddressClaims", Synced: t.claims.HasSynced},
		kubeclient.Synced{Name: "AddressPools", Synced: t.pools.HasSynced}) {
		return nil // ctx ended
	}
	// The agent is read on its own: a slow or restarting agent must not
	// hold back a recompute for a claim, a pool or a pod.
	first := make(chan struct{})
	polling := make(chan struct{})
	go func() {
		defer close(polling)
		t.pollAgent(ctx, first)
	}()
	defer func() { <-polling }() // ctx has ended: no poll outlives Run
	select {
	case <-first:
	case <-ctx.Done():
		return nil
	}
	for {
		local, stale := t.localPods()
		o := t.compute(podLister, nsLister, local, stale)
		if prev := t.current.Load(); !t.synced.Load() || !o.Equal(prev) {
			ips, pods := o.Diff(prev)
			t.current.Store(o)
			t.synced.Store(true)
			t.log.Info("extra pod IPs under policy", "ips", o.Len())
			changed(ips, pods)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.kick:
		}
	}
}

// localPods is the agent's answer (nil when it did not answer) and,
// while it does not, its last answer (nil if it never answered).
func (t *Tracker) localPods() (local, stale []admin.Pod) {
	if p := t.local.Load(); p != nil {
		return *p, nil
	}
	if p := t.lastGood.Load(); p != nil {
		return nil, *p
	}
	return nil, nil
}

// pollAgent reads the agent's bindings every AgentPollInterval and kicks a
// recompute when they changed; first is closed after the first attempt.
func (t *Tracker) pollAgent(ctx context.Context, first chan struct{}) {
	tick := time.NewTicker(AgentPollInterval)
	defer tick.Stop()
	var lastErr, lastSaveErr string
	for {
		local, err := t.readAgent(ctx)
		if err != nil && err.Error() != lastErr {
			t.log.Warn("cannot read the agent's bindings; this node's pods keep what it last said it bound, and what their claims and AddressPools allow", "err", err)
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
		}
		var p *[]admin.Pod
		if err == nil && local != nil {
			p = &local
			if old := t.lastGood.Swap(p); !samePods(old, p) {
				serr := t.saveBindings(local)
				if serr != nil && serr.Error() != lastSaveErr {
					t.log.Warn("cannot keep the agent's bindings on disk; a restart of flock-policy while the agent is down judges them by claims and AddressPools", "err", serr)
				}
				lastSaveErr = ""
				if serr != nil {
					lastSaveErr = serr.Error()
				}
			}
		}
		if old := t.local.Swap(p); !samePods(old, p) {
			select {
			case t.kick <- struct{}{}:
			default:
			}
		}
		if first != nil {
			close(first)
			first = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// samePods compares two answers of the agent (nil: no answer).
func samePods(a, b *[]admin.Pod) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.EqualFunc(*a, *b, func(x, y admin.Pod) bool {
		return x.ID == y.ID && x.Phase == y.Phase && slices.Equal(x.Addresses, y.Addresses) && slices.Equal(x.Anycast, y.Anycast)
	})
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

// compute reads the inputs and derives the owners. Of the pods it reads
// only those Compute can give an extra IP: the agent's (bound), the ones
// claims name, the ones asking for anycast; not the whole cluster's.
func (t *Tracker) compute(podLister trim.PodLister, nsLister corelisters.NamespaceLister, local, stale []admin.Pod) *Owners {
	in := Inputs{Node: t.node, Local: local, Stale: stale, Namespaces: map[string]labels.Set{}}
	for _, obj := range t.claims.GetStore().List() {
		var c v1alpha1.AddressClaim
		if u, ok := obj.(*unstructured.Unstructured); ok && runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c) == nil {
			in.Claims = append(in.Claims, c)
		}
	}
	keys := map[string]bool{}
	claimed := map[string]bool{}
	for _, c := range in.Claims {
		if c.Spec.Use == v1alpha1.UseAddresses && c.Spec.Pod != nil {
			claimed[c.Spec.Pod.Namespace+"/"+c.Spec.Pod.Name] = true
		}
	}
	t.claimedPods.Store(&claimed) // before any pod is read: see claimedPods
	maps.Copy(keys, claimed)
	for _, r := range append(slices.Clone(local), stale...) {
		keys[r.Namespace+"/"+r.Name] = true
	}
	t.anycastMu.Lock()
	maps.Copy(keys, t.anycast)
	t.anycastMu.Unlock()
	for k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		if p, err := podLister.Pods(ns).Get(name); err == nil {
			in.Pods = append(in.Pods, p)
		}
	}
	nss, _ := nsLister.List(labels.Everything())
	for _, ns := range nss {
		in.Namespaces[ns.Name] = ns.Labels
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
