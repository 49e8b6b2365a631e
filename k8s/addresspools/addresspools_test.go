package addresspools

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func pool(name string, claims int64, cidrs []any, use []any, namespaces []any) *unstructured.Unstructured {
	spec := map[string]any{"cidrs": cidrs, "use": use}
	if namespaces != nil {
		spec["namespaces"] = namespaces
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flock.fritzlab.net/v1alpha1",
		"kind":       "AddressPool",
		"metadata":   map[string]any{"name": name, "resourceVersion": "1"},
		"spec":       spec,
	}}
	if claims != 0 {
		u.Object["status"] = map[string]any{"claims": claims}
	}
	return u
}

func namespace(name string, lbls map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
}

func fakeDyn(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{GVR: v1alpha1.AddressPoolKind + "List"}, objs...)
}

// run runs w's informers until the test ends (the factory's job in the
// agent), waits for them to sync, for their first lists to reach the
// handlers and for them to watch (the fakes drop events between their
// list and their watch).
func run(t *testing.T, w *Watcher, dyn, cs testutil.Recorder) {
	t.Helper()
	testutil.RunInformer(t, w.pools)
	testutil.RunInformer(t, w.namespaces)
	for _, r := range w.handlers {
		testutil.WaitFor(t, "the first lists reached the handlers", r.HasSynced)
	}
	testutil.WaitWatching(t, dyn, GVR.Resource)
	testutil.WaitWatching(t, cs, "namespaces")
}

func TestPoolsAndNamespaceLabels(t *testing.T) {
	sel := pool("b-selected", 4, []any{"2001:db8:200::/112"}, []any{"pod", "addresses"}, nil)
	sel.Object["spec"].(map[string]any)["namespaceSelector"] = map[string]any{"matchLabels": map[string]any{"tenant": "b"}}
	broken := pool("c-broken", 0, []any{"2001:db8:300::/112"}, []any{"pod"}, nil)
	broken.Object["spec"].(map[string]any)["use"] = "pod" // a string, not a list
	dyn := fakeDyn(sel, broken, pool("a-anycast", 0, []any{"192.0.2.0/24", "2001:db8:a::/64"}, []any{"anycast"}, []any{"tenant-a"}))
	cs := fake.NewClientset(namespace("tenant-a", map[string]string{"tenant": "a"}), namespace("bare", nil))
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)

	got := w.Pools()
	if len(got) != 2 || got[0].Name != "a-anycast" || got[1].Name != "b-selected" {
		t.Fatalf("Pools() = %+v, want a-anycast and b-selected (c-broken skipped)", got)
	}
	a, b := got[0], got[1]
	if strings.Join(a.Spec.CIDRs, ",") != "192.0.2.0/24,2001:db8:a::/64" || strings.Join(a.Spec.Use, ",") != "anycast" ||
		strings.Join(a.Spec.Namespaces, ",") != "tenant-a" || a.Spec.NamespaceSelector != nil {
		t.Fatalf("a-anycast = %+v", a.Spec)
	}
	if b.Spec.NamespaceSelector == nil || b.Spec.NamespaceSelector.MatchLabels["tenant"] != "b" || b.Status.Claims != 4 {
		t.Fatalf("b-selected = %+v %+v", b.Spec, b.Status)
	}
	// Logged once, not on every call.
	_ = w.Pools()
	if len(w.logged) != 1 || w.logged["c-broken"] != "1" {
		t.Fatalf("logged = %v", w.logged)
	}

	if l := w.NamespaceLabels("tenant-a"); l == nil || l["tenant"] != "a" {
		t.Fatalf("NamespaceLabels(tenant-a) = %v", l)
	}
	if l := w.NamespaceLabels("bare"); l == nil || len(l) != 0 {
		t.Fatalf("NamespaceLabels(bare) = %#v, want an empty set", l)
	}
	if l := w.NamespaceLabels("nowhere"); l != nil {
		t.Fatalf("NamespaceLabels(nowhere) = %v, want nil", l)
	}
	// A copy: the caller cannot change the cache.
	w.NamespaceLabels("tenant-a")["tenant"] = "x"
	if w.NamespaceLabels("tenant-a")["tenant"] != "a" {
		t.Fatal("NamespaceLabels returned the cache's map")
	}
}

func TestChanged(t *testing.T) {
	ctx := context.Background()
	dyn := fakeDyn(pool("p1", 0, []any{"2001:db8:100::/112"}, []any{"pod"}, []any{"tenant-a"}))
	cs := fake.NewClientset(namespace("tenant-a", map[string]string{"tenant": "a"}))
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)
	calls := w.Changed()
	expect := func(what string) {
		t.Helper()
		select {
		case <-calls:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no change signalled", what)
		}
	}
	none := func(what string) {
		t.Helper()
		select {
		case <-calls:
			t.Fatalf("%s: a change signalled", what)
		case <-time.After(200 * time.Millisecond):
		}
	}
	expect("the first lists")
	none("nothing changed")

	pools := dyn.Resource(GVR)
	if _, err := pools.Create(ctx, pool("p2", 0, []any{"198.51.100.0/24"}, []any{"addresses"}, []any{"tenant-a"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("pool added")

	p2, err := pools.Get(ctx, "p2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p2.Object["status"] = map[string]any{"claims": int64(3)}
	if _, err := pools.UpdateStatus(ctx, p2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	none("status written")

	p2.Object["spec"].(map[string]any)["namespaces"] = []any{"tenant-a", "tenant-b"}
	if _, err := pools.Update(ctx, p2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("pool spec changed")

	nsc := cs.CoreV1().Namespaces()
	ns, err := nsc.Get(ctx, "tenant-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Annotations = map[string]string{"note": "x"}
	if ns, err = nsc.Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	none("namespace annotation changed")

	ns.Labels["tenant"] = "b"
	if _, err := nsc.Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("namespace label changed")
	testutil.WaitFor(t, "the label reaches the cache", func() bool { return w.NamespaceLabels("tenant-a")["tenant"] == "b" })

	if _, err := nsc.Create(ctx, namespace("tenant-b", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("namespace added")

	if err := pools.Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("pool deleted")
	testutil.WaitFor(t, "the delete reaches the cache", func() bool { return len(w.Pools()) == 1 })
	none("settled")
}

// Changes nobody has read yet leave one signal, not one each.
func TestChangedCoalesces(t *testing.T) {
	ctx := context.Background()
	dyn := fakeDyn()
	cs := fake.NewClientset()
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)
	select {
	case <-w.Changed(): // the (empty) first lists, if they signalled
	default:
	}
	for _, name := range []string{"p1", "p2", "p3", "p4", "p5"} {
		if _, err := dyn.Resource(GVR).Create(ctx, pool(name, 0, []any{"2001:db8::/64"}, []any{"pod"}, []any{"x"}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "the cache has the pools", func() bool { return len(w.Pools()) == 5 })
	for _, r := range w.handlers {
		testutil.WaitFor(t, "the handlers saw them", r.HasSynced)
	}
	testutil.WaitFor(t, "a change signalled", func() bool { return len(w.changed) == 1 })
	<-w.Changed()
	select {
	case <-w.Changed():
		t.Fatal("five changes signalled twice")
	default:
	}
}

func statusWrites(dyn *dynfake.FakeDynamicClient) []string {
	var out []string
	for _, a := range dyn.Actions() {
		if a.GetVerb() == "update" && a.GetSubresource() == "status" {
			u := a.(clienttesting.UpdateAction).GetObject().(*unstructured.Unstructured)
			out = append(out, u.GetName())
		}
	}
	return out
}

func claimsIn(t *testing.T, dyn *dynfake.FakeDynamicClient, name string) int64 {
	t.Helper()
	obj, err := dyn.Tracker().Get(GVR, "", name)
	if err != nil {
		t.Fatal(err)
	}
	return claimsOf(obj.(*unstructured.Unstructured))
}

func TestUpdateClaims(t *testing.T) {
	ctx := context.Background()
	dyn := fakeDyn(
		pool("a", 0, []any{"2001:db8:a::/112"}, []any{"pod"}, []any{"x"}),
		pool("b", 3, []any{"2001:db8:b::/112"}, []any{"pod"}, []any{"x"}),
		pool("c", 2, []any{"2001:db8:c::/112"}, []any{"pod"}, []any{"x"}),
	)
	cs := fake.NewClientset()
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)

	// A count for a pool the cache does not know is ignored.
	counts := map[string]int{"a": 2, "b": 3, "gone": 7}
	if err := w.UpdateClaims(ctx, counts); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statusWrites(dyn), ","); got != "a,c" {
		t.Fatalf("status writes %s, want a,c (b already shows 3)", got)
	}
	for name, want := range map[string]int64{"a": 2, "b": 3, "c": 0} {
		if got := claimsIn(t, dyn, name); got != want {
			t.Errorf("%s: status.claims %d, want %d", name, got, want)
		}
	}
	obj, _ := dyn.Tracker().Get(GVR, "", "c")
	if _, ok, _ := unstructured.NestedFieldNoCopy(obj.(*unstructured.Unstructured).Object, "status", "claims"); ok {
		t.Error("c: status.claims 0 is written, want it omitted")
	}
	testutil.WaitFor(t, "the cache shows the counts", func() bool {
		p := w.Pools()
		return len(p) == 3 && p[0].Status.Claims == 2 && p[2].Status.Claims == 0
	})
	dyn.ClearActions()
	if err := w.UpdateClaims(ctx, counts); err != nil {
		t.Fatal(err)
	}
	if got := statusWrites(dyn); len(got) != 0 {
		t.Fatalf("status writes %v with nothing to change", got)
	}
}

func TestUpdateClaimsConflict(t *testing.T) {
	ctx := context.Background()
	conflict := apierrors.NewConflict(GVR.GroupResource(), "a", errors.New("the object has been modified"))
	for name, tc := range map[string]struct {
		conflicts int
		// other agent's write, as it happened before our retry's get
		other      int64
		wantWrites int
		wantErr    bool
		want       int64
	}{
		"retry succeeds":               {conflicts: 1, other: 1, wantWrites: 2, want: 5},
		"another agent wrote the same": {conflicts: 1, other: 5, wantWrites: 1, want: 5},
		"conflict twice":               {conflicts: 2, other: 1, wantWrites: 2, wantErr: true, want: 1},
	} {
		t.Run(name, func(t *testing.T) {
			dyn := fakeDyn(pool("a", 0, []any{"2001:db8:a::/112"}, []any{"pod"}, []any{"x"}))
			cs := fake.NewClientset()
			w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
			run(t, w, dyn, cs)
			left := tc.conflicts
			dyn.PrependReactor("update", GVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "status" || left == 0 {
					return false, nil, nil
				}
				if left == tc.conflicts { // the other agent's write that made ours conflict
					obj, err := dyn.Tracker().Get(GVR, "", "a")
					if err != nil {
						return true, nil, err
					}
					u := obj.(*unstructured.Unstructured).DeepCopy()
					u.Object["status"] = map[string]any{"claims": tc.other}
					if err := dyn.Tracker().Update(GVR, u, ""); err != nil {
						return true, nil, err
					}
				}
				left--
				return true, nil, conflict
			})
			err := w.UpdateClaims(ctx, map[string]int{"a": 5})
			if tc.wantErr {
				if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), "AddressPool a") {
					t.Fatalf("UpdateClaims: %v, want a Conflict naming AddressPool a", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got := len(statusWrites(dyn)); got != tc.wantWrites {
				t.Fatalf("%d status writes, want %d", got, tc.wantWrites)
			}
			if got := claimsIn(t, dyn, "a"); got != tc.want {
				t.Fatalf("status.claims %d, want %d", got, tc.want)
			}
		})
	}
}

// fakeNamespaces is the fake's Namespace client, saying what the fake
// clientset says: it cannot stream a list through a watch (WatchList).
type fakeNamespaces struct{ Namespaces }

func (fakeNamespaces) IsWatchListSemanticsUnSupported() bool { return true }
