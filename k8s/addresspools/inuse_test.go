package addresspools

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

func inUseEntry(node, ip string) v1alpha1.NodeInUse {
	return v1alpha1.NodeInUse{Node: node, Count: 1, Addresses: []v1alpha1.InUseAddress{{IP: ip, Use: v1alpha1.UseAnycast, Pods: []string{"dns/coredns-1"}}}}
}

func withInUse(u *unstructured.Unstructured, entries ...v1alpha1.NodeInUse) *unstructured.Unstructured {
	var list []any
	for i := range entries {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&entries[i])
		if err != nil {
			panic(err)
		}
		list = append(list, m)
	}
	st, _ := u.Object["status"].(map[string]any)
	if st == nil {
		st = map[string]any{}
	}
	st["inUse"] = list
	u.Object["status"] = st
	return u
}

func inUseIn(t *testing.T, dyn *dynfake.FakeDynamicClient, name string) []string {
	t.Helper()
	obj, err := dyn.Tracker().Get(GVR, "", name)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := inUseOf(obj.(*unstructured.Unstructured))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		var ips []string
		for _, a := range e.Addresses {
			ips = append(ips, a.IP)
		}
		out = append(out, e.Node+"="+strings.Join(ips, "+"))
	}
	return out
}

// Each agent writes only its own node's entry, keeps the others', drops
// those of nodes that are gone, and writes nothing when its entry is
// already right: two agents with different views never undo each other.
func TestUpdateInUse(t *testing.T) {
	ctx := context.Background()
	dyn := fakeDyn(
		withInUse(pool("a", 3, []any{"2001:db8:ff::/124"}, []any{"pod"}, []any{"x"}), inUseEntry("gone", "2001:db8:ff::9"), inUseEntry("n2", "2001:db8:ff::2")),
		pool("b", 0, []any{"2001:db8:b::/112"}, []any{"pod"}, []any{"x"}),
	)
	cs := fake.NewClientset()
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)
	live := func(n string) bool { return n != "gone" }

	n1 := map[string]v1alpha1.NodeInUse{"a": inUseEntry("", "2001:db8:ff::1")}
	if err := w.UpdateInUse(ctx, "n1", n1, live); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statusWrites(dyn), ","); got != "a" {
		t.Fatalf("status writes %q, want a (b has nothing to change)", got)
	}
	if got := inUseIn(t, dyn, "a"); !slices.Equal(got, []string{"n1=2001:db8:ff::1", "n2=2001:db8:ff::2"}) {
		t.Fatalf("a: status.inUse %v, want n1's and n2's entries, gone's dropped", got)
	}
	if got := claimsIn(t, dyn, "a"); got != 3 {
		t.Errorf("a: status.claims %d, want it kept (3)", got)
	}
	testutil.WaitFor(t, "the cache shows n1's entry", func() bool {
		p := w.Pools()
		return len(p) == 2 && len(p[0].Status.InUse) == 2 && p[0].Status.InUse[0].Node == "n1"
	})

	// Both agents again, each with its unchanged view: nothing to write.
	dyn.ClearActions()
	if err := w.UpdateInUse(ctx, "n1", n1, live); err != nil {
		t.Fatal(err)
	}
	if err := w.UpdateInUse(ctx, "n2", map[string]v1alpha1.NodeInUse{"a": inUseEntry("", "2001:db8:ff::2")}, live); err != nil {
		t.Fatal(err)
	}
	if got := statusWrites(dyn); len(got) != 0 {
		t.Fatalf("status writes %v with nothing to change", got)
	}

	// n1's overlap is resolved: its entry goes, n2's stays.
	if err := w.UpdateInUse(ctx, "n1", nil, live); err != nil {
		t.Fatal(err)
	}
	if got := inUseIn(t, dyn, "a"); !slices.Equal(got, []string{"n2=2001:db8:ff::2"}) {
		t.Fatalf("a: status.inUse %v, want n2's entry only", got)
	}
}

// A conflict (another node wrote its entry meanwhile) is retried against
// the object as it is now: the other node's new entry survives ours.
func TestUpdateInUseConflict(t *testing.T) {
	ctx := context.Background()
	dyn := fakeDyn(pool("a", 0, []any{"2001:db8:ff::/124"}, []any{"pod"}, []any{"x"}))
	cs := fake.NewClientset()
	w := New(kubeclient.NewFactory(), dyn, fakeNamespaces{cs.CoreV1().Namespaces()}, quiet())
	run(t, w, dyn, cs)
	conflicts := 1
	dyn.PrependReactor("update", GVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" || conflicts == 0 {
			return false, nil, nil
		}
		conflicts--
		obj, err := dyn.Tracker().Get(GVR, "", "a")
		if err != nil {
			return true, nil, err
		}
		other := withInUse(obj.(*unstructured.Unstructured).DeepCopy(), inUseEntry("n2", "2001:db8:ff::2"))
		if err := dyn.Tracker().Update(GVR, other, ""); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(GVR.GroupResource(), "a", errors.New("the object has been modified"))
	})
	if err := w.UpdateInUse(ctx, "n1", map[string]v1alpha1.NodeInUse{"a": inUseEntry("", "2001:db8:ff::1")}, nil); err != nil {
		t.Fatal(err)
	}
	if got := inUseIn(t, dyn, "a"); !slices.Equal(got, []string{"n1=2001:db8:ff::1", "n2=2001:db8:ff::2"}) {
		t.Fatalf("a: status.inUse %v, want both nodes' entries", got)
	}
}
