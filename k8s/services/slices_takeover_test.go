package services

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// slowSlices: every list of EndpointSlices takes d, as a list in a large
// cluster does (the API server filters every slice by the selector), and
// the lists begun are counted.
type slowSlices struct {
	fakeSlices
	d     time.Duration
	lists *atomic.Int32
}

func (s slowSlices) List(ctx context.Context, o metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	s.lists.Add(1)
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.fakeSlices.List(ctx, o)
}

// LoadBalancer Services created one after another, each sooner than a
// list of slices takes: the watch that is listing is left to finish and
// takes over (it withdraws nothing), then the next one covers what came
// meanwhile. The first Service, whose slices exist from the start, goes
// out while the burst still lasts (a watch restarted for each new
// Service would take over only once they stop coming), and the burst
// costs a list per list-time, not a list per Service.
func TestABurstOfServicesDoesNotStarveTheSliceWatch(t *testing.T) {
	const (
		listTakes = 150 * time.Millisecond
		every     = 50 * time.Millisecond
		burst     = 30 // Services after the first: 1.5s of them
	)
	objs := []runtime.Object{svc("web", ingress("2001:db8:1b::1")), slicesFor("web", ep{node, "fd00:10::1", "ready"})[0]}
	for i := range burst + 1 {
		objs = append(objs, slicesFor(fmt.Sprint("s", i), ep{node, "fd00:10::1", "ready"})[0])
	}
	cs := fake.NewClientset(objs...)
	var lists atomic.Int32
	f := kubeclient.NewFactory()
	c := New(f, Clients{
		Services:       fakeSvcs{cs.CoreV1().Services(metav1.NamespaceAll)},
		EndpointSlices: slowSlices{fakeSlices{cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)}, listTakes, &lists},
	}, Options{Node: node, Authorize: authorize}, nil)
	testutil.Start(t, f.Run, f.WaitForSync)
	testutil.Run(t, c.Run)
	testutil.WaitWatching(t, cs, "services")
	waitRows(t, c, "web advertised", []string{"shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"})

	ctx := context.Background()
	before := lists.Load()
	t0 := time.Now()
	if _, err := cs.CoreV1().Services("shop").Create(ctx, svc("s0", ingress("2001:db8:1b::100")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	burstDone := make(chan time.Time, 1)
	go func() {
		for i := 1; i <= burst; i++ {
			time.Sleep(every)
			if _, err := cs.CoreV1().Services("shop").Create(ctx, svc(fmt.Sprint("s", i), ingress(fmt.Sprintf("2001:db8:1b::%x", 0x100+i))), metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}
		burstDone <- time.Now()
	}()
	want := "shop/s0 loadBalancer 2001:db8:1b::100: advertised (ready endpoint in the cluster, 1)"
	var took time.Duration
	testutil.Eventually(t, "s0 advertised", func() (bool, string) {
		for _, a := range c.Addresses() {
			if row(a) == want {
				took = time.Since(t0)
				return true, ""
			}
		}
		return false, ""
	})
	end := (<-burstDone).Sub(t0)
	n := lists.Load() - before
	t.Logf("s0 advertised %v after it was created (a list takes %v; the burst of %d Services lasted %v); %d lists of slices for %d new Services",
		took.Round(time.Millisecond), listTakes, burst, end.Round(time.Millisecond), n, burst+1)
	if took >= end {
		t.Errorf("s0, whose slices exist, went out only after the burst (%v; the burst lasted %v): each new Service restarted the listing watch", took, end)
	}
	// A list at a time, one after another, over the burst (and one for
	// what came during the last): not one a Service.
	if most := int32(end/listTakes) + 3; n > most {
		t.Errorf("%d lists of slices for %d Services over %v (at most %d: one a list's time)", n, burst+1, end.Round(time.Millisecond), most)
	}
	// Once the burst is over, every one of them goes out.
	var rows []string
	for i := range burst + 1 {
		rows = append(rows, fmt.Sprintf("shop/s%d loadBalancer 2001:db8:1b::%x: advertised (ready endpoint in the cluster, 1)", i, 0x100+i))
	}
	rows = append(rows, "shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)")
	slices.Sort(rows)
	waitRows(t, c, "every Service of the burst advertised", rows)
}

// The agent starts while its Services are still being listed (start-up
// does not wait for the Services' factory; the controller runs
// whenServing): the slice watch starts once the Services' first list has
// reached the handler, with every Service that wants slices in one list,
// not a watch restarted as each arrives.
func TestStartupListsSlicesOnce(t *testing.T) {
	const n = 300
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, svc(fmt.Sprint("s", i), ingress(fmt.Sprintf("2001:db8:1b::%x", 0x100+i))),
			slicesFor(fmt.Sprint("s", i), ep{node, "fd00:10::1", "ready"})[0])
	}
	cs := fake.NewClientset(objs...)
	gated := &gatedSvcs{fakeSvcs: fakeSvcs{cs.CoreV1().Services(metav1.NamespaceAll)}, gate: make(chan struct{})}
	var lists atomic.Int32
	f := kubeclient.NewFactory()
	c := New(f, Clients{
		Services:       gated,
		EndpointSlices: slowSlices{fakeSlices{cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)}, 100 * time.Millisecond, &lists},
	}, Options{Node: node, Authorize: authorize}, nil)
	testutil.Run(t, f.Run)
	testutil.Run(t, c.Run)
	time.Sleep(50 * time.Millisecond)
	close(gated.gate)
	select {
	case <-c.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("Synced never closed")
	}
	c.eps.mu.Lock()
	watches := c.eps.watches
	c.eps.mu.Unlock()
	t.Logf("%d Services that want slices: %d slice watches started, %d lists begun", n, watches, lists.Load())
	if lists.Load() != 1 {
		t.Errorf("%d lists of EndpointSlices begun for one start-up (%d watches started)", lists.Load(), watches)
	}
}

// A watch that lists while a Service starts to want slices does not take
// over if it lacks them and the current watch holds them: the Service,
// decided from the current watch (advertised, say), would be withdrawn
// until a watch with it listed. Driven by hand: ensure is called as Run
// would, after the listing watch finished.
func TestATakeOverWithdrawsNoSlices(t *testing.T) {
	defer func(n int) { maxSelector = n }(maxSelector)
	cs := fake.NewClientset(slicesFor("a", ep{node, "fd00:10::1", "ready"})[0], slicesFor("b", ep{node, "fd00:10::2", "ready"})[0])
	s := newSliceSource(fakeSlices{cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)}, slog.Default(),
		cache.ResourceEventHandlerFuncs{}, func() {})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	state := func() (cur, next *sliceWatch) { s.mu.Lock(); defer s.mu.Unlock(); return s.cur, s.next }
	s.service("shop/a", svc("a"))
	// Every slice watched (the selector was too long a while ago).
	maxSelector = 10
	s.ensure(ctx)
	testutil.Eventually(t, "the watch of every slice listed", func() (bool, string) { w, _ := state(); return w != nil && w.names == nil, "" })
	maxSelector = 4096
	// Only a wants slices: the watch of every slice is wide, a watch of
	// a's starts listing (Run's ensure after the change).
	s.ensure(ctx)
	// b becomes a LoadBalancer: it is decided from the current watch,
	// which holds its slices.
	s.service("shop/b", svc("b"))
	if got := len(s.slices("shop/b")); got != 1 {
		t.Fatalf("b's slices before: %d", got)
	}
	// The watch of a's slices lists before Run's ensure sees b: it does
	// not take over.
	testutil.Eventually(t, "the watch of a's slices done listing", func() (bool, string) { _, n := state(); return n == nil, "" })
	if cur, _ := state(); cur.names != nil {
		t.Fatalf("a watch of %v took over from the watch of every slice, while b wants its slices", cur.names)
	}
	if got := len(s.slices("shop/b")); got != 1 {
		t.Fatalf("b's slices after: %d", got)
	}
	// Run's ensure: a watch of both takes over.
	s.ensure(ctx)
	testutil.Eventually(t, "a watch of a's and b's slices took over", func() (bool, string) {
		w, _ := state()
		return w != nil && w.names["a"] && w.names["b"] && len(w.names) == 2, fmt.Sprint(w.names)
	})
	if got := len(s.slices("shop/b")); got != 1 {
		t.Fatalf("b's slices at the end: %d", got)
	}
}
