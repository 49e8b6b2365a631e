package claims

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

const grace = 2 * time.Minute

// world is what the GC asks about: containers the agent holds, pods and
// nodes in the API, and the errors the API returns.
type world struct {
	mu        sync.Mutex
	live      map[string]bool
	holds     map[string]netip.Addr // if set for a container: the one IP it holds
	pods      map[podmeta.ID]bool
	nodes     map[string]bool
	podErr    error
	nodeErr   error
	nodeAsks  map[string]int
	collected atomic.Int32
}

func newWorld() *world {
	return &world{live: map[string]bool{}, holds: map[string]netip.Addr{}, pods: map[podmeta.ID]bool{}, nodes: map[string]bool{}, nodeAsks: map[string]int{}}
}

func (w *world) gc(c *Claims, now *time.Time) *GC {
	return &GC{
		Claims: c,
		Holds: func(id string, ip netip.Addr) bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			if h, ok := w.holds[id]; ok {
				return h == ip
			}
			return w.live[id]
		},
		Pods: func(_ context.Context, id podmeta.ID) (bool, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.pods[id], w.podErr
		},
		Nodes: func(_ context.Context, n string) (bool, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.nodeAsks[n]++
			return w.nodes[n], w.nodeErr
		},
		Grace:     grace,
		Log:       quiet(),
		OnCollect: func() { w.collected.Add(1) },
		now:       func() time.Time { return *now },
	}
}

// setup creates the claims at t0 (node-a is this node) and runs node-a's
// informer until they are all cached.
func setup(t *testing.T, cls ...Claim) (*fakeAPI, *Claims) {
	t.Helper()
	a := newFakeAPI()
	for _, cl := range cls {
		if err := New(kubeclient.NewFactory(), a, cl.Node, quiet()).Claim(context.Background(), cl); err != nil {
			t.Fatal(err)
		}
	}
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	start(t, a, c)
	testutil.WaitFor(t, "the cache holds every claim", func() bool { return len(c.all()) == len(cls) })
	return a, c
}

func sweep(g *GC, seen map[string]time.Time) {
	g.sweep(context.Background(), quiet(), grace, seen)
}

var (
	mineIP   = "2001:db8:100::1"
	mineCtr  = "ctr-a"
	minePod  = pod("tenant-a", "web-1")
	otherIP  = "2001:db8:100::2"
	otherCtr = "ctr-c"
	otherPod = pod("tenant-c", "web-2")
)

func mine() Claim {
	return claim(mineIP, v1alpha1.UsePod, "shared", minePod, "node-a", mineCtr)
}

func otherNode() Claim {
	return claim(otherIP, v1alpha1.UsePod, "shared", otherPod, "node-c", otherCtr)
}

// A claim that exists but whose pod is gone is reclaimed after the grace,
// not at once.
func TestGCReclaimsAfterTheGraceNotAtOnce(t *testing.T) {
	a, c := setup(t, mine())
	w := newWorld()
	now := t0
	g := w.gc(c, &now)
	seen := map[string]time.Time{}

	for _, at := range []time.Duration{0, time.Second, grace / 2, grace - time.Second} {
		now = t0.Add(at)
		sweep(g, seen)
		if _, ok := a.get(t, mineIP); !ok {
			t.Fatalf("reclaimed %s after the claim was created: before the grace (%s)", at, grace)
		}
	}
	if len(a.deletes()) != 0 {
		t.Fatal("a delete before the grace")
	}
	now = t0.Add(grace)
	sweep(g, seen)
	if _, ok := a.get(t, mineIP); ok {
		t.Fatal("not reclaimed after the grace")
	}
	if n := w.collected.Load(); n != 1 {
		t.Fatalf("OnCollect called %d times, want 1", n)
	}
	d := a.deletes()
	if len(d) != 1 || d[0].GetDeleteOptions().Preconditions == nil || d[0].GetDeleteOptions().Preconditions.UID == nil {
		t.Fatalf("deletes %v: want one, with preconditions", d)
	}
}

// This node's claim of a container the agent does not hold is garbage
// even while its pod exists, without asking the API about the pod: a
// create whose answer was lost failed the ADD, and kubelet retries with a
// new sandbox (or the pod now runs elsewhere and needs the IP there).
func TestGCReclaimsOwnClaimOfAGoneContainerWhilePodExists(t *testing.T) {
	a, c := setup(t, mine())
	w := newWorld()
	w.pods[minePod] = true
	w.podErr = apierrors.NewServiceUnavailable("not asked")
	now := t0.Add(grace)
	sweep(w.gc(c, &now), map[string]time.Time{})
	if _, ok := a.get(t, mineIP); ok {
		t.Fatal("the claim of a container this node no longer holds survived")
	}
	if n := w.collected.Load(); n != 1 {
		t.Fatalf("OnCollect called %d times, want 1", n)
	}
}

// A live container's claim of an IP it does not hold (an ADD whose create
// answer was lost, retried with another IP) is garbage too.
func TestGCReclaimsOwnClaimOfAnIPTheContainerDoesNotHold(t *testing.T) {
	a, c := setup(t, mine())
	w := newWorld()
	w.holds[mineCtr] = netip.MustParseAddr("2001:db8:100::99")
	now := t0.Add(grace)
	sweep(w.gc(c, &now), map[string]time.Time{})
	if _, ok := a.get(t, mineIP); ok {
		t.Fatal("a claim of an IP its container does not hold survived")
	}
}

func TestGCDeletesTheClaimsOfAGoneNode(t *testing.T) {
	second := claim("198.51.100.9", v1alpha1.UseAddresses, "addrs", pod("tenant-c", "db-0"), "node-c", "ctr-c2")
	a, c := setup(t, otherNode(), second)
	w := newWorld()
	now := t0.Add(grace)
	g := w.gc(c, &now)
	sweep(g, map[string]time.Time{})
	for _, ip := range []string{otherIP, "198.51.100.9"} {
		if _, ok := a.get(t, ip); ok {
			t.Errorf("%s: the claim of a gone pod on a gone node survived", ip)
		}
	}
	if w.nodeAsks["node-c"] != 1 {
		t.Fatalf("asked for node-c %d times in one round, want 1", w.nodeAsks["node-c"])
	}
	if n := w.collected.Load(); n != 2 {
		t.Fatalf("OnCollect called %d times, want 2", n)
	}
}

// Until Peers names every node (the agent's NodeConfigs still listing),
// no other node is asked about: with Peers short, this agent would ask
// about every node itself. Its own claims are judged as before; the
// other node's claim goes once Peers is synced.
func TestGCWaitsForPeersBeforeAskingAboutOthers(t *testing.T) {
	a, c := setup(t, otherNode(), mine())
	w := newWorld()
	now := t0.Add(grace)
	g := w.gc(c, &now)
	var synced atomic.Bool
	g.Peers = func() []string { return nil } // nothing listed yet
	g.PeersSynced = synced.Load
	sweep(g, map[string]time.Time{})
	if len(w.nodeAsks) != 0 {
		t.Fatalf("before Peers synced, asked about nodes %v", w.nodeAsks)
	}
	if _, ok := a.get(t, otherIP); !ok {
		t.Fatal("before Peers synced, another node's claim was deleted")
	}
	if _, ok := a.get(t, mineIP); ok {
		t.Error("this node's claim of a container it does not hold survived: its own claims wait for nothing")
	}
	g.Peers = func() []string { return []string{"node-a"} }
	synced.Store(true)
	sweep(g, map[string]time.Time{})
	if w.nodeAsks["node-c"] != 1 {
		t.Fatalf("once synced, asked about node-c %d times, want 1", w.nodeAsks["node-c"])
	}
	if _, ok := a.get(t, otherIP); ok {
		t.Error("once synced, the claim of a gone pod on a gone node survived")
	}
}

// Each case keeps the claim, also long after the grace.
func TestGCKeeps(t *testing.T) {
	unavailable := apierrors.NewServiceUnavailable("apiserver is restarting")
	for name, tc := range map[string]struct {
		claim Claim
		world func(*world)
		api   func(*fakeAPI) // reactors
	}{
		"own claim, container live (pod gone)": {
			claim: mine(), world: func(w *world) { w.live[mineCtr] = true },
		},
		"other node exists (pod gone)": {
			claim: otherNode(), world: func(w *world) { w.nodes["node-c"] = true },
		},
		"other node gone, pod exists": {
			claim: otherNode(), world: func(w *world) { w.pods[otherPod] = true },
		},
		"other node, node API error": {
			claim: otherNode(), world: func(w *world) { w.nodeErr = unavailable },
		},
		"other node gone, pod API error": {
			claim: otherNode(), world: func(w *world) { w.podErr = unavailable },
		},
		"own claim, delete fails": {
			claim: mine(),
			api: func(a *fakeAPI) {
				a.PrependReactor("delete", GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, unavailable
				})
			},
		},
		// Released and re-claimed by a live pod (new UID) between the
		// cache read and the delete: the precondition fails and the new
		// claim survives (the next round sees its pod exists).
		"claim changed since it was read": {
			claim: otherNode(),
			world: func(w *world) { w.pods[pod("tenant-c", "web-3")] = true },
			api: func(a *fakeAPI) {
				var once sync.Once
				a.PrependReactor("delete", GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
					once.Do(func() {
						_ = a.replace(action.(clienttesting.DeleteAction).GetName(), func(u *unstructured.Unstructured) {
							_ = unstructured.SetNestedField(u.Object, "web-3", "spec", "pod", "name")
							_ = unstructured.SetNestedField(u.Object, pod("tenant-c", "web-3").UID, "spec", "pod", "uid")
						})
					})
					return false, nil, nil
				})
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			a, c := setup(t, tc.claim)
			w := newWorld()
			if tc.world != nil {
				tc.world(w)
			}
			if tc.api != nil {
				tc.api(a)
			}
			now := t0.Add(10 * grace)
			g := w.gc(c, &now)
			seen := map[string]time.Time{}
			sweep(g, seen)
			sweep(g, seen)
			if _, ok := a.get(t, tc.claim.IP.String()); !ok {
				t.Fatal("the claim was deleted")
			}
			if n := w.collected.Load(); n != 0 {
				t.Fatalf("OnCollect called %d times", n)
			}
		})
	}
}

// A claim without a creationTimestamp (never from a real API server) ages
// from when the GC first saw it.
func TestGCWithoutCreationTimestamp(t *testing.T) {
	a := newFakeAPI()
	u, err := object(mine())
	if err != nil {
		t.Fatal(err)
	}
	u.SetUID("uid-x")
	u.SetResourceVersion("7")
	if err := a.Tracker().Create(GVR, u, ""); err != nil {
		t.Fatal(err)
	}
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	start(t, a, c)
	testutil.WaitFor(t, "the claim is cached", func() bool { return len(c.all()) == 1 })
	w := newWorld()
	now := t0.Add(100 * grace)
	g := w.gc(c, &now)
	seen := map[string]time.Time{}
	sweep(g, seen)
	now = now.Add(grace - time.Second)
	sweep(g, seen)
	if _, ok := a.get(t, mineIP); !ok {
		t.Fatal("reclaimed before the grace since first seen")
	}
	now = now.Add(time.Second)
	sweep(g, seen)
	if _, ok := a.get(t, mineIP); ok {
		t.Fatal("not reclaimed a grace after first seen")
	}
	testutil.WaitFor(t, "the delete reaches the cache", func() bool { return len(c.all()) == 0 })
	sweep(g, seen)
	if len(seen) != 0 {
		t.Fatalf("seen keeps %v after the claim is gone", seen)
	}
}

// A claim that does not convert is left alone.
func TestGCLeavesBrokenClaims(t *testing.T) {
	a := newFakeAPI()
	u, _ := object(mine())
	_ = unstructured.SetNestedField(u.Object, int64(5), "spec", "pod") // not an object
	u.SetCreationTimestamp(metav1.NewTime(t0))
	if err := a.Tracker().Create(GVR, u, ""); err != nil {
		t.Fatal(err)
	}
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	start(t, a, c)
	testutil.WaitFor(t, "the claim is cached", func() bool { return len(c.all()) == 1 })
	if _, ok := c.Taken(netip.MustParseAddr(mineIP)); !ok {
		t.Fatal("a broken claim does not count as taken")
	}
	w := newWorld()
	now := t0.Add(10 * grace)
	sweep(w.gc(c, &now), map[string]time.Time{})
	if _, ok := a.get(t, mineIP); !ok {
		t.Fatal("a claim that does not convert was deleted")
	}
}

// Run sweeps at once (the cache synced: the daemon starts the GC once its
// informers have), and returns nil when ctx ends.
func TestGCRun(t *testing.T) {
	a := newFakeAPI()
	if err := New(kubeclient.NewFactory(), a, "node-a", quiet()).Claim(context.Background(), mine()); err != nil {
		t.Fatal(err)
	}
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	start(t, a, c)
	w := newWorld()
	now := t0.Add(grace)
	g := w.gc(c, &now)
	g.Grace = time.Hour // one sweep (at start) in this test's lifetime
	g.now = func() time.Time { return t0.Add(2 * time.Hour) }
	ctx, stopGC := testutil.Run(t, g.Run)
	testutil.WaitFor(t, "the start sweep reclaims the claim", func() bool { return w.collected.Load() == 1 })
	if err := g.Run(ctx); err == nil {
		t.Fatal("second Run: no error")
	}
	stopGC() // it returns nil once its ctx ends, or the test fails
	if err := (&GC{}).Run(context.Background()); err == nil {
		t.Fatal("Run without Claims: no error")
	}
	// Canceled before the cache synced: nil.
	never := &GC{Claims: New(kubeclient.NewFactory(), a, "node-a", quiet()), Holds: g.Holds, Pods: g.Pods, Nodes: g.Nodes}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if err := never.Run(cctx); err != nil {
		t.Fatalf("Run with an ended ctx: %v", err)
	}
}

// A Service's claim (use loadBalancer) is the assigner's: no GC round
// deletes it, however old and whatever the world says — nothing live, no
// pods, no nodes — nor asks the API about its empty pod or node. Also on a
// GC whose Claims has no node, where a claim naming no node would
// otherwise look like its own. A pod's claim in the same rounds is
// collected: the GC did run.
func TestGCNeverDeletesServiceClaims(t *testing.T) {
	for _, node := range []string{"node-a", ""} {
		t.Run("node "+node, func(t *testing.T) {
			a := newFakeAPI()
			lb := svcClaim("2001:db8:1b::1", "lb", web)
			for _, cl := range []Claim{lb, mine()} {
				if err := New(kubeclient.NewFactory(), a, cl.Node, quiet()).Claim(context.Background(), cl); err != nil {
					t.Fatal(err)
				}
			}
			// One without a creationTimestamp, pool or UID.
			bare, err := object(svcClaim("203.0.113.1", "", ServiceRef{Namespace: "shop", Name: "api"}))
			if err != nil {
				t.Fatal(err)
			}
			bare.SetUID("uid-bare")
			bare.SetResourceVersion("99")
			if err := a.Tracker().Create(GVR, bare, ""); err != nil {
				t.Fatal(err)
			}
			c := New(kubeclient.NewFactory(), a, node, quiet())
			start(t, a, c)
			testutil.WaitFor(t, "the cache holds 3 claims", func() bool { return len(c.all()) == 3 })
			w := newWorld()
			now := t0
			g := w.gc(c, &now)
			pods := g.Pods
			g.Pods = func(ctx context.Context, id podmeta.ID) (bool, error) {
				if id == (podmeta.ID{}) {
					t.Error("the GC asked the API about a Service claim's empty pod")
				}
				return pods(ctx, id)
			}
			seen := map[string]time.Time{}
			for _, at := range []time.Duration{0, grace, 10 * grace, 1000 * grace, 365 * 24 * time.Hour} {
				now = t0.Add(at)
				sweep(g, seen)
			}
			for _, ip := range []string{"2001:db8:1b::1", "203.0.113.1"} {
				if _, ok := a.get(t, ip); !ok {
					t.Errorf("%s: the GC deleted a Service's claim", ip)
				}
			}
			if _, ok := a.get(t, mineIP); ok {
				t.Error("the pod's claim survived: did the GC run?")
			}
			if n := w.collected.Load(); n != 1 {
				t.Errorf("OnCollect called %d times, want 1 (the pod's claim)", n)
			}
			if n := w.nodeAsks[""]; n != 0 {
				t.Errorf("asked the API %d times about node \"\"", n)
			}
			if _, ok := seen[bare.GetName()]; ok {
				t.Error("the GC ages a Service's claim")
			}
		})
	}
}

// With Peers set, one agent a round asks about each other node, not every
// agent: a round costs one Node GET per node holding old claims, not one
// per agent and node. Who asks moves from round to round, so a pick with
// no agent (a NodeConfig its removed node left behind) only delays the
// collection, and a gone node's claim is still collected.
func TestGCSharesTheNodeQuestions(t *testing.T) {
	gone := claim("2001:db8:100::7", v1alpha1.UsePod, "shared", pod("tenant-x", "db-0"), "node-x", "ctr-x")
	a := newFakeAPI()
	for _, cl := range []Claim{otherNode(), gone} {
		if err := New(kubeclient.NewFactory(), a, cl.Node, quiet()).Claim(context.Background(), cl); err != nil {
			t.Fatal(err)
		}
	}
	f := kubeclient.NewFactory() // one informer for every agent below
	const agents = 20
	var names []string
	var cs []*Claims
	for i := range agents {
		names = append(names, fmt.Sprintf("node-%02d", i))
		cs = append(cs, New(f, a, names[i], quiet()))
	}
	start(t, a, cs[0])
	testutil.WaitFor(t, "the cache holds both claims", func() bool { return len(cs[0].all()) == 2 })
	// node-c exists; node-x is gone, its NodeConfig left behind.
	peers := append(slices.Clone(names), "node-c", "node-x")
	w := newWorld()
	w.nodes["node-c"] = true

	round := func(now time.Time, peers func() []string, seen []map[string]time.Time) map[string][]string {
		asked := map[string][]string{} // node asked about → by whom
		for i, c := range cs {
			g := w.gc(c, &now)
			g.Peers = peers
			nodes := g.Nodes
			g.Nodes = func(ctx context.Context, n string) (bool, error) {
				asked[n] = append(asked[n], names[i])
				return nodes(ctx, n)
			}
			sweep(g, seen[i])
		}
		return asked
	}
	newSeen := func() []map[string]time.Time {
		s := make([]map[string]time.Time, agents)
		for i := range s {
			s[i] = map[string]time.Time{}
		}
		return s
	}
	at := t0.Add(10 * grace)

	// Every agent asking: N GETs a round for node-c (node-x's claim is
	// left out here, so nothing is collected yet).
	w.pods[gone.Pod] = true
	if asked := round(at, nil, newSeen()); len(asked["node-c"]) != agents {
		t.Fatalf("without Peers node-c was asked %d times in a round, want %d (every agent)", len(asked["node-c"]), agents)
	}
	delete(w.pods, gone.Pod)

	seen := newSeen()
	askers := map[string]bool{}
	collectedIn := -1
	const rounds = 40
	for r := range rounds {
		asked := round(at.Add(time.Duration(r)*grace/2), func() []string { return slices.Clone(peers) }, seen)
		for n, by := range asked {
			if len(by) > 1 {
				t.Fatalf("round %d: %s asked about by %v, want one agent at most", r, n, by)
			}
		}
		for _, by := range asked["node-c"] {
			askers[by] = true
		}
		if collectedIn < 0 && w.collected.Load() == 1 {
			collectedIn = r
		}
	}
	total := w.nodeAsks["node-c"] - agents // less the round without Peers
	if total < rounds/2 || total > rounds {
		t.Errorf("node-c asked about %d times in %d rounds, want about one a round", total, rounds)
	}
	if len(askers) < 5 {
		t.Errorf("node-c asked about by %v only: the question does not move between agents", askers)
	}
	if collectedIn < 0 {
		t.Fatal("the gone node's claim was never collected")
	}
	if _, ok := a.get(t, gone.IP.String()); ok {
		t.Fatal("the gone node's claim survived")
	}
	if _, ok := a.get(t, otherIP); !ok {
		t.Fatal("the claim of an existing node was deleted")
	}
	if n := w.collected.Load(); n != 1 {
		t.Errorf("OnCollect called %d times, want 1", n)
	}
	t.Logf("node-c: %d GETs in %d rounds by %d agents; node-x's claim collected in round %d", total, rounds, len(askers), collectedIn)
}

// Every round, exactly one agent asks about a node: never the node itself
// (whose claims are its own), and every agent agrees on which, whatever
// order its cache lists the peers in.
func TestGCAskerPicksOneOther(t *testing.T) {
	peers := []string{"n1", "n2", "n3", "n4", "n5"}
	for r := range 200 {
		now := t0.Add(time.Duration(r) * grace / 2)
		for _, holder := range append(slices.Clone(peers), "gone") {
			var by []string
			for i, me := range peers {
				shuffled := append(slices.Clone(peers[i:]), peers[:i]...)
				g := &GC{Claims: &Claims{node: me}, Peers: func() []string { return shuffled }}
				if g.asker(now, grace/2)(holder) {
					by = append(by, me)
				}
			}
			if len(by) != 1 || by[0] == holder {
				t.Fatalf("round %d: %s asked about by %v, want one other agent", r, holder, by)
			}
		}
	}
	alone := &GC{Claims: &Claims{node: "n1"}, Peers: func() []string { return []string{"n1"} }}
	if !alone.asker(t0, grace/2)("gone") {
		t.Error("the only agent does not ask")
	}
	none := &GC{Claims: &Claims{node: "n1"}, Peers: func() []string { return nil }}
	if !none.asker(t0, grace/2)("gone") {
		t.Error("with no peers known, the agent does not ask")
	}
}
