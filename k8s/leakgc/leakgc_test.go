package leakgc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

type fakeAllocs struct {
	mu   sync.Mutex
	recs map[string]Attachment
	dels []string
}

func (f *fakeAllocs) Attachments() []Attachment {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Attachment
	for _, r := range f.recs {
		out = append(out, r)
	}
	return out
}

func (f *fakeAllocs) PodAttachments(id podmeta.ID) []Attachment {
	var out []Attachment
	for _, r := range f.Attachments() {
		if r.Pod.Same(id) { // as the agent: a static pod through any mirror
			out = append(out, r)
		}
	}
	return out
}

func (f *fakeAllocs) Del(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.recs, id)
	f.dels = append(f.dels, id)
	return nil
}

func (f *fakeAllocs) deleted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.dels...)
}

type fakeAPI struct {
	mu     sync.Mutex
	exists map[string]bool
	err    error
	asked  int
}

func (f *fakeAPI) Exists(_ context.Context, id podmeta.ID) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return f.exists[id.Key()], f.err
}

func (f *fakeAPI) questions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked
}

func key(ns, name, uid string) string { return podmeta.ID{Namespace: ns, Name: name, UID: uid}.Key() }

func rec(id, ns, name, uid string) Attachment {
	return Attachment{ContainerID: id, Pod: podmeta.ID{Namespace: ns, Name: name, UID: uid}, IPs: []netip.Addr{netip.MustParseAddr("fd00::1")}}
}

func newGC(a Allocations, api *fakeAPI, grace time.Duration) (*GC, *atomic.Int32) {
	var n atomic.Int32
	g := &GC{Allocs: a, API: api, Grace: grace, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), OnCollect: func() { n.Add(1) }}
	return g, &n
}

// The tests run in a synctest bubble: the clock is fake, so a grace period
// passes exactly when the test sleeps through it, and synctest.Wait returns
// once the GC has done all it will do until the clock moves on. What must
// not happen is then known not to have happened, on any machine.

// run runs g until the test ends (or stop is called) and checks that Run
// returns nil once its context ends.
func run(t *testing.T, g *GC) (stop func()) {
	t.Helper()
	_, stop = testutil.Run(t, g.Run)
	return stop
}

// after lets d pass and the GC do what it does at that time.
func after(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func TestStartupSweepReleasesOnlyVanishedPods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &fakeAllocs{recs: map[string]Attachment{
			"c1": rec("c1", "default", "alive", "u1"),
			"c2": rec("c2", "default", "gone", "u2"),
			"c3": rec("c3", "default", "recreated", "old-uid"), // same name, new UID in the API
		}}
		api := &fakeAPI{exists: map[string]bool{key("default", "alive", "u1"): true, key("default", "recreated", "new-uid"): true}}
		const grace = 30 * time.Millisecond
		g, n := newGC(a, api, grace)
		run(t, g)
		after(grace - time.Nanosecond)
		if d := a.deleted(); len(d) != 0 {
			t.Fatalf("released %v before the grace period", d)
		}
		after(time.Nanosecond)
		got := a.deleted()
		slices.Sort(got)
		if !slices.Equal(got, []string{"c2", "c3"}) {
			t.Errorf("deleted %v, want c2 and c3", got)
		}
		if got := n.Load(); got != 2 {
			t.Errorf("collected %d, want 2", got)
		}
	})
}

func TestPodGoneWaitsForGraceAndKubeletDel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &fakeAllocs{recs: map[string]Attachment{"c1": rec("c1", "ns", "p", "u")}}
		g, _ := newGC(a, &fakeAPI{exists: map[string]bool{}}, 200*time.Millisecond)
		run(t, g)
		ctx := context.Background()
		// Startup already scheduled c1's pod; the event reschedules it.
		after(50 * time.Millisecond)
		g.PodGone(podmeta.ID{Namespace: "ns", Name: "p", UID: "u"})
		after(199 * time.Millisecond) // past the startup sweep's grace, not the event's
		if d := a.deleted(); len(d) != 0 {
			t.Fatalf("released before the grace period: %v", d)
		}
		// kubelet's DEL arrives within the grace period: nothing left to do.
		_ = a.Del(ctx, "c1")
		after(time.Second)
		if d := a.deleted(); len(d) != 1 {
			t.Errorf("GC deleted again after kubelet's DEL: %v", d)
		}
	})
}

func TestAPIErrorNeverReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &fakeAllocs{recs: map[string]Attachment{"c1": rec("c1", "ns", "p", "u")}}
		api := &fakeAPI{exists: map[string]bool{}, err: errors.New("connection refused")}
		const grace = 30 * time.Millisecond
		g, _ := newGC(a, api, grace)
		stop := run(t, g)
		after(5 * grace) // the startup sweep, then a retry every grace
		if d := a.deleted(); len(d) != 0 {
			t.Fatalf("released while the API was unreachable: %v", d)
		}
		if q := api.questions(); q != 5 {
			t.Errorf("asked the API %d times in 5 grace periods, want 5 (one each)", q)
		}
		api.mu.Lock()
		api.err = nil
		api.mu.Unlock()
		after(grace)
		if d := a.deleted(); len(d) != 1 {
			t.Errorf("deleted %v after the API came back, want c1", d)
		}
		stop()
	})
}

// lateAllocs models records committed after Run's startup sweep listed the
// store: the sweep does not see them, so only PodGone can.
type lateAllocs struct{ *fakeAllocs }

func (lateAllocs) Attachments() []Attachment { return nil }

// Defect: PodGone before Start was dropped (the GC had no context yet), and
// the GC kept a stored context and timers outside any loop. PodGone now
// queues for Run's loop, whenever it is called. Run under -race with
// PodGone racing Run's start.
func TestPodGoneConcurrentWithRunStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pods = 50
		a := &fakeAllocs{recs: map[string]Attachment{}}
		var ids []podmeta.ID
		for i := range pods {
			r := rec(fmt.Sprintf("c%d", i), "ns", fmt.Sprintf("p%d", i), "u")
			a.recs[r.ContainerID] = r
			ids = append(ids, r.Pod)
		}
		const grace = 20 * time.Millisecond
		g, n := newGC(lateAllocs{a}, &fakeAPI{exists: map[string]bool{}}, grace)
		// Half the events before Run, half while it starts.
		for _, id := range ids[:pods/2] {
			g.PodGone(id)
		}
		var wg sync.WaitGroup
		for _, id := range ids[pods/2:] {
			wg.Add(1)
			go func() { defer wg.Done(); g.PodGone(id) }()
		}
		run(t, g)
		wg.Wait()
		after(grace)
		if d := a.deleted(); len(d) != pods {
			t.Errorf("deleted %d, want %d", len(d), pods)
		}
		if got := n.Load(); got != pods {
			t.Errorf("collected %d, want %d", got, pods)
		}
	})
}

// Only the exact incarnation is released: a record of the same name with
// another UID (the pod was re-created) survives its predecessor's PodGone.
func TestPodGoneOnlyThatIncarnation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &fakeAllocs{recs: map[string]Attachment{
			"old": rec("old", "ns", "sts-0", "u1"),
			"new": rec("new", "ns", "sts-0", "u2"),
		}}
		api := &fakeAPI{exists: map[string]bool{key("ns", "sts-0", "u2"): true}}
		const grace = 20 * time.Millisecond
		g, _ := newGC(lateAllocs{a}, api, grace)
		run(t, g)
		g.PodGone(podmeta.ID{Namespace: "ns", Name: "sts-0", UID: "u1"})
		after(10 * grace)
		if d := a.deleted(); len(d) != 1 || d[0] != "old" {
			t.Errorf("deleted %v, want [old]", d)
		}
	})
}

// A record without a UID (written before UIDs were kept) belongs to an
// unknown incarnation: another UID's absence does not prove it gone, even
// if the agent's PodAllocations matches by name.
func TestRecordOfUnknownIncarnationKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := looseAllocs{&fakeAllocs{recs: map[string]Attachment{"c1": rec("c1", "ns", "p", "")}}}
		// A pod named ns/p exists (some incarnation), but not u9.
		api := &fakeAPI{exists: map[string]bool{key("ns", "p", ""): true}}
		const grace = 20 * time.Millisecond
		g, _ := newGC(a, api, grace)
		run(t, g)
		g.PodGone(podmeta.ID{Namespace: "ns", Name: "p", UID: "u9"})
		after(10 * grace)
		if d := a.deleted(); len(d) != 0 {
			t.Errorf("released %v on the absence of another incarnation", d)
		}
		if q := api.questions(); q == 0 {
			t.Error("the pod was never checked")
		}
	})
}

// looseAllocs matches PodAllocations by namespace/name only.
type looseAllocs struct{ *fakeAllocs }

func (l looseAllocs) PodAttachments(id podmeta.ID) []Attachment {
	var out []Attachment
	for _, r := range l.Attachments() {
		if r.Pod.Namespace == id.Namespace && r.Pod.Name == id.Name {
			out = append(out, r)
		}
	}
	return out
}

func TestRunValidation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if err := (&GC{}).Run(context.Background()); err == nil {
			t.Error("Run without Allocs/API: want an error")
		}
		g, _ := newGC(&fakeAllocs{}, &fakeAPI{}, time.Second)
		run(t, g)
		synctest.Wait() // Run has started: it waits for work
		if err := g.Run(context.Background()); err == nil {
			t.Error("second Run: want an error")
		}
	})
}
