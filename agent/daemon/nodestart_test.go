package daemon

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/agent/status"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
)

// gatedDynamic is a fake dynamic client whose Lists wait for the gate.
type gatedDynamic struct {
	dynamic.Interface
	g *gate
}

func (d gatedDynamic) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return gatedResource{d.Interface.Resource(gvr), d.g}
}

func (gatedDynamic) IsWatchListSemanticsUnSupported() bool { return true }

type gatedResource struct {
	dynamic.NamespaceableResourceInterface
	g *gate
}

func (r gatedResource) List(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	if err := r.g.wait(ctx); err != nil {
		return nil, err
	}
	return r.NamespaceableResourceInterface.List(ctx, o)
}

// CNI is served while every node's NodeConfig is still being listed
// (nothing of ADD reads them; at 5,000 nodes they were most of the
// start), but no peer is added until they are listed, and then without
// this node's summary that another node's NodeConfig also claims: the
// peers' first UPDATEs never carry a summary another node owns.
func TestServesCNIWhileNodeConfigsList(t *testing.T) {
	d := testDaemon(t)
	d.o.CNISocket = filepath.Join(t.TempDir(), "cni.sock")
	target := &speakerSets{}
	d.bgpLoop = &reconcile.Loop[map[netip.Prefix]advert.Path]{Name: "bgp", Target: target, Desired: d.state.Adverts, Wake: d.state.Changed()}
	other := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "NodeConfig",
		"metadata": map[string]any{"name": "node2", "generation": int64(1)},
		"spec": map[string]any{"asn": int64(65002), "routerID": "192.0.2.2",
			"pools": []any{map[string]any{"cidr": summary6.String()}}},
	}}
	fake := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{nodeconfigs.GVR: "NodeConfigList"}, other)
	g := &gate{open: make(chan struct{})}
	nf := kubeclient.NewFactory()
	k := &kubeMode{factory: kubeclient.NewFactory(), nodesFactory: nf, allNC: nodeconfigs.NewAll(nf, gatedDynamic{fake, g}, "node1")}
	d.kube = k

	c := &d.components
	c.register("informers", duringRecovery, k.factory)
	c.register("nodeconfig informer", duringRecovery, nf)
	s, done := startServing(t, d, target, "while every node's NodeConfig is being listed")
	testutil.WaitFor(t, "the NodeConfigs' list begun", func() bool { return g.listed() > 0 })
	if k.allNC.HasSynced() {
		t.Fatal("serving: the NodeConfigs synced through a closed gate")
	}
	if !d.ready.Load() {
		t.Error("CNI served, the agent not ready")
	}
	testutil.Consistently(t, "no peer while the NodeConfigs are listed", 300*time.Millisecond, func() (bool, string) {
		if len(s.peered) != 0 {
			return false, "peers added"
		}
		return true, ""
	})
	// An operator sees why (the NodeConfig status, flockctl).
	if p := (status.Node{PeersWait: d.peersWait()}).Problems(); !slices.ContainsFunc(p, func(s string) bool { return strings.HasPrefix(s, "BGP peers not added yet: ") }) {
		t.Errorf("while the NodeConfigs are listed, the problems say nothing of the peers: %q", p)
	}

	close(g.open)
	select {
	case held := <-s.peered:
		if _, ok := held[summary6]; ok {
			t.Errorf("peers added while the speaker holds %s, which node2's NodeConfig claims too: %v", summary6, held)
		}
	case <-time.After(testutil.Timeout):
		t.Fatal("peers never added once the NodeConfigs were listed")
	}
	if w := d.peersWait(); w != "" {
		t.Errorf("the NodeConfigs listed, the peers still wait for %q", w)
	}
	if why := d.state.Suppressed()[summary6]; why == "" {
		t.Errorf("%s not withheld: %v", summary6, d.state.Suppressed())
	} else {
		t.Logf("withheld: %s", why)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Until every NodeConfig is listed, the AddressPools' status.inUse keeps
// every other node's entry (a node not listed yet is no node gone); once
// listed, only those of nodes without a NodeConfig go.
func TestInUseKeepsEntriesUntilNodeConfigsListed(t *testing.T) {
	other := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "NodeConfig",
		"metadata": map[string]any{"name": "node2"}, "spec": map[string]any{"asn": int64(65002)},
	}}
	fake := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{nodeconfigs.GVR: "NodeConfigList"}, other)
	g := &gate{open: make(chan struct{})}
	nf := kubeclient.NewFactory()
	k := &kubeMode{nodesFactory: nf, allNC: nodeconfigs.NewAll(nf, gatedDynamic{fake, g}, "node1")}
	testutil.Run(t, nf.Run)
	testutil.WaitFor(t, "the NodeConfigs' list begun", func() bool { return g.listed() > 0 })
	if live := k.liveNodes(); live != nil {
		t.Fatalf("before the NodeConfigs are listed: live(node3) = %v, want every entry kept (nil)", live("node3"))
	}
	close(g.open)
	testutil.WaitFor(t, "the NodeConfigs listed", k.allNC.HasSynced)
	live := k.liveNodes()
	if live == nil || !live("node2") || live("node3") {
		t.Fatalf("listed: live is nil %v; want node2 live and node3 gone", live == nil)
	}
}
