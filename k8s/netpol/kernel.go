package netpol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	policylisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1alpha1"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts"
)

// kernelVerdicts keeps the kernel deciding what the engine would: on
// every change of a pod, namespace, NetworkPolicy, admin policy or extra
// IP it compiles the policies (verdicts.Compile) and replaces the table
// with the program. With the admin policies on, the packets of the pods
// they apply to go to the engine's queue, and the program decides the
// rest. The kernel never sees an empty or half-written
// table: until the first program after a start, the previous process's
// keeps deciding.
type kernelVerdicts struct {
	node       string
	pods       trim.PodLister
	namespaces corelisters.NamespaceLister
	policies   networkinglisters.NetworkPolicyLister
	extra      ExtraIPs
	// admin, if set, are the admin policies' listers (nil for an API
	// that is off).
	admin  *adminListers
	synced []kubeclient.Synced
	log    *slog.Logger
	kick   chan struct{}
	// loaded is closed once a program is in the kernel.
	loaded chan struct{}
	// netns is the network namespace whose table it keeps (-1: this
	// process's; tests use another).
	netns int
	// seq counts the changes asked for; done is the count a load in the
	// kernel started from (tests wait for it at quiescent points).
	seq, done atomic.Uint64
	// fail, if set, is asked before each transaction (tests inject
	// errors with it).
	fail func() error
	// last is the program in the kernel (for tests), which patch changes
	// in place.
	last atomic.Pointer[verdicts.Program]
	// failed is the last load's error, nil once one succeeds.
	failed atomic.Pointer[error]
	// hook is where the table's base chain sits: the engine's place
	// (postrouting, before SNAT), with its prelude.
	hook verdicts.Hook
	// holders are the pods whose status.podIPs hold an IP (the engine's
	// index); nil: every pod change compiles.
	holders func(ip string) []*trim.Pod
	// gen counts the changes of the context (verdicts.Deps): everything
	// but the pods of other nodes. deps are the last program's, valid
	// while gen is what it was when its objects were listed.
	gen  atomic.Uint64
	deps atomic.Pointer[depsAt]
	// local are this node's pods' status IPs, by pod (verdicts.Live's
	// Local); skipped counts the pod changes no program was compiled for.
	mu      sync.Mutex
	local   map[string][]string
	skipped atomic.Uint64
	// policySkipped counts the NetworkPolicy updates no program was
	// compiled for.
	policySkipped atomic.Uint64
	// urgent: a change since the last load started is more than other
	// nodes' pods (pace); hurry wakes a load waiting for those.
	urgent atomic.Bool
	hurry  chan struct{}
	// remoteLag is how long a change of other nodes' pods alone may wait
	// for its load (RemoteLag; tests set it).
	remoteLag time.Duration
	// dirty are the addresses (under mu) of pods of other nodes whose
	// change alters only their entries in the dispatch maps
	// (verdicts.Dispatchable): they are patched into the program in the
	// kernel, not compiled for. pseq counts those changes, pdone the
	// count the kernel follows; pkick wakes Run for them; patches counts
	// the patches made.
	dirty        map[netip.Addr]bool
	pseq, pdone  atomic.Uint64
	pkick        chan struct{}
	patches      atomic.Uint64
	loadedAt     *verdicts.Loaded // where the program in the kernel is (Run's)
	loadedGroups map[string]int   // its groups by key (Run's)
	patchEvery   time.Duration    // PatchEvery; tests set it
	// conn is Run's nftables connection, one socket for every
	// transaction (nft); a failed one is closed and dialled anew. dials
	// counts the connections dialled (tests).
	conn  *nftables.Conn
	dials atomic.Uint64
	// ips, if set, is the pods by status IP that the pod handler keeps
	// (holders reads it in flock-policy).
	ips *podsByIP
	// recheck are extra IPs whose holder change waits for the Deps of the
	// load asked for or under way (judgeExtra); rmu orders that against
	// the load's storing them (stored).
	rmu     sync.Mutex
	recheck map[string]bool
	// heldTwiceAt is when logHeldTwice last logged (Unix ns).
	heldTwiceAt atomic.Int64
}

// PatchEvery is how often, at most, the changes of other nodes' pods that
// alter only their dispatch entries and sets of peers are patched into
// the kernel: RemoteLag, as kube-proxy syncs an EndpointSlice's churn at
// most once a second (--min-sync-period). A change after a quiet spell
// is patched at once; under a churn, one transaction a second carries
// the batch. A transaction's commit costs the kernel a walk of the whole
// table (it checks the jumps), which grows with the program: at 500
// nodes' churn, patches every 250 ms were a sixth of flock-policy's CPU
// (every 100 ms, a fifth at 1,700).
const PatchEvery = RemoteLag

// patchPace is how long after the last patch, which took took, the next
// one waits: 19 times took, at least every (PatchEvery), at most lag
// (with PatchEvery as long as RemoteLag, every).
func patchPace(took, every, lag time.Duration) time.Duration {
	return min(max(19*took, every), max(lag, every))
}

// RemoteLag bounds how long a change of other nodes' pods alone waits for
// its load, as kube-proxy's min-sync-period (1 s) does for an
// EndpointSlice: such a change (a peer that comes, goes or moves) is
// what a large cluster churns through all the time, and each load
// compiles the whole program.
const RemoteLag = time.Second

// pace is how long a load waits, after the last one took and idle has
// passed since it ended, before it starts. Any change but other nodes'
// pods waits until idle is as long as took: flock-policy takes at most
// half a core. Other nodes' pods alone wait until idle is 49 times took (a
// fiftieth of a core, what kube-proxy spends on a cluster's endpoint
// churn), but no longer than lag, unless took itself is longer.
func pace(urgent bool, took, idle, lag time.Duration) time.Duration {
	want := took
	if !urgent {
		want = max(took, min(49*took, lag))
	}
	return max(0, want-idle)
}

type depsAt struct {
	d   *verdicts.Deps
	gen uint64
}

func newKernelVerdicts(node string, pods trim.PodLister, namespaces corelisters.NamespaceLister,
	policies networkinglisters.NetworkPolicyLister, extra ExtraIPs, synced []kubeclient.Synced, log *slog.Logger) *kernelVerdicts {
	return &kernelVerdicts{node: node, pods: pods, namespaces: namespaces, policies: policies, extra: extra,
		synced: synced, log: log, kick: make(chan struct{}, 1), loaded: make(chan struct{}), netns: -1, local: map[string][]string{},
		hurry: make(chan struct{}, 1), remoteLag: RemoteLag, dirty: map[netip.Addr]bool{}, pkick: make(chan struct{}, 1), patchEvery: PatchEvery, recheck: map[string]bool{},
		hook: verdicts.Hook{Num: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATSource - 5), Prelude: true}}
}

// adminListers are the listers of the admin policies' APIs that are on.
type adminListers struct {
	anps  policylisters.AdminNetworkPolicyLister
	banps policylisters.BaselineAdminNetworkPolicyLister
}

// changed asks for a new program (coalesced: one is compiled after the
// latest change) after a change of the context.
func (k *kernelVerdicts) changed() {
	k.gen.Add(1)
	k.urgent.Store(true)
	k.recompile()
	select {
	case k.hurry <- struct{}{}:
	default:
	}
}

// loadsAsked counts the changes that asked for a load, by what changed:
// a load compiles the whole cluster's policies, and which changes cost
// one is what an operator of a large cluster asks first.
var loadsAsked = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "flock_policy_verdict_loads_asked_total",
	Help: "Changes that asked for the NetworkPolicy verdicts to be compiled and loaded whole, by cause: pod (this node's, or one holding an address it judges), remote-pod:WHY (another node's pod that cannot be patched in, and why), policy, extra-ip (a pod's anycast or addresses IPs), patch-refused, other (namespaces, admin policies). Several asks coalesce into one load.",
}, []string{"cause"})

// verdictLoads and verdictPatches count what went into the kernel.
var (
	verdictLoads = promauto.NewCounter(prometheus.CounterOpts{
		Name: "flock_policy_verdict_loads_total",
		Help: "NetworkPolicy verdict programs compiled and loaded whole into the kernel.",
	})
	verdictPatches = promauto.NewCounter(prometheus.CounterOpts{
		Name: "flock_policy_verdict_patches_total",
		Help: "Patches of the NetworkPolicy verdicts in the kernel for other nodes' pods (one transaction each).",
	})
)

// ask counts a change's cause and asks for what it needs (changed or
// recompile).
func (k *kernelVerdicts) ask(cause string, f func()) {
	loadsAsked.WithLabelValues(cause).Inc()
	f()
}

// recompile asks for a new program, the context unchanged.
func (k *kernelVerdicts) recompile() {
	k.seq.Add(1)
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// podChanged asks for what a pod's change needs: nothing, most often, for
// a pod of another node (verdicts.Classify).
func (k *kernelVerdicts) podChanged(old, cur *trim.Pod) {
	if k.ips != nil {
		k.ips.update(old, cur)
	}
	if k.holders == nil {
		k.ask("pod", k.changed)
		return
	}
	k.mu.Lock()
	for _, p := range []*trim.Pod{old, cur} {
		if p == nil || p.Spec.NodeName != k.node {
			continue
		}
		if p == cur {
			k.local[p.Namespace+"/"+p.Name] = canonicalIPs(p)
		} else {
			delete(k.local, p.Namespace+"/"+p.Name)
		}
	}
	k.mu.Unlock()
	live := k.live()
	var deps *verdicts.Deps
	if d := k.deps.Load(); d != nil && d.gen == k.gen.Load() {
		deps = d.d
	}
	switch verdicts.Classify(live, deps, old, cur) {
	case verdicts.Unchanged:
		k.skipped.Add(1)
	case verdicts.Recompile:
		why := deps.Refusal(live, old, cur)
		if why == "" {
			k.markDirty(old, cur)
			return
		}
		if why == "ip-held-twice" {
			k.logHeldTwice(old, cur)
		}
		k.ask("remote-pod:"+why, k.recompile)
	default:
		k.ask("pod", k.changed)
	}
}

// markDirty asks for a patch of the entries of old's and cur's addresses
// (nil: none).
func (k *kernelVerdicts) markDirty(old, cur *trim.Pod) {
	k.mu.Lock()
	for _, p := range []*trim.Pod{old, cur} {
		if p == nil {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				k.dirty[a] = true
			}
		}
	}
	k.pseq.Add(1)
	k.mu.Unlock()
	select {
	case k.pkick <- struct{}{}:
	default:
	}
}

// logHeldTwice says which pods hold old's or cur's addresses, at most
// every heldTwiceEvery: an address two pods hold by their status (one
// reused while its last pod is still listed) costs a whole compile.
func (k *kernelVerdicts) logHeldTwice(old, cur *trim.Pod) {
	now := time.Now().UnixNano()
	last := k.heldTwiceAt.Load()
	if now-last < int64(heldTwiceEvery) || !k.heldTwiceAt.CompareAndSwap(last, now) {
		return
	}
	for _, p := range []*trim.Pod{old, cur} {
		if p == nil {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			var hs []string
			for _, h := range k.holders(ip.IP) {
				hs = append(hs, h.Namespace+"/"+h.Name+" ("+string(h.Status.Phase)+", on "+h.Spec.NodeName+")")
			}
			if len(hs) > 1 {
				k.log.Info("an address several pods hold by their status: compiled, not patched", "ip", ip.IP, "pods", hs)
			}
		}
	}
}

const heldTwiceEvery = 10 * time.Second

// takeDirty takes the addresses to patch, and the count of changes they
// are for.
func (k *kernelVerdicts) takeDirty() (map[netip.Addr]bool, uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	dirty := k.dirty
	k.dirty = map[netip.Addr]bool{}
	return dirty, k.pseq.Load()
}

// live is what Classify and Dispatch read of the cluster now.
func (k *kernelVerdicts) live() verdicts.Live {
	live := verdicts.Live{Node: k.node, Holders: k.holders, Local: k.isLocal, Pod: k.pod}
	if k.extra != nil {
		live.ExtraPodIPs, live.PodsForIP = k.extra.ExtraPodIPs, k.extra.PodsForIP
	}
	return live
}

// errNeedsLoad: the dirty entries need a compile (verdicts.Dispatch).
var errNeedsLoad = errors.New("the changes need a compile")

// patch patches the dirty addresses' entries into the program in the
// kernel; an error asks for a load, which covers them.
func (k *kernelVerdicts) patch() error {
	dirty, upto := k.takeDirty()
	if len(dirty) == 0 {
		k.pdone.Store(max(k.pdone.Load(), upto))
		return nil
	}
	d, prog := k.deps.Load(), k.last.Load()
	if d == nil || d.gen != k.gen.Load() || prog == nil || k.loadedAt == nil {
		return errNeedsLoad // the context changed: a load is on its way
	}
	if k.fail != nil {
		if err := k.fail(); err != nil {
			return err
		}
	}
	live := k.live()
	es := make(map[netip.Addr]verdicts.Entry, len(dirty))
	for a := range dirty {
		e, ok := d.d.Dispatch(live, prog, k.loadedGroups, a)
		if !ok {
			return errNeedsLoad
		}
		es[a] = e
	}
	ch, ok := prog.Change(es)
	if !ok {
		return errNeedsLoad
	}
	conn, err := k.nft()
	if err != nil {
		return err
	}
	if err := verdicts.Patch(conn, Table, k.loadedAt, prog, ch); err != nil {
		k.hangUp()
		return err
	}
	prog.Apply(ch) // Run's alone (tests read it once pdone says it is current)
	k.pdone.Store(max(k.pdone.Load(), upto))
	k.patches.Add(1)
	verdictPatches.Inc()
	return nil
}

// extraChanged asks for what a change of the extra IPs' holders needs: a
// new program, and a new context only if this node judges one of the ips
// or one of the pods whose extra IPs changed is this node's
// (verdicts.ClassifyExtra). Anycast pods elsewhere come and go with their
// workloads' churn: a replica among others alike changes nothing; other
// changes wait at the pace of other nodes' pods.
func (k *kernelVerdicts) extraChanged(ips, pods []string) {
	local := false
	k.mu.Lock()
	for _, key := range pods {
		if _, ok := k.local[key]; ok {
			local = true
		}
	}
	k.mu.Unlock()
	for _, key := range pods {
		if p := k.pod(key); p != nil && p.Spec.NodeName == k.node {
			local = true
		}
	}
	k.judgeExtra(ips, local)
}

// judgeExtra asks for what a change of the holders of ips needs. Unchanged
// is said of the holders the stored Deps were compiled with; while a load
// is asked for or under way, whose Deps replace these and may have listed
// other holders, the ips wait in recheck and are judged again against its
// Deps once it stores them (stored). Asking for another load instead kept
// loads coming back to back under an anycast workload's churn.
func (k *kernelVerdicts) judgeExtra(ips []string, local bool) {
	k.rmu.Lock()
	var deps *verdicts.Deps
	if d := k.deps.Load(); d != nil && d.gen == k.gen.Load() {
		deps = d.d
	}
	eff := verdicts.ClassifyExtra(k.live(), deps, ips, local)
	if eff == verdicts.Unchanged && k.done.Load() < k.seq.Load() {
		for _, ip := range ips {
			k.recheck[ip] = true
		}
		k.rmu.Unlock()
		return
	}
	k.rmu.Unlock()
	switch eff {
	case verdicts.Unchanged:
		k.skipped.Add(1)
	case verdicts.Recompile:
		k.ask("extra-ip", k.recompile)
	default:
		k.ask("extra-ip", k.changed)
	}
}

// stored makes prog, compiled with deps for the context gen from the
// changes up to seq, the kernel's, and judges again the holder changes
// that waited for it (judgeExtra).
func (k *kernelVerdicts) stored(prog *verdicts.Program, deps *verdicts.Deps, gen, seq uint64) {
	k.last.Store(prog)
	k.rmu.Lock()
	k.deps.Store(&depsAt{deps, gen})
	k.done.Store(seq)
	again := slices.Sorted(maps.Keys(k.recheck))
	clear(k.recheck)
	k.rmu.Unlock()
	if len(again) > 0 {
		k.judgeExtra(again, false)
	}
}

// pod is the cached pod of key ("namespace/name"), nil if none.
func (k *kernelVerdicts) pod(key string) *trim.Pod {
	ns, name, _ := strings.Cut(key, "/")
	p, err := k.pods.Pods(ns).Get(name)
	if err != nil {
		return nil
	}
	return p
}

// policyChanged asks for what a NetworkPolicy's update needs: nothing
// when no packet this node judges has another verdict under it
// (verdicts.ClassifyPolicy: a peer that matches none of this node's
// judged pods, in a policy of other nodes' pods), else a new program.
func (k *kernelVerdicts) policyChanged(old, cur *networkingv1.NetworkPolicy) {
	if old.ResourceVersion != "" && old.ResourceVersion == cur.ResourceVersion {
		k.policySkipped.Add(1) // a relist's: the same object
		return
	}
	var deps *verdicts.Deps
	if d := k.deps.Load(); d != nil && d.gen == k.gen.Load() {
		deps = d.d
	}
	if verdicts.ClassifyPolicy(deps, old, cur) == verdicts.Unchanged {
		k.policySkipped.Add(1)
		return
	}
	k.ask("policy", k.changed)
}

func (k *kernelVerdicts) isLocal(ip string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, ips := range k.local {
		if slices.Contains(ips, ip) {
			return true
		}
	}
	return false
}

// canonicalIPs: as the compile keys them (Classify asks with canonical strings).
func canonicalIPs(p *trim.Pod) []string {
	out := podIPStrings(p)
	for i, s := range out {
		if a, err := netip.ParseAddr(s); err == nil {
			out[i] = a.String()
		}
	}
	return out
}

func podIPStrings(p *trim.Pod) []string {
	out := make([]string, len(p.Status.PodIPs))
	for i, ip := range p.Status.PodIPs {
		out[i] = ip.IP
	}
	return out
}

// primeLocal records this node's pods from the cache (a handler added
// after they were delivered has not seen them).
func (k *kernelVerdicts) primeLocal() {
	k.mu.Lock() // before the List: a handler after it records a newer state
	defer k.mu.Unlock()
	pods, _ := k.pods.List(labels.Everything()) // a cache's: no error
	for _, p := range pods {
		if p.Spec.NodeName == k.node {
			k.local[p.Namespace+"/"+p.Name] = canonicalIPs(p)
		}
	}
}

// handler is added to the informers the program depends on. An update
// that changes nothing the compiler reads (trim.Unchanged: a pod's status
// conditions, a relist) compiles nothing; nor does a change of a pod of
// another node that no policy of this node's program reads, nor an update
// of a NetworkPolicy that judges no packet of this node otherwise.
func (k *kernelVerdicts) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { k.event(nil, obj) },
		UpdateFunc: func(old, cur any) {
			if !trim.Unchanged(old, cur) {
				k.event(old, cur)
			} else if op, ok := old.(*trim.Pod); ok && k.ips != nil {
				k.ips.update(op, cur.(*trim.Pod)) // the object the cache holds now
			}
		},
		DeleteFunc: func(obj any) { k.event(obj, nil) },
	}
}

func (k *kernelVerdicts) event(old, cur any) {
	if t, ok := old.(cache.DeletedFinalStateUnknown); ok && cur == nil {
		// A delete the informer saw late: its pod leaves the local ones.
		if p, ok := t.Obj.(*trim.Pod); ok && k.ips != nil {
			k.ips.update(p, nil)
		}
		if p, ok := t.Obj.(*trim.Pod); ok && p.Spec.NodeName == k.node {
			k.mu.Lock()
			delete(k.local, p.Namespace+"/"+p.Name)
			k.mu.Unlock()
		}
		cause := "other"
		if _, ok := t.Obj.(*trim.Pod); ok {
			cause = "pod"
		}
		k.ask(cause, k.changed)
		return
	}
	if op, ok := old.(*networkingv1.NetworkPolicy); ok {
		if cp, ok := cur.(*networkingv1.NetworkPolicy); ok {
			k.policyChanged(op, cp)
			return
		}
	}
	op, okOld := old.(*trim.Pod)
	cp, okCur := cur.(*trim.Pod)
	if (okOld || old == nil) && (okCur || cur == nil) && (op != nil || cp != nil) {
		k.podChanged(op, cp)
		return
	}
	k.ask("other", k.changed) // not a pod (or a tombstone of one)
}

// input is what the informers hold now.
func (k *kernelVerdicts) input() (verdicts.Input, error) {
	in := verdicts.Input{Node: k.node}
	var err error
	if in.Pods, err = k.pods.List(labels.Everything()); err != nil {
		return in, err
	}
	if in.Namespaces, err = k.namespaces.List(labels.Everything()); err != nil {
		return in, err
	}
	if in.Policies, err = k.policies.List(labels.Everything()); err != nil {
		return in, err
	}
	if k.extra != nil {
		in.ExtraPodIPs, in.PodsForIP = k.extra.ExtraPodIPs, k.extra.PodsForIP
	}
	if k.admin != nil {
		in.Admin = true
		if k.admin.anps != nil {
			anps, err := k.admin.anps.List(labels.Everything())
			if err != nil {
				return in, err
			}
			for _, a := range anps {
				in.AdminSubjects = append(in.AdminSubjects, a.Spec.Subject)
			}
		}
		if k.admin.banps != nil {
			banps, err := k.admin.banps.List(labels.Everything())
			if err != nil {
				return in, err
			}
			for _, b := range banps {
				in.AdminSubjects = append(in.AdminSubjects, b.Spec.Subject)
			}
		}
	}
	return in, nil
}

// Run loads a program after the caches synced and after each change,
// until ctx ends; a failed load is retried (the kernel keeps the last
// program meanwhile).
func (k *kernelVerdicts) Run(ctx context.Context) error {
	checks := k.synced
	if k.extra != nil {
		checks = append(slices.Clip(checks), kubeclient.Synced{Name: "the extra pod IPs' first answer", Synced: k.extra.HasSynced})
	}
	if !kubeclient.WaitLogged(ctx, k.log, "NetworkPolicy verdicts", kubeclient.SyncWarnAfter, checks...) {
		return ctx.Err()
	}
	k.primeLocal()
	defer k.hangUp()
	backoff := 100 * time.Millisecond
	var lastPatch time.Time
	var patchTook time.Duration
	for {
		start := time.Now()
		k.urgent.Store(false) // this load reads every change so far
		if err := k.load(); err != nil {
			k.failed.Store(&err)
			k.log.Error("NetworkPolicy verdicts not loaded into the kernel (the previous ones stay)", "table", Table, "err", err, "retry", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 10*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		took := time.Since(start)
		// Patches of other nodes' pods' entries go in while no load is
		// asked for (a load covers them), PatchEvery at most: a
		// transaction for a batch of a churn's changes, not for each.
		var patchAt <-chan time.Time
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-k.kick:
				if k.done.Load() >= k.seq.Load() {
					continue // the last load read that change
				}
				break wait
			case <-k.pkick:
				if patchAt == nil {
					patchAt = time.After(max(0, patchPace(patchTook, k.patchEvery, k.remoteLag)-time.Since(lastPatch)))
				}
			case <-patchAt:
				patchAt = nil
				if k.done.Load() < k.seq.Load() {
					continue // a load is asked for: its kick is there
				}
				lastPatch = time.Now()
				err := k.patch()
				patchTook = time.Since(lastPatch)
				if err != nil {
					if !errors.Is(err, errNeedsLoad) {
						k.log.Warn("NetworkPolicy verdicts not patched; loading them whole", "table", Table, "err", err)
					}
					k.ask("patch-refused", k.recompile)
				}
			}
		}
		// Each load compiles the whole cluster's policies: under a stream
		// of changes (pods churning across a large cluster) the next one
		// is paced. A change after a quiet spell loads at once.
		for {
			wait := pace(k.urgent.Load(), took, time.Since(start)-took, k.remoteLag)
			if wait <= 0 {
				break
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			case <-k.hurry: // paced shorter now
			}
		}
	}
}

// nft is Run's nftables connection, dialled if there is none: one socket
// for every transaction, whose setup and teardown (in another namespace,
// a thread's too) took a patch about 6 ms.
func (k *kernelVerdicts) nft() (*nftables.Conn, error) {
	if k.conn == nil {
		c, err := verdicts.NewConn(k.netns, nftables.AsLasting())
		if err != nil {
			return nil, fmt.Errorf("nftables: %w", err)
		}
		k.conn = c
		k.dials.Add(1)
	}
	return k.conn, nil
}

// hangUp closes Run's nftables connection: when Run ends, and after an
// operation on it failed (what was queued before the failure, a
// serialization error, or a reply not read would go with the next
// transaction).
func (k *kernelVerdicts) hangUp() {
	if k.conn != nil {
		_ = k.conn.CloseLasting()
		k.conn = nil
	}
}

func (k *kernelVerdicts) load() error {
	start := time.Now()
	seq := k.seq.Load()
	gen := k.gen.Load() // before the objects are listed: the Deps hold for it
	// The dirty entries' changes are in the objects listed below.
	_, pseq := k.takeDirty()
	if k.fail != nil {
		if err := k.fail(); err != nil {
			return err
		}
	}
	in, err := k.input()
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	prog, deps := verdicts.CompileDeps(in)
	conn, err := k.nft()
	if err != nil {
		return err
	}
	at, err := verdicts.LoadGen(conn, Table, k.hook, prog)
	if err != nil {
		k.hangUp()
		return err
	}
	k.loadedAt, k.loadedGroups = at, prog.GroupIndex()
	k.stored(prog, deps, gen, seq)
	k.pdone.Store(max(k.pdone.Load(), pseq))
	verdictLoads.Inc()
	k.failed.Store(nil)
	select {
	case <-k.loaded:
	default:
		close(k.loaded)
		// The first lists' garbage (every pod of the cluster, whole, as
		// decoded) is given back to the system now, not over minutes.
		debug.FreeOSMemory()
		k.log.Info("NetworkPolicy verdicts in the kernel", "table", Table, "judged", len(prog.Selected), "groups", len(prog.Groups), "queued", len(prog.Queued), "took", time.Since(start).Round(time.Microsecond))
	}
	k.log.Debug("NetworkPolicy verdicts loaded", "seq", seq, "judged", len(prog.Selected), "groups", len(prog.Groups), "queued", len(prog.Queued), "took", time.Since(start),
		"podChangesSkipped", k.skipped.Load(), "policyChangesSkipped", k.policySkipped.Load())
	return nil
}

// status is nil while the kernel holds the verdicts of the latest
// change it loaded without error.
func (k *kernelVerdicts) status() error {
	select {
	case <-k.loaded:
	default:
		return fmt.Errorf("NetworkPolicy verdicts not in the kernel yet (table inet %s)", Table)
	}
	if e := k.failed.Load(); e != nil {
		return fmt.Errorf("the latest NetworkPolicy verdicts are not in the kernel (the previous ones decide): %w", *e)
	}
	return nil
}

// Verdicts says whether this node's kernel holds the policies' current
// verdicts: Run attaches it. Its zero value and nil are ready.
type Verdicts struct {
	kv atomic.Pointer[kernelVerdicts]
}

// WaitLoaded waits until a Run is attached and its first verdicts are in
// the kernel (true), or ctx ends (false).
// A nil Verdicts is loaded, as it is ready (Err). It follows the Run
// attached now: one that ends before its first load is not waited for.
func (v *Verdicts) WaitLoaded(ctx context.Context) bool {
	if v == nil {
		return true
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var loaded <-chan struct{} // nil: none attached, wait for the tick
		if k := v.kv.Load(); k != nil {
			loaded = k.loaded
		}
		select {
		case <-loaded:
			return true
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
}

// Err is nil while the kernel holds the verdicts of the latest change,
// or while no Run is attached; else it says what is missing.
func (v *Verdicts) Err() error {
	if v == nil {
		return nil
	}
	if k := v.kv.Load(); k != nil {
		return k.status()
	}
	return nil
}
