package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/agent/status"
	"code.fritzlab.net/fritzlab/flock/bgp"
	"code.fritzlab.net/fritzlab/flock/bgp/session"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
)

// statusWriter is a daemon running writeStatus against a fake API with
// node1's NodeConfig; writes counts the status updates.
type statusWriter struct {
	d      *daemon
	k      *kubeMode
	dyn    *dynfake.FakeDynamicClient
	writes atomic.Int32
	ctx    context.Context
}

func newStatusWriter(t *testing.T) *statusWriter {
	t.Helper()
	nc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "NodeConfig",
		"metadata": map[string]any{"name": "node1"},
		"spec":     map[string]any{"asn": int64(65001), "routerID": "192.0.2.1"},
	}}
	nc.SetGeneration(1)
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{nodeconfigs.GVR: "NodeConfigList"}, nc)
	w := &statusWriter{dyn: dyn}
	dyn.PrependReactor("update", "nodeconfigs", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" {
			w.writes.Add(1)
		}
		return false, nil, nil
	})
	f := kubeclient.NewFactory()
	k := &kubeMode{nc: nodeconfigs.New(f, dyn, "node1"), kick: make(chan struct{}, 1)}
	k.gen.Store(1)
	ctx := testutil.Start(t, f.Run, f.WaitForSync)
	testutil.WaitWatching(t, dyn, nodeconfigs.GVR.Resource)
	sp, err := bgp.New(bgp.Config{ASN: 65001, RouterID: "192.0.2.1", BGP: v1alpha1.BGP{ListenPort: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Stop)
	d := testDaemon(t)
	d.speaker, d.kube = sp, k
	d.bgpLoop = &reconcile.Loop[map[netip.Prefix]advert.Path]{}
	d.kernelLoop = &reconcile.Loop[map[netip.Prefix][]dataplane.Nexthop]{}
	d.ready.Store(true)
	w.d, w.k, w.ctx = d, k, ctx
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = k.writeStatus(wctx, d) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w
}

// apiStatus is the status the API holds (nil: none).
func (w *statusWriter) apiStatus() map[string]any {
	u, err := w.dyn.Resource(nodeconfigs.GVR).Get(context.Background(), "node1", metav1.GetOptions{})
	if err != nil {
		return nil
	}
	st, _ := u.Object["status"].(map[string]any)
	return st
}

// The writer promises that a status someone else changed is put back
// (the 30 s tick, or any kick). An operator (or a tool: a restore, a
// kubectl replace whose delete the watch missed) that removes .status
// leaves the cache with no status at all: writeStatus then compares with
// its own last write, finds nothing changed, and never writes the status
// again — Ready, peers and errors stay blank in `kubectl get nodeconfigs`
// until something else in the status changes.
func TestWriteStatusRepairsARemovedStatus(t *testing.T) {
	w := newStatusWriter(t)
	w.k.statusChanged()
	testutil.Eventually(t, "the first status written and cached", func() (bool, string) {
		st, _ := w.k.nc.Status()
		return w.apiStatus() != nil && st.Peers != "", fmt.Sprint(w.apiStatus())
	})

	// Someone removes the status.
	u, err := w.dyn.Resource(nodeconfigs.GVR).Get(w.ctx, "node1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(u.Object, "status")
	if _, err := w.dyn.Resource(nodeconfigs.GVR).Update(w.ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the cache without a status", func() (bool, string) {
		st, ok := w.k.nc.Status()
		return ok && st.Peers == "" && len(st.Conditions) == 0, ""
	})

	// Ticks (or any kick) come and go: the status must be put back.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		w.k.statusChanged()
		if w.apiStatus() != nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("a removed NodeConfig status is never written again (%d status writes in all, the first one included)", w.writes.Load())
}

// The cache holds what the API server stored: times at RFC 3339's second
// precision, without Go's monotonic reading. The status the agent renders
// carries a peer's Since (time.Now() at the session's last change) to the
// nanosecond, and sameStatus compares fmt's rendering of both: a node
// with one BGP peer up never compares equal to its own cached status, so
// every kick and every 30 s tick writes it again (a GET and a PUT), which
// is what writing "only when it changes" was to end.
func TestPlanStatusEqualToItsOwnCachedWrite(t *testing.T) {
	w := newStatusWriter(t)
	node := status.Node{Ready: true, Neighbors: []session.Neighbor{{Peer: "2001:db8::1", State: session.Established, Since: time.Now()}}}
	st := nodeStatus(node, 1)
	if err := w.k.nc.UpdateStatus(w.ctx, st); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the status cached", func() (bool, string) {
		have, _ := w.k.nc.Status()
		return len(have.PeerStates) == 1, fmt.Sprint(have)
	})
	have, _ := w.k.nc.Status()
	if write, _ := planStatus(nodeStatus(node, 1), &have); write {
		t.Errorf("an unchanged status with an established peer is written again:\n want %+v\n have %+v", st, have)
	}
}
