package anycast

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// kernel is a fake: routes by prefix; like the real dataplane, SetRoute
// programs the next hops whose device exists and reports the others;
// calls are counted; SetRoute can be told to fail.
type kernel struct {
	mu      sync.Mutex
	routes  map[netip.Prefix][]dataplane.Nexthop
	devs    map[string]bool
	calls   []string
	failFor map[netip.Prefix]int
	reads   int
}

func newKernel(devs ...string) *kernel {
	k := &kernel{routes: map[netip.Prefix][]dataplane.Nexthop{}, devs: map[string]bool{}, failFor: map[netip.Prefix]int{}}
	for _, d := range devs {
		k.devs[d] = true
	}
	return k
}

func (k *kernel) SetRoute(dst netip.Prefix, nhs []dataplane.Nexthop) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, fmt.Sprintf("%s %d", dst, len(nhs)))
	if k.failFor[dst] > 0 {
		k.failFor[dst]--
		return errors.New("injected")
	}
	var live []dataplane.Nexthop
	var errs []error
	for _, nh := range nhs {
		if !k.devs[nh.Dev] {
			errs = append(errs, fmt.Errorf("dev %s: no such device", nh.Dev))
			continue
		}
		live = append(live, nh)
	}
	if len(live) == 0 {
		delete(k.routes, dst)
	} else {
		k.routes[dst] = live
	}
	return errors.Join(errs...)
}

func (k *kernel) HostRoutes() (map[netip.Prefix][]dataplane.Nexthop, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reads++
	out := map[netip.Prefix][]dataplane.Nexthop{}
	for p, nhs := range k.routes {
		out[p] = slices.Clone(nhs)
	}
	return out, nil
}

func (k *kernel) snapshot() (map[netip.Prefix][]dataplane.Nexthop, int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.routes), len(k.calls)
}

var (
	p1  = netip.MustParsePrefix("2001:db8:ff::1/128")
	p2  = netip.MustParsePrefix("203.0.113.1/32")
	nhA = dataplane.Nexthop{Gateway: netip.MustParseAddr("fd00:10:1::a"), Dev: "flock0000000a"}
	nhB = dataplane.Nexthop{Gateway: netip.MustParseAddr("fd00:10:1::b"), Dev: "flock0000000b"}
	nh4 = dataplane.Nexthop{Gateway: netip.MustParseAddr("10.1.1.10"), Dev: "flock0000000a"}
)

func equal(a, b map[netip.Prefix][]dataplane.Nexthop) bool {
	return maps.EqualFunc(a, b, func(x, y []dataplane.Nexthop) bool { return slices.Equal(x, y) })
}

func TestSetIsIdempotent(t *testing.T) {
	k := newKernel(nhA.Dev, nhB.Dev)
	r := New(k)
	want := map[netip.Prefix][]dataplane.Nexthop{p1: {nhA, nhB}, p2: {nh4}}
	ctx := context.Background()
	if err := r.Set(ctx, want, false); err != nil {
		t.Fatal(err)
	}
	got, calls := k.snapshot()
	if !equal(got, want) {
		t.Fatalf("kernel = %v, want %v", got, want)
	}
	for range 3 {
		if err := r.Set(ctx, want, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, again := k.snapshot(); again != calls {
		t.Errorf("repeated Set made %d more kernel calls, want none", again-calls)
	}
	if err := r.Set(ctx, want, true); err != nil {
		t.Fatal(err)
	}
	if _, again := k.snapshot(); again != calls {
		t.Errorf("a full pass over an unchanged kernel made %d calls", again-calls)
	}
	// One replica leaves: only that route is touched.
	want = map[netip.Prefix][]dataplane.Nexthop{p1: {nhB}, p2: {nh4}}
	if err := r.Set(ctx, want, false); err != nil {
		t.Fatal(err)
	}
	got, after := k.snapshot()
	if !equal(got, want) || after != calls+1 {
		t.Errorf("kernel = %v after %d calls, want %v after 1", got, after-calls, want)
	}
	if !equal(r.Installed(), want) {
		t.Errorf("Installed = %v", r.Installed())
	}
}

// Routes flock owns but nobody wants — left by a crash, or by a pod that
// is NotReady across a restart — go at the first pass; a route someone
// removed behind our back comes back at the next full pass.
func TestFullPassRepairsDrift(t *testing.T) {
	k := newKernel(nhA.Dev, nhB.Dev)
	stale := netip.MustParsePrefix("2001:db8:ee::1/128")
	k.routes[stale] = []dataplane.Nexthop{nhA}
	r := New(k)
	want := map[netip.Prefix][]dataplane.Nexthop{p1: {nhA}}
	ctx := context.Background()
	if err := r.Set(ctx, want, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.snapshot(); !equal(got, want) {
		t.Fatalf("after the first pass the kernel holds %v, want %v", got, want)
	}
	k.mu.Lock()
	delete(k.routes, p1)
	k.routes[stale] = []dataplane.Nexthop{nhB}
	k.mu.Unlock()
	if err := r.Set(ctx, want, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.snapshot(); equal(got, want) {
		t.Fatal("an event pass noticed drift without re-reading (the test assumption changed)")
	}
	if err := r.Set(ctx, want, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.snapshot(); !equal(got, want) {
		t.Errorf("after a full pass the kernel holds %v, want %v", got, want)
	}
}

// A failed route is retried at the next pass (which re-reads the kernel),
// and does not stop the other routes.
func TestFailedRouteIsRetried(t *testing.T) {
	k := newKernel(nhA.Dev, nhB.Dev)
	k.failFor[p1] = 1
	r := New(k)
	want := map[netip.Prefix][]dataplane.Nexthop{p1: {nhA}, p2: {nh4}}
	ctx := context.Background()
	err := r.Set(ctx, want, false)
	if err == nil || !strings.Contains(err.Error(), p1.String()) {
		t.Fatalf("Set = %v, want an error naming %s", err, p1)
	}
	if got, _ := k.snapshot(); !slices.Equal(got[p2], want[p2]) {
		t.Errorf("one failing route kept %s from being programmed", p2)
	}
	reads := k.reads
	if err := r.Set(ctx, want, false); err != nil {
		t.Fatal(err)
	}
	if k.reads != reads+1 {
		t.Error("the pass after an error did not re-read the kernel")
	}
	if got, _ := k.snapshot(); !equal(got, want) {
		t.Errorf("kernel = %v, want %v", got, want)
	}
}

func TestCancelledContextStopsEarly(t *testing.T) {
	r := New(newKernel(nhA.Dev))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Set(ctx, map[netip.Prefix][]dataplane.Nexthop{p1: {nhA}}, false); !errors.Is(err, context.Canceled) {
		t.Errorf("Set = %v", err)
	}
}

// A device that vanishes behind the target's back (a pod's netns gone
// without a DEL) takes the whole IPv4 multipath route with it; LinkGone
// makes the next pass put the other replicas' route back.
func TestLinkGoneReprograms(t *testing.T) {
	nhB4 := dataplane.Nexthop{Gateway: netip.MustParseAddr("10.1.1.11"), Dev: "flock0000000b"}
	k := newKernel(nh4.Dev, nhB4.Dev)
	r := New(k)
	ctx := context.Background()
	want := map[netip.Prefix][]dataplane.Nexthop{p2: {nh4, nhB4}}
	if err := r.Set(ctx, want, false); err != nil {
		t.Fatal(err)
	}
	// The kernel drops the device and, IPv4, the whole route.
	k.mu.Lock()
	delete(k.devs, nh4.Dev)
	delete(k.routes, p2)
	k.mu.Unlock()
	if err := r.Set(ctx, want, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.snapshot(); len(got[p2]) != 0 {
		t.Fatal("test assumption: an event pass does not notice the vanished route")
	}
	if r.LinkGone("flock-unrelated") {
		t.Error("LinkGone of a device no route uses reported a hit")
	}
	if !r.LinkGone(nh4.Dev) {
		t.Fatal("LinkGone did not find the route via the vanished device")
	}
	// The vanished replica is still desired (no DEL yet): its next hop
	// fails, the other replica's is programmed.
	err := r.Set(ctx, want, false)
	if err == nil || !strings.Contains(err.Error(), nh4.Dev) {
		t.Errorf("Set = %v, want an error naming %s", err, nh4.Dev)
	}
	if got, _ := k.snapshot(); !slices.Equal(got[p2], []dataplane.Nexthop{nhB4}) {
		t.Errorf("the surviving replica's route is %v, want via %v", got[p2], nhB4)
	}
	// Once the state drops it (reaped), the route is exactly the survivor.
	want = map[netip.Prefix][]dataplane.Nexthop{p2: {nhB4}}
	if err := r.Set(ctx, want, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.snapshot(); !slices.Equal(got[p2], want[p2]) {
		t.Errorf("kernel routes %s via %v, want %v", p2, got[p2], want[p2])
	}
	r.MarkStale()
	reads := k.reads
	if err := r.Set(ctx, want, false); err != nil || k.reads != reads+1 {
		t.Errorf("after MarkStale: err %v, %d re-reads", err, k.reads-reads)
	}
}
