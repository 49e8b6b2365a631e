package policyips

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynfake "k8s.io/client-go/dynamic/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

// world is the model: what the API and the agent hold, changed by many
// goroutines at once and mirrored into the fakes the tracker reads.
type world struct {
	mu      sync.Mutex
	dyn     *dynfake.FakeDynamicClient
	pods    cache.Indexer
	ns      cache.Indexer
	local   []admin.Pod // the agent's records
	agentUp bool
	// served is the last answer the agent gave the running tracker (nil:
	// none yet): what the tracker must keep covering while the agent is
	// down or waiting.
	served   []admin.Pod
	waiting  bool // down because it waits for its NodeConfig (admin.NotServing)
	handler  cache.ResourceEventHandler
	claimSeq int
}

var (
	nsNames = []string{"a", "b", "c"}
	anyIPs  = []string{"2001:db8:a::1", "2001:db8:a::2", "203.0.113.1"}
	addrIPs = []string{"2001:db8:b::1", "2001:db8:b::2", "2001:db8:b::3", "198.51.100.200"}
	nodes   = []string{node, "n2"}
)

func toUnstructured(t *testing.T, obj any, gvk schema.GroupVersionKind) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u
}

// step does one random change.
func (w *world) step(t *testing.T, r *rand.Rand) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ctx := context.Background()
	name := "p" + strconv.Itoa(r.IntN(6))
	ns := nsNames[r.IntN(len(nsNames))]
	switch op := r.IntN(8); op {
	case 0, 1: // create or replace a pod (a new incarnation)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("u%d", r.IntN(1000)))},
			Spec:   corev1.PodSpec{NodeName: nodes[r.IntN(2)], HostNetwork: r.IntN(10) == 0},
			Status: corev1.PodStatus{Phase: []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodRunning, corev1.PodSucceeded}[r.IntN(4)]}}
		if r.IntN(2) == 0 {
			p.Annotations = map[string]string{annotations.Anycast: anyIPs[r.IntN(len(anyIPs))]}
		}
		// As the informer caches it and hands it on (trim.Transform).
		tp := trim.NewPod(p)
		_ = w.pods.Add(tp)
		w.handler.OnAdd(tp, false)
	case 2: // delete a pod
		if obj, ok, _ := w.pods.GetByKey(ns + "/" + name); ok {
			_ = w.pods.Delete(obj)
			w.handler.OnDelete(obj)
		}
	case 3: // claim an `addresses` IP for a pod (possibly stale)
		if obj, ok, _ := w.pods.GetByKey(ns + "/" + name); ok {
			p := obj.(*trim.Pod)
			uid := string(p.UID)
			if r.IntN(4) == 0 {
				uid = "stale"
			}
			w.claimSeq++
			c := v1alpha1.AddressClaim{ObjectMeta: metav1.ObjectMeta{Name: "c" + strconv.Itoa(w.claimSeq)},
				Spec: v1alpha1.AddressClaimSpec{IP: addrIPs[r.IntN(len(addrIPs))], Use: v1alpha1.UseAddresses, Node: p.Spec.NodeName,
					Pod: &v1alpha1.ClaimPod{Namespace: p.Namespace, Name: p.Name, UID: uid}}}
			if _, err := w.dyn.Resource(claims.GVR).Create(ctx, toUnstructured(t, &c, v1alpha1.GroupVersion.WithKind("AddressClaim")), metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}
	case 4: // free a claim
		l, _ := w.dyn.Resource(claims.GVR).List(ctx, metav1.ListOptions{})
		if len(l.Items) > 0 {
			_ = w.dyn.Resource(claims.GVR).Delete(ctx, l.Items[r.IntN(len(l.Items))].GetName(), metav1.DeleteOptions{})
		}
	case 5: // the anycast pool allows other namespaces
		ap := v1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: "any"}, Spec: v1alpha1.AddressPoolSpec{CIDRs: []string{"2001:db8:a::/64", "203.0.113.0/24"},
			Use: []string{v1alpha1.UseAnycast}, NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"anycast": "yes"}}}}
		if r.IntN(3) == 0 {
			ap.Spec.CIDRs = []string{"2001:db8:a::/64", "not-a-cidr"} // invalid: authorizes nothing
		}
		u := toUnstructured(t, &ap, v1alpha1.GroupVersion.WithKind("AddressPool"))
		if _, err := w.dyn.Resource(addresspools.GVR).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			if _, err := w.dyn.Resource(addresspools.GVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}
	case 6: // relabel a namespace
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if r.IntN(2) == 0 {
			n.Labels = map[string]string{"anycast": "yes"}
		}
		// An informer hands the handler the object it replaced: the
		// tracker ignores updates that change nothing it reads.
		old, _, _ := w.ns.Get(n)
		_ = w.ns.Update(n)
		w.handler.OnUpdate(old, n)
	case 7: // the agent binds (or forgets) what this node's pods hold; or it goes away
		if r.IntN(5) == 0 {
			// Down: crashed (nothing answers) or restarted and waiting for
			// its NodeConfig (503 from the real admin handler).
			w.agentUp, w.waiting = !w.agentUp, r.IntN(2) == 0
			return
		}
		w.bind(r)
	}
}

// bind makes the agent's records anew: most of this node's pods bound an
// `addresses` and an anycast IP (whatever their claims and annotations
// say: the agent is the truth for what it bound). Under w.mu.
func (w *world) bind(r *rand.Rand) {
	w.local = nil
	for _, obj := range w.pods.List() {
		p := obj.(*trim.Pod)
		if p.Spec.NodeName != node || r.IntN(3) == 0 {
			continue
		}
		rec := admin.Pod{ID: pods.MetaID(&p.ObjectMeta), Phase: "committed"}
		if r.IntN(5) == 0 {
			rec.UID = "old"
		}
		rec.Addresses = []string{addrIPs[r.IntN(len(addrIPs))]}
		rec.Anycast = []string{anyIPs[r.IntN(len(anyIPs))]}
		w.local = append(w.local, rec)
	}
}

// inputs is the model's truth, as Compute takes it.
func (w *world) inputs(t *testing.T) Inputs {
	w.mu.Lock()
	defer w.mu.Unlock()
	in := Inputs{Node: node, Namespaces: map[string]labels.Set{}}
	for _, obj := range w.pods.List() {
		in.Pods = append(in.Pods, obj.(*trim.Pod))
	}
	for _, obj := range w.ns.List() {
		n := obj.(*corev1.Namespace)
		in.Namespaces[n.Name] = n.Labels
	}
	if w.agentUp {
		in.Local = slices.Clone(w.local)
		if in.Local == nil {
			in.Local = []admin.Pod{}
		}
	} else {
		in.Stale = slices.Clone(w.served)
	}
	ctx := context.Background()
	cl, _ := w.dyn.Resource(claims.GVR).List(ctx, metav1.ListOptions{})
	for _, u := range cl.Items {
		var c v1alpha1.AddressClaim
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c); err != nil {
			t.Fatal(err)
		}
		in.Claims = append(in.Claims, c)
	}
	pl, _ := w.dyn.Resource(addresspools.GVR).List(ctx, metav1.ListOptions{})
	var aps []v1alpha1.AddressPool
	for _, u := range pl.Items {
		var ap v1alpha1.AddressPool
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ap); err != nil {
			t.Fatal(err)
		}
		aps = append(aps, ap)
	}
	in.Pools = compilePools(aps)
	return in
}

// modelAgent is the agent as the admin API serves it: the model's
// records, or (waiting for its NodeConfig) NotServing.
type modelAgent struct {
	admin.Source // only Pods is asked
	w            *world
}

func (a modelAgent) Pods() []admin.Pod {
	w := a.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.served = slices.Clone(w.local)
	if w.served == nil {
		w.served = []admin.Pod{}
	}
	return w.served
}

func (a modelAgent) NotServing() error {
	a.w.mu.Lock()
	defer a.w.mu.Unlock()
	if !a.w.agentUp {
		return errors.New("waiting for NodeConfig")
	}
	return nil
}

// serveAgent answers /v1/pods from the model through the real admin
// handler; while the agent is down nothing answers, or (waiting) 503.
func (w *world) serveAgent(t *testing.T, socket string) {
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	h := admin.Handler(modelAgent{w: w})
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		up, waiting := w.agentUp, w.waiting
		w.mu.Unlock()
		if !up && !waiting {
			// Crashed: the connection dies without an answer.
			if hj, ok := rw.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					_ = c.Close()
					return
				}
			}
			http.Error(rw, "agent restarting", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(rw, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// checkInvariants holds at every quiescent point, whatever Compute does.
func checkInvariants(t *testing.T, in Inputs, o *Owners) {
	t.Helper()
	if o == nil {
		return // holds nothing
	}
	podByKey := map[string]*trim.Pod{}
	for _, p := range in.Pods {
		podByKey[p.Namespace+"/"+p.Name] = p
	}
	for ip, keys := range o.byIP {
		for _, k := range keys {
			if !slices.Contains(o.byPod[k], ip) {
				t.Fatalf("%s held by %s in one index, not the other", ip, k)
			}
			p := podByKey[k]
			if p == nil || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded {
				t.Fatalf("%s held by %s, which is gone, finished or on the host network", ip, k)
			}
			viaAgent := in.Local != nil && p.Spec.NodeName == in.Node
			ok := false
			bound := func(recs []admin.Pod) {
				for _, r := range recs {
					if r.ID.Same(pods.MetaID(&p.ObjectMeta)) && (slices.Contains(r.Addresses, ip) || slices.Contains(r.Anycast, ip)) {
						ok = true
					}
				}
			}
			if viaAgent {
				bound(in.Local)
			} else {
				if p.Spec.NodeName == in.Node {
					bound(in.Stale) // what the agent said it bound before it went away
				}
				for _, c := range in.Claims {
					ok = ok || c.Spec.IP == ip && c.Spec.Pod != nil && c.Spec.Pod.Namespace == p.Namespace && c.Spec.Pod.Name == p.Name && c.Spec.Pod.UID == string(p.UID) && c.Spec.Node == p.Spec.NodeName
				}
				if p.Status.Phase == corev1.PodRunning && p.Annotations[annotations.Anycast] == ip && in.Namespaces[p.Namespace]["anycast"] == "yes" && len(in.Pools.Pools()) > 0 {
					ok = true
				}
			}
			if !ok {
				t.Fatalf("%s held by %s without authority (via agent: %v)", ip, k, viaAgent)
			}
		}
	}
	for k, ips := range o.byPod {
		for _, ip := range ips {
			if !slices.Contains(o.byIP[ip], k) {
				t.Fatalf("%s holds %s in one index, not the other", k, ip)
			}
		}
	}
	// An agent that went away (crashed, or waiting for its NodeConfig)
	// shrinks nothing: what it last said it bound for a live pod of this
	// node stays covered.
	if in.Local == nil {
		for _, r := range in.Stale {
			p := podByKey[r.Namespace+"/"+r.Name]
			if p == nil || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
				p.Spec.NodeName != in.Node || !pods.MetaID(&p.ObjectMeta).Same(r.ID) || r.Phase == "deleting" {
				continue
			}
			for _, ip := range append(slices.Clone(r.Addresses), r.Anycast...) {
				if !slices.Contains(o.byPod[r.Namespace+"/"+r.Name], ip) {
					t.Fatalf("%s bound %s before the agent went away; no longer covered", r.Namespace+"/"+r.Name, ip)
				}
			}
		}
	}
}

// TestTrackerModel interleaves random changes of pods, claims, pools,
// namespace labels and the agent's bindings from many goroutines while
// readers ask the tracker, restarts the tracker and the agent, and checks
// at quiescent points that the tracker converged to Compute of the truth
// and that nobody holds an IP without authority. FLOCK_SEED reproduces.
func TestTrackerModel(t *testing.T) {
	seed := uint64(testutil.Seed(t))
	scheme := runtime.NewScheme()
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		claims.GVR: "AddressClaimList", addresspools.GVR: "AddressPoolList"})
	// The fake's watch replays the objects that exist when it opens, but
	// not those deleted between the informer's list and its watch (the API
	// server replays them from the list's resource version): a start waits
	// for both watches to be open before anything changes.
	var watches atomic.Int32
	dyn.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa, _ := a.(k8stesting.WatchActionImpl)
		wi, err := dyn.Tracker().Watch(a.GetResource(), a.GetNamespace(), wa.ListOptions)
		if err == nil {
			watches.Add(1)
		}
		return true, wi, err
	})
	w := &world{dyn: dyn, agentUp: true,
		pods: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		ns:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	for _, n := range nsNames {
		_ = w.ns.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	socket := filepath.Join(t.TempDir(), "admin.sock")
	w.serveAgent(t, socket)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	bindings := filepath.Join(t.TempDir(), "bindings.json")
	start := func() (*Tracker, context.CancelFunc, chan error) {
		open := watches.Load()
		tr := NewTracker(node, dyn, socket, log)
		tr.BindingsFile = bindings
		w.mu.Lock()
		w.handler = tr.Handler()
		// An informer's handler added to it is first told of every
		// object there, as an add.
		for _, obj := range w.pods.List() {
			w.handler.OnAdd(obj, true)
		}
		w.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- tr.Run(ctx, trim.NewPodLister(w.pods), corelisters.NewNamespaceLister(w.ns), nil, func(_, _ []string) {})
		}()
		for deadline := time.Now().Add(10 * time.Second); watches.Load() < open+2; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the tracker's claims and pools informers did not watch")
			}
		}
		return tr, cancel, done
	}
	tr, cancel, done := start()
	defer func() { cancel(); <-done }()

	rounds := 12
	for round := range rounds {
		var wg sync.WaitGroup
		stopRead := make(chan struct{})
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seed, uint64(round*100+g)))
				for range 40 {
					w.step(t, r)
				}
			}()
		}
		var rd sync.WaitGroup
		for range 2 {
			rd.Add(1)
			go func() {
				defer rd.Done()
				for {
					select {
					case <-stopRead:
						return
					default:
					}
					for _, ip := range append(slices.Clone(anyIPs), addrIPs...) {
						for _, k := range tr.PodsForIP(ip) {
							_ = k
						}
					}
					_ = tr.ExtraPodIPs(&trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p1"}})
				}
			}()
		}
		wg.Wait()
		close(stopRead)
		rd.Wait()
		// A restart of the tracker now and then: the new one converges too.
		if round%4 == 3 {
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			// The new tracker starts from the file the old one kept: what
			// the agent last served stays covered across the restart.
			tr, cancel, done = start()
		}
		// Quiescent: the tracker reaches Compute of the truth.
		converge := func(what string) {
			t.Helper()
			in := w.inputs(t)
			want := Compute(in)
			deadline := time.Now().Add(10 * time.Second)
			for !tr.HasSynced() || !tr.current.Load().Equal(want) {
				if time.Now().After(deadline) {
					t.Fatalf("round %d (seed %d, %s): tracker did not converge:\n got %v\nwant %v", round, seed, what, tr.current.Load().byPod, want.byPod)
				}
				time.Sleep(20 * time.Millisecond)
			}
			checkInvariants(t, in, tr.current.Load())
		}
		converge("after the changes")
		// Every other round, the agent restarts right after it bound and
		// was read: it crashes, or comes back waiting for its NodeConfig
		// (the API unreachable). What it bound must stay covered.
		if round%2 == 0 {
			r := rand.New(rand.NewPCG(seed, uint64(round*100+99)))
			w.mu.Lock()
			w.agentUp = true
			w.bind(r)
			w.mu.Unlock()
			converge("the agent bound")
			w.mu.Lock()
			w.agentUp, w.waiting = false, r.IntN(2) == 0
			w.mu.Unlock()
			converge("the agent went away")
		}
	}
}

func compilePools(aps []v1alpha1.AddressPool) *authz.Set {
	s, _ := authz.Compile(aps)
	return s
}
