package nodeconfigs

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

func nodeConfig(name string, gen int64, asn uint32) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flock.fritzlab.net/v1alpha1",
		"kind":       "NodeConfig",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"asn": int64(asn), "routerID": "192.0.2.1"},
	}}
	u.SetGeneration(gen)
	return u
}

func fakeClient(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{GVR: "NodeConfigList"}, objs...)
}

type change struct {
	asn uint32
	gen int64
}

// Defect: OnChange was a field the daemon assigned after New, racing the
// informer that reads it. The callback is now a Run argument; the first
// list and every new generation are delivered, status-only writes and
// other nodes' NodeConfigs are not. The informer delivers in order, so
// what must not be delivered is checked by what comes next: it would come
// first.
func TestRunDeliversGenerations(t *testing.T) {
	dyn := fakeClient(nodeConfig("vm", 1, 65001), nodeConfig("other", 1, 65099))
	w := New(dyn, "vm")
	got := make(chan change, 10)
	ctx := testutil.Start(t, func(ctx context.Context) error {
		return w.Run(ctx, func(spec *v1alpha1.NodeConfigSpec, gen int64) { got <- change{spec.ASN, gen} })
	}, w.WaitSynced)
	testutil.WaitWatching(t, dyn, GVR.Resource)
	next := func(want change) {
		t.Helper()
		select {
		case c := <-got:
			if c != want {
				t.Fatalf("got %+v, want %+v", c, want)
			}
		case <-time.After(testutil.Timeout):
			t.Fatalf("no change delivered, want %+v", want)
		}
	}
	update := func(u *unstructured.Unstructured) {
		t.Helper()
		if _, err := dyn.Resource(GVR).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	next(change{65001, 1})

	// A status write (same generation), then a spec change (the API server
	// bumps generation; the fake does not): only the spec change.
	if err := w.UpdateStatus(ctx, v1alpha1.NodeConfigStatus{Peers: "0/0", ObservedGeneration: 1}); err != nil {
		t.Fatal(err)
	}
	update(nodeConfig("vm", 2, 65002))
	next(change{65002, 2})

	// Another node's NodeConfig is not ours (the fake ignores field
	// selectors): our next generation is next.
	update(nodeConfig("other", 2, 65098))
	update(nodeConfig("vm", 3, 65003))
	next(change{65003, 3})
	select {
	case c := <-got:
		t.Fatalf("unexpected change %+v", c)
	default:
	}

	if err := w.Run(ctx, func(*v1alpha1.NodeConfigSpec, int64) {}); err == nil {
		t.Error("second Run: want an error")
	}
}

func TestWaitAndUpdateStatus(t *testing.T) {
	dyn := fakeClient(nodeConfig("vm", 3, 65001))
	w := New(dyn, "vm")
	ctx := context.Background()
	spec, gen, err := w.Wait(ctx, time.Second)
	if err != nil || spec.ASN != 65001 || gen != 3 {
		t.Fatalf("Wait: %+v %d %v", spec, gen, err)
	}
	if err := w.UpdateStatus(ctx, v1alpha1.NodeConfigStatus{Peers: "1/2", ObservedGeneration: 3}); err != nil {
		t.Fatal(err)
	}
	u, err := dyn.Resource(GVR).Get(ctx, "vm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p, _, _ := unstructured.NestedString(u.Object, "status", "peers"); p != "1/2" {
		t.Errorf("status.peers = %q", p)
	}
	if _, _, err := New(dyn, "missing").Wait(ctx, 0); err == nil {
		t.Error("Wait for a missing NodeConfig: want an error")
	}
}
