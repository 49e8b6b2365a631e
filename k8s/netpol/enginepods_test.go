package netpol

import (
	"context"
	"errors"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// enginePodsFixture is the pods the engine-form informer is tested on:
// what flock-policy reads (labels, node, hostNetwork, container ports,
// phase, pod IPs, UID) and what it does not (annotations nobody reads,
// images, volumes, conditions, containers without ports).
func enginePodsFixture() []*corev1.Pod {
	web := bulkyPod("a", "web")
	web.UID = "uid-web"
	web.Status.PodIPs = []corev1.PodIP{{IP: "fd00:10::1"}, {IP: "198.51.100.1"}}

	db := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "db", UID: "uid-db",
		Labels: map[string]string{"app": "db", "tier": "data"}, Annotations: map[string]string{"note": "not read"}}}
	db.Spec.NodeName = "node-b"
	db.Spec.Containers = []corev1.Container{
		{Name: "init-like", Image: "busybox"},
		{Name: "pg", Image: "postgres:16", Ports: []corev1.ContainerPort{
			{Name: "pg", ContainerPort: 5432, Protocol: corev1.ProtocolTCP, HostPort: 15432},
			{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}},
	}
	db.Status.Phase = corev1.PodPending
	db.Status.PodIPs = []corev1.PodIP{{IP: "fd00:10::2"}}

	host := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "host", UID: "uid-host", Labels: map[string]string{"app": "web"}}}
	host.Spec.NodeName = "node-a"
	host.Spec.HostNetwork = true
	host.Status.Phase = corev1.PodRunning
	host.Status.PodIPs = []corev1.PodIP{{IP: "192.0.2.10"}}
	return []*corev1.Pod{web, db, host}
}

// containerPort is a port as flock-policy reads it: its container's name,
// and its own name, number and protocol.
type containerPort struct {
	container, name string
	port            int32
	proto           corev1.Protocol
}

func portsOf(p *corev1.Pod) []containerPort {
	var out []containerPort
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			out = append(out, containerPort{c.Name, cp.Name, cp.ContainerPort, cp.Protocol})
		}
	}
	return out
}

// checkKept fails t unless got (a pod as the engine is given it) has
// what flock-policy keeps of want (the pod as the API holds it), and
// none of what it does not.
func checkKept(t *testing.T, what string, got any, want *corev1.Pod) {
	t.Helper()
	p, ok := got.(*corev1.Pod)
	if !ok {
		t.Errorf("%s: a %T, want a *corev1.Pod", what, got)
		return
	}
	if p == nil {
		t.Errorf("%s: a nil pod, want %s/%s", what, want.Namespace, want.Name)
		return
	}
	if p.Namespace != want.Namespace || p.Name != want.Name || p.UID != want.UID {
		t.Errorf("%s: pod %s/%s (uid %q), want %s/%s (uid %q)", what, p.Namespace, p.Name, p.UID, want.Namespace, want.Name, want.UID)
	}
	if !maps.Equal(p.Labels, want.Labels) {
		t.Errorf("%s: labels %v, want %v", what, p.Labels, want.Labels)
	}
	if p.Spec.NodeName != want.Spec.NodeName || p.Spec.HostNetwork != want.Spec.HostNetwork {
		t.Errorf("%s: nodeName %q hostNetwork %v, want %q %v", what, p.Spec.NodeName, p.Spec.HostNetwork, want.Spec.NodeName, want.Spec.HostNetwork)
	}
	if got, want := portsOf(p), portsOf(want); !slices.Equal(got, want) {
		t.Errorf("%s: container ports %v, want %v", what, got, want)
	}
	if p.Status.Phase != want.Status.Phase || !slices.Equal(p.Status.PodIPs, want.Status.PodIPs) {
		t.Errorf("%s: phase %q podIPs %v, want %q %v", what, p.Status.Phase, p.Status.PodIPs, want.Status.Phase, want.Status.PodIPs)
	}
	if len(p.Spec.Volumes) > 0 || len(p.Status.Conditions) > 0 || len(p.Status.ContainerStatuses) > 0 ||
		p.ManagedFields != nil || p.OwnerReferences != nil || p.Annotations["kubectl.kubernetes.io/restartedAt"] != "" || p.Annotations["note"] != "" {
		t.Errorf("%s: kept what is not read: %+v", what, p)
	}
	for _, c := range p.Spec.Containers {
		if len(c.Ports) == 0 || c.Image != "" || c.Env != nil {
			t.Errorf("%s: container %+v: want the containers with ports, their names and ports alone", what, c)
		}
	}
}

// event is what a handler was given.
type event struct {
	op       string // add, update, delete
	old, obj any
	initial  bool
}

// recorder is a handler that records what it is given.
type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) OnAdd(obj any, initial bool) {
	r.record(event{op: "add", obj: obj, initial: initial})
}
func (r *recorder) OnUpdate(old, cur any) { r.record(event{op: "update", old: old, obj: cur}) }
func (r *recorder) OnDelete(obj any)      { r.record(event{op: "delete", obj: obj}) }

func (r *recorder) record(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// wait returns the events once there are n (it fails t after a while).
func (r *recorder) wait(t *testing.T, n int) []event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		got := slices.Clone(r.events)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the handler was given %d events, want %d: %+v", len(got), n, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// keyOf is obj's namespace/name (a tombstone's key).
func keyOf(obj any) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Key
	}
	k, _ := cache.MetaNamespaceKeyFunc(obj)
	return k
}

// startPods starts factory's informers (stopped when t ends) and waits
// for their caches.
func startPods(t *testing.T, factory informers.SharedInformerFactory) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	for inf, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", inf)
		}
	}
	return ctx
}

func podObjects(pods []*corev1.Pod) []runtime.Object {
	var out []runtime.Object
	for _, p := range pods {
		out = append(out, p.DeepCopy())
	}
	return out
}

// Through the informer newFactory builds over a fake clientset
// (copyingClient), with the engine built on it
// (its pod handlers take *corev1.Pod, and would panic on anything else):
// a handler added to the engine's form of the pod informer is given
// *corev1.Pod on the first list, on adds, updates and deletes, with what
// flock-policy keeps of the pods the API holds, while the informer's own
// cache keeps *trim.Pod.
func TestEnginePodsHandlersGetCorePods(t *testing.T) {
	orig := enginePodsFixture()
	client := copyingClient(podObjects(orig)...)
	factory := newFactory(client, nil)
	if _, err := newController(client, factory, nil, nil, nil, nil, networkpolicy.Config{NodeName: "node-a", NRIdisabled: true, NoRules: true,
		PodsByIP: enginePodsByIP(newPodsByIP().lookup)}); err != nil {
		t.Fatal(err)
	}
	inf := factory.Core().V1().Pods().Informer()
	rec := &recorder{}
	reg, err := enginePods{inf: inf}.Informer().AddEventHandler(rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx := startPods(t, factory)
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		t.Fatal("the handler's registration did not sync")
	}
	byKey := map[string]*corev1.Pod{}
	for _, p := range orig {
		byKey[p.Namespace+"/"+p.Name] = p
	}
	got := rec.wait(t, len(orig))
	seen := map[string]bool{}
	for _, e := range got {
		if e.op != "add" || !e.initial {
			t.Errorf("first list: %s (initial %v) of %s, want an initial add", e.op, e.initial, keyOf(e.obj))
		}
		k := keyOf(e.obj)
		seen[k] = true
		checkKept(t, "initial add of "+k, e.obj, byKey[k])
	}
	if len(seen) != len(orig) {
		t.Fatalf("first list: told of %v, want %d pods", slices.Collect(maps.Keys(seen)), len(orig))
	}
	for _, o := range inf.GetStore().List() {
		if _, ok := o.(*trim.Pod); !ok {
			t.Errorf("the informer's cache holds a %T, want *trim.Pod", o)
		}
	}

	// An add.
	api := bulkyPod("a", "api")
	api.UID = "uid-api"
	api.Labels = map[string]string{"app": "api"}
	api.Spec.NodeName = "node-b"
	if _, err := client.CoreV1().Pods("a").Create(ctx, api.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e := rec.wait(t, len(orig)+1)[len(orig)]
	if e.op != "add" || e.initial {
		t.Errorf("a pod created: %s (initial %v), want an add", e.op, e.initial)
	}
	checkKept(t, "add", e.obj, api)

	// An update (of what is kept: the labels and the IPs).
	web := byKey["a/web"]
	cur, err := client.CoreV1().Pods("a").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Labels = map[string]string{"app": "web", "version": "2"}
	cur.Status.PodIPs = append(cur.Status.PodIPs, corev1.PodIP{IP: "fd00:10::99"})
	if _, err := client.CoreV1().Pods("a").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e = rec.wait(t, len(orig)+2)[len(orig)+1]
	if e.op != "update" {
		t.Fatalf("a pod updated: %s, want an update", e.op)
	}
	checkKept(t, "update's old", e.old, web)
	checkKept(t, "update's new", e.obj, cur)

	// A delete.
	if err := client.CoreV1().Pods("b").Delete(ctx, "host", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e = rec.wait(t, len(orig)+3)[len(orig)+2]
	if e.op != "delete" {
		t.Fatalf("a pod deleted: %s, want a delete", e.op)
	}
	checkKept(t, "delete", e.obj, byKey["b/host"])
	if got := rec.wait(t, 0); len(got) != len(orig)+3 {
		t.Errorf("the handler was given %d events, want %d", len(got), len(orig)+3)
	}
	for _, o := range inf.GetStore().List() {
		if _, ok := o.(*trim.Pod); !ok {
			t.Errorf("the informer's cache holds a %T, want *trim.Pod", o)
		}
	}
}

// capturing is a SharedIndexInformer that keeps the handlers it is given
// (the ones enginePods wraps the engine's in).
type capturing struct {
	cache.SharedIndexInformer
	handlers []cache.ResourceEventHandler
}

func (c *capturing) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	c.handlers = append(c.handlers, h)
	return nil, nil
}

func (c *capturing) AddEventHandlerWithResyncPeriod(h cache.ResourceEventHandler, _ time.Duration) (cache.ResourceEventHandlerRegistration, error) {
	c.handlers = append(c.handlers, h)
	return nil, nil
}

func (c *capturing) AddEventHandlerWithOptions(h cache.ResourceEventHandler, _ cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	c.handlers = append(c.handlers, h)
	return nil, nil
}

// Whichever way the engine adds a handler, the informer is given a
// wrapper that hands it *corev1.Pod for the *trim.Pod the cache holds:
// in adds, updates, deletes, and in a tombstone (a delete the informer
// saw late), whose key is kept; anything else goes through as it is.
func TestEnginePodsWrappedHandlerConverts(t *testing.T) {
	orig := enginePodsFixture()
	web, db := orig[0], orig[1]
	tweb, tdb := trim.NewPod(web), trim.NewPod(db)
	c := &capturing{}
	ei := enginePods{inf: c}.Informer()
	recs := []*recorder{{}, {}, {}}
	if _, err := ei.AddEventHandler(recs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := ei.AddEventHandlerWithResyncPeriod(recs[1], time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := ei.AddEventHandlerWithOptions(recs[2], cache.HandlerOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(c.handlers) != len(recs) {
		t.Fatalf("the informer was given %d handlers, want %d", len(c.handlers), len(recs))
	}
	other := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	for i, h := range c.handlers {
		if h == cache.ResourceEventHandler(recs[i]) {
			t.Fatalf("handler %d: the informer was given the engine's handler itself", i)
		}
		h.OnAdd(tweb, true)
		h.OnAdd(tdb, false)
		h.OnUpdate(tweb, tdb)
		h.OnDelete(tdb)
		h.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/web", Obj: tweb})
		h.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/gone", Obj: other})
		h.OnDelete(other)

		got := recs[i].wait(t, 7)
		if len(got) != 7 {
			t.Fatalf("handler %d: given %d events, want 7", i, len(got))
		}
		if got[0].op != "add" || !got[0].initial || got[1].op != "add" || got[1].initial {
			t.Errorf("handler %d: adds %+v %+v, want the initial flag as given", i, got[0], got[1])
		}
		checkKept(t, "add", got[0].obj, web)
		checkKept(t, "add", got[1].obj, db)
		if got[2].op != "update" {
			t.Errorf("handler %d: %s, want an update", i, got[2].op)
		}
		checkKept(t, "update's old", got[2].old, web)
		checkKept(t, "update's new", got[2].obj, db)
		if got[3].op != "delete" {
			t.Errorf("handler %d: %s, want a delete", i, got[3].op)
		}
		checkKept(t, "delete", got[3].obj, db)
		tomb, ok := got[4].obj.(cache.DeletedFinalStateUnknown)
		if got[4].op != "delete" || !ok {
			t.Fatalf("handler %d: a tombstone's delete: %s of a %T, want a delete of a cache.DeletedFinalStateUnknown", i, got[4].op, got[4].obj)
		}
		if tomb.Key != "a/web" {
			t.Errorf("handler %d: tombstone key %q, want a/web", i, tomb.Key)
		}
		checkKept(t, "tombstone's object", tomb.Obj, web)
		if tomb, ok := got[5].obj.(cache.DeletedFinalStateUnknown); !ok || tomb.Key != "a/gone" || tomb.Obj != any(other) {
			t.Errorf("handler %d: a tombstone of another object: %+v, want it as it was", i, got[5].obj)
		}
		if got[6].obj != any(other) {
			t.Errorf("handler %d: another object: %+v, want it as it was", i, got[6].obj)
		}
	}
	// The tombstone the informer gave still holds the cached pod.
	tomb := cache.DeletedFinalStateUnknown{Key: "a/web", Obj: tweb}
	coreHandler{h: &recorder{}}.OnDelete(tomb)
	if tomb.Obj != any(tweb) {
		t.Errorf("the informer's tombstone was changed: it holds a %T", tomb.Obj)
	}
}

// The engine's lister and indexer over the informer newFactory builds
// answer *corev1.Pod with what flock-policy keeps of the API's pods;
// the indexer refuses writes and indexes; the cache is left as it was.
func TestEnginePodsListerAndIndexer(t *testing.T) {
	orig := enginePodsFixture()
	client := copyingClient(podObjects(orig)...)
	factory := newFactory(client, nil)
	inf := factory.Core().V1().Pods().Informer()
	ep := enginePods{inf: inf}
	if err := ep.Informer().AddIndexers(cache.Indexers{"ip": func(any) ([]string, error) { return nil, nil }}); !errors.Is(err, errEngineIndex) {
		t.Errorf("AddIndexers on the engine's informer: %v, want %v", err, errEngineIndex)
	}
	if err := ep.Informer().GetIndexer().AddIndexers(cache.Indexers{"ip": func(any) ([]string, error) { return nil, nil }}); !errors.Is(err, errEngineIndex) {
		t.Errorf("AddIndexers on the engine's indexer: %v, want %v", err, errEngineIndex)
	}
	if idx := inf.GetIndexer().GetIndexers(); len(idx) != 1 || idx[cache.NamespaceIndex] == nil {
		t.Errorf("the informer's indexes: %v, want the namespace's alone", slices.Collect(maps.Keys(idx)))
	}
	startPods(t, factory)
	byKey := map[string]*corev1.Pod{}
	for _, p := range orig {
		byKey[p.Namespace+"/"+p.Name] = p
	}

	// The lister.
	l := ep.Lister()
	all, err := l.List(labels.Everything())
	if err != nil || len(all) != len(orig) {
		t.Fatalf("List(everything): %d pods (%v), want %d", len(all), err, len(orig))
	}
	for _, p := range all {
		checkKept(t, "List", p, byKey[p.Namespace+"/"+p.Name])
	}
	web := labels.SelectorFromSet(labels.Set{"app": "web"})
	for _, c := range []struct {
		ns   string
		sel  labels.Selector
		want []string
	}{
		{"a", web, []string{"a/web"}},
		{"a", labels.Everything(), []string{"a/db", "a/web"}},
		{"a", labels.SelectorFromSet(labels.Set{"tier": "data"}), []string{"a/db"}},
		{"b", web, []string{"b/host"}},
		{"c", labels.Everything(), nil},
	} {
		got, err := l.Pods(c.ns).List(c.sel)
		if err != nil {
			t.Fatalf("Pods(%s).List(%s): %v", c.ns, c.sel, err)
		}
		var keys []string
		for _, p := range got {
			keys = append(keys, p.Namespace+"/"+p.Name)
			checkKept(t, "Pods("+c.ns+").List", p, byKey[p.Namespace+"/"+p.Name])
		}
		slices.Sort(keys)
		if !slices.Equal(keys, c.want) {
			t.Errorf("Pods(%s).List(%s): %v, want %v", c.ns, c.sel, keys, c.want)
		}
	}
	for k, want := range byKey {
		got, err := l.Pods(want.Namespace).Get(want.Name)
		if err != nil {
			t.Fatalf("Pods(%s).Get(%s): %v", want.Namespace, want.Name, err)
		}
		checkKept(t, "Get "+k, got, want)
	}
	if p, err := l.Pods("a").Get("gone"); err == nil || p != nil {
		t.Errorf("Get of a pod the cache does not hold: %v, %v; want an error", p, err)
	}

	// The indexer's reads, and the store's.
	for name, idx := range map[string]cache.Store{"indexer": ep.Informer().GetIndexer(), "store": ep.Informer().GetStore()} {
		for k, want := range byKey {
			got, ok, err := idx.GetByKey(k)
			if err != nil || !ok {
				t.Fatalf("%s: GetByKey(%s): %v %v", name, k, ok, err)
			}
			checkKept(t, name+" GetByKey "+k, got, want)
			got, ok, err = idx.Get(want)
			if err != nil || !ok {
				t.Fatalf("%s: Get(%s): %v %v", name, k, ok, err)
			}
			checkKept(t, name+" Get "+k, got, want)
		}
		if o, ok, err := idx.GetByKey("a/gone"); ok || err != nil || o != nil {
			t.Errorf("%s: GetByKey of a pod the cache does not hold: %v %v %v", name, o, ok, err)
		}
		objs := idx.List()
		if len(objs) != len(orig) {
			t.Errorf("%s: List: %d objects, want %d", name, len(objs), len(orig))
		}
		for _, o := range objs {
			checkKept(t, name+" List", o, byKey[keyOf(o)])
		}
		if keys := idx.ListKeys(); len(keys) != len(orig) {
			t.Errorf("%s: ListKeys: %v", name, keys)
		}
	}
	indexer := ep.Informer().GetIndexer()
	inA, err := indexer.ByIndex(cache.NamespaceIndex, "a")
	if err != nil || len(inA) != 2 {
		t.Fatalf("ByIndex(namespace, a): %d objects (%v), want 2", len(inA), err)
	}
	for _, o := range inA {
		checkKept(t, "ByIndex", o, byKey[keyOf(o)])
	}
	inB, err := indexer.Index(cache.NamespaceIndex, byKey["b/host"])
	if err != nil || len(inB) != 1 {
		t.Fatalf("Index(namespace, b/host): %d objects (%v), want 1", len(inB), err)
	}
	checkKept(t, "Index", inB[0], byKey["b/host"])

	// Writes are refused, by the indexer and the store alike, and change
	// nothing of the cache.
	before := map[string]any{}
	for _, o := range inf.GetIndexer().List() {
		before[keyOf(o)] = o
	}
	extra := byKey["a/web"].DeepCopy()
	extra.Name = "extra"
	for name, s := range map[string]cache.Store{"indexer": indexer, "store": ep.Informer().GetStore()} {
		for op, err := range map[string]error{
			"Add":             s.Add(extra),
			"Add of a trim":   s.Add(trim.NewPod(extra)),
			"Update":          s.Update(byKey["a/db"]),
			"Update of trim":  s.Update(trim.NewPod(byKey["a/db"])),
			"Delete":          s.Delete(byKey["a/web"]),
			"Delete of trim":  s.Delete(trim.NewPod(byKey["a/web"])),
			"Replace":         s.Replace(nil, "1"),
			"Replace of trim": s.Replace([]any{trim.NewPod(extra)}, "1"),
		} {
			if !errors.Is(err, errEngineWrite) {
				t.Errorf("%s: %s: %v, want %v", name, op, err, errEngineWrite)
			}
		}
	}
	after := inf.GetIndexer().List()
	if len(after) != len(before) {
		t.Errorf("after the refused writes the cache holds %d pods, want %d", len(after), len(before))
	}
	for _, o := range after {
		if before[keyOf(o)] != o {
			t.Errorf("after the refused writes the cache's %s is another object (%T)", keyOf(o), o)
		}
	}
}

// SetTransform on the engine's form of the informer changes nothing
// (and is not refused): trim's transform stays, and a pod added after
// start is cached as a *trim.Pod; the transform given is never called.
func TestEnginePodsKeepsTrimTransform(t *testing.T) {
	orig := enginePodsFixture()
	client := copyingClient(podObjects(orig[:1])...)
	factory := newFactory(client, nil)
	inf := factory.Core().V1().Pods().Informer()
	var called atomic.Int64
	if err := (enginePods{inf: inf}).Informer().SetTransform(func(o any) (any, error) {
		called.Add(1)
		return o, nil
	}); err != nil {
		t.Fatalf("SetTransform: %v, want nil (a no-op)", err)
	}
	ctx := startPods(t, factory)
	for _, p := range orig[1:] {
		if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range orig {
		key := p.Namespace + "/" + p.Name
		var o any
		deadline := time.Now().Add(10 * time.Second)
		for {
			var ok bool
			o, ok, _ = inf.GetStore().GetByKey(key)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never cached", key)
			}
			time.Sleep(5 * time.Millisecond)
		}
		tp, ok := o.(*trim.Pod)
		if !ok {
			t.Fatalf("%s is cached as a %T, want *trim.Pod (trim's transform)", key, o)
		}
		checkKept(t, "cached "+key, tp.Core(), p)
	}
	if n := called.Load(); n != 0 {
		t.Errorf("the transform given to SetTransform was called %d times", n)
	}
}

// The pods by IP and the extra IPs in the engine's form: the same pods as
// *corev1.Pod; the extra IPs of the pod of the engine's pod's namespace
// and name.
func TestEngineLookups(t *testing.T) {
	orig := enginePodsFixture()
	x := newPodsByIP()
	for _, p := range orig {
		x.update(nil, trim.NewPod(p))
	}
	lookup := enginePodsByIP(x.lookup)
	got := lookup("fd00:10::1")
	if len(got) != 1 {
		t.Fatalf("the engine's pods by IP of fd00:10::1: %d pods, want a/web", len(got))
	}
	checkKept(t, "pods by IP", got[0], orig[0])
	if got := lookup("192.0.2.10"); got != nil {
		t.Errorf("the engine's pods by IP of a hostNetwork pod's address: %v, want none", got)
	}
	if got := lookup("2001:db8::1"); got != nil {
		t.Errorf("the engine's pods by IP of an address no pod holds: %v, want nil", got)
	}

	if engineExtraPodIPs(nil) != nil {
		t.Error("engineExtraPodIPs(nil) is not nil: the engine would ask it")
	}
	var asked []types.NamespacedName
	extra := engineExtraPodIPs(func(p *trim.Pod) []string {
		asked = append(asked, types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		if p.Namespace == "a" && p.Name == "web" {
			return []string{"2001:db8:a::1"}
		}
		return nil
	})
	if got := extra(orig[0]); !reflect.DeepEqual(got, []string{"2001:db8:a::1"}) {
		t.Errorf("extra IPs of a/web: %v", got)
	}
	if got := extra(orig[1]); got != nil {
		t.Errorf("extra IPs of a/db: %v", got)
	}
	if want := []types.NamespacedName{{Namespace: "a", Name: "web"}, {Namespace: "a", Name: "db"}}; !slices.Equal(asked, want) {
		t.Errorf("asked for %v, want %v", asked, want)
	}
}

// The engine's handlers are handed this node's pods alone (in adds,
// updates, deletes and tombstones); anything that is not a pod goes
// through.
func TestEnginePodsHandsOnlyItsNodesPods(t *testing.T) {
	orig := enginePodsFixture()
	mine, other := orig[0].DeepCopy(), orig[1].DeepCopy()
	mine.Spec.NodeName, other.Spec.NodeName = "node-a", "node-b"
	tm, to := trim.NewPod(mine), trim.NewPod(other)
	c := &capturing{}
	rec := &recorder{}
	if _, err := (enginePods{inf: c, node: "node-a"}).Informer().AddEventHandler(rec); err != nil {
		t.Fatal(err)
	}
	h := c.handlers[0]
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	h.OnAdd(to, true)
	h.OnUpdate(to, to)
	h.OnDelete(to)
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/other", Obj: to})
	h.OnAdd(tm, false)
	h.OnUpdate(tm, tm)
	h.OnDelete(tm)
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: mine.Namespace + "/" + mine.Name, Obj: tm})
	h.OnDelete(ns)
	got := rec.wait(t, 5)
	if len(got) != 5 {
		t.Fatalf("handed %d events, want this node's pod's 4 and the namespace", len(got))
	}
	for _, e := range got[:4] {
		if k := keyOf(e.obj); k != mine.Namespace+"/"+mine.Name {
			t.Errorf("%s of %s handed, want only this node's pod", e.op, k)
		}
	}
	if got[4].obj != any(ns) {
		t.Errorf("the namespace's delete: %+v", got[4].obj)
	}
}

// TestEngineHandlerReadsOnlyItsNodesPods holds the engine's source to
// what enginePods relies on: its pod handler (its only one) returns at
// once, in each of its three functions, for a pod on another node. An
// engine update that changes this fails here, not in production.
func TestEngineHandlerReadsOnlyItsNodesPods(t *testing.T) {
	src, err := os.ReadFile("../../third_party/kube-network-policies/pkg/networkpolicy/controller.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	if n := strings.Count(s, "podInformer.Informer().AddEventHandler"); n != 1 {
		t.Fatalf("the engine adds %d pod handlers, want 1", n)
	}
	start := strings.Index(s, "podInformer.Informer().AddEventHandler")
	end := strings.Index(s[start:], "\n\t})\n")
	if end < 0 {
		t.Fatal("the pod handler's end not found")
	}
	handler := s[start : start+end]
	funcs := strings.Count(handler, "Func: func(")
	guards := strings.Count(handler, "if pod.Spec.NodeName != c.config.NodeName {\n\t\t\t\treturn\n\t\t\t}")
	if funcs != 3 || guards != 3 {
		t.Fatalf("the engine's pod handler has %d functions and %d returns for another node's pod, want 3 and 3:\n%s", funcs, guards, handler)
	}
	for _, f := range strings.Split(handler, "Func: func(")[1:] {
		guard := strings.Index(f, "if pod.Spec.NodeName != c.config.NodeName")
		if guard < 0 || strings.Contains(f[:guard], "c.") {
			t.Fatalf("a function of the engine's pod handler reads the controller before its node guard:\n%s", f)
		}
	}
}
