package nodeconfigs

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
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

// runFactory runs f until the test ends, waits for its sync and for the
// fake to watch (the fakes drop events between list and watch).
func runFactory(t *testing.T, f *kubeclient.Factory, dyn testutil.Recorder) context.Context {
	t.Helper()
	ctx := testutil.Start(t, f.Run, f.WaitForSync)
	testutil.WaitWatching(t, dyn, GVR.Resource)
	return ctx
}

// The spec as cached, and a signal for every new generation of this
// node's NodeConfig: status-only writes and other nodes' NodeConfigs do
// not signal.
func TestChangedAndCurrent(t *testing.T) {
	dyn := fakeClient(nodeConfig("vm", 1, 65001), nodeConfig("other", 1, 65099))
	f := kubeclient.NewFactory()
	w := New(f, dyn, "vm")
	ctx := runFactory(t, f, dyn)
	current := func(want change) {
		t.Helper()
		spec, gen, err := w.Current()
		if err != nil || (change{spec.ASN, gen}) != want {
			t.Fatalf("Current: %+v %d %v, want %+v", spec, gen, err, want)
		}
	}
	expect := func(want change) {
		t.Helper()
		select {
		case <-w.Changed():
			current(want)
		case <-time.After(testutil.Timeout):
			t.Fatalf("no change signalled, want %+v", want)
		}
	}
	none := func(what string) {
		t.Helper()
		select {
		case <-w.Changed():
			t.Fatalf("%s: a change signalled", what)
		case <-time.After(200 * time.Millisecond):
		}
	}
	expect(change{65001, 1}) // the first list
	none("after the first list")

	if err := w.UpdateStatus(ctx, v1alpha1.NodeConfigStatus{Peers: "0/0", ObservedGeneration: 1}); err != nil {
		t.Fatal(err)
	}
	none("status write (same generation)")

	// Spec change: the API server bumps generation (the fake does not).
	if _, err := dyn.Resource(GVR).Update(ctx, nodeConfig("vm", 2, 65002), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(change{65002, 2})

	if _, err := dyn.Resource(GVR).Update(ctx, nodeConfig("other", 2, 65098), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	none("another node's NodeConfig")
	current(change{65002, 2})

	if _, _, err := New(kubeclient.NewFactory(), dyn, "missing").Current(); err == nil {
		t.Error("Current of a NodeConfig never listed: want an error")
	}
}

func TestWaitAndUpdateStatus(t *testing.T) {
	dyn := fakeClient(nodeConfig("vm", 3, 65001))
	w := New(kubeclient.NewFactory(), dyn, "vm")
	ctx := context.Background()
	spec, gen, err := w.Wait(ctx, WaitOptions{Timeout: time.Second})
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
	_, _, err = New(kubeclient.NewFactory(), dyn, "missing").Wait(ctx, WaitOptions{})
	if err == nil || err.Error() != `NodeConfig "missing" does not exist (waited 0s): create one for this node (see deploy/examples/nodeconfig.yaml)` {
		t.Errorf("Wait for a missing NodeConfig: %v", err)
	}
}

// NewNamed lists and watches the node's NodeConfig alone (a field
// selector on its name), with an informer of its own: New's, shared with
// All, still lists every NodeConfig.
func TestNewNamedWatchesOneNodeConfig(t *testing.T) {
	dyn := fakeClient(nodeConfig("vm", 1, 65001), nodeConfig("other", 1, 65099))
	f := kubeclient.NewFactory()
	w := NewNamed(f, dyn, "vm")
	ctx := runFactory(t, f, dyn)
	if spec, gen, err := w.Current(); err != nil || spec.ASN != 65001 || gen != 1 {
		t.Fatalf("Current: %+v %d %v", spec, gen, err)
	}
	selectors := func() map[string][]string {
		out := map[string][]string{}
		for _, a := range dyn.Actions() {
			if l, ok := a.(clienttesting.ListAction); ok && a.GetResource() == GVR {
				out[a.GetVerb()] = append(out[a.GetVerb()], l.GetListRestrictions().Fields.String())
			}
			if wa, ok := a.(clienttesting.WatchAction); ok && a.GetResource() == GVR {
				out[a.GetVerb()] = append(out[a.GetVerb()], wa.GetWatchRestrictions().Fields.String())
			}
		}
		return out
	}
	if got := fmt.Sprint(selectors()); got != "map[list:[metadata.name=vm] watch:[metadata.name=vm]]" {
		t.Errorf("NewNamed's lists and watches: %s", got)
	}
	if _, err := dyn.Resource(GVR).Update(ctx, nodeConfig("vm", 2, 65002), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the new generation", func() (bool, string) {
		_, gen, err := w.Current()
		return gen == 2, fmt.Sprint(gen, err)
	})

	// The agent's: every NodeConfig, on the factory's shared informer.
	dyn.ClearActions()
	f2 := kubeclient.NewFactory()
	all := NewAll(f2, dyn, "vm")
	New(f2, dyn, "vm")
	runFactory(t, f2, dyn)
	if got := fmt.Sprint(selectors()); got != "map[list:[] watch:[]]" {
		t.Errorf("New's and All's lists and watches: %s", got)
	}
	if !all.Exists("other") {
		t.Error("All does not see other nodes' NodeConfigs")
	}
}
