package leakgc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/agent/store"
)

type fakeAllocs struct {
	mu   sync.Mutex
	recs map[string]store.Allocation
	dels []string
}

func (f *fakeAllocs) Allocations() []store.Allocation {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Allocation
	for _, r := range f.recs {
		out = append(out, r)
	}
	return out
}

func (f *fakeAllocs) PodAllocations(id podmeta.ID) []store.Allocation {
	var out []store.Allocation
	for _, r := range f.Allocations() {
		if r.Pod == id {
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
}

func (f *fakeAPI) Exists(_ context.Context, id podmeta.ID) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exists[id.Key()], f.err
}

func key(ns, name, uid string) string { return podmeta.ID{Namespace: ns, Name: name, UID: uid}.Key() }

func rec(id, ns, name, uid string) store.Allocation {
	return store.Allocation{ContainerID: id, Pod: podmeta.ID{Namespace: ns, Name: name, UID: uid}, IPs: []netip.Addr{netip.MustParseAddr("fd00::1")}}
}

func newGC(a *fakeAllocs, api *fakeAPI) (*GC, *atomic.Int32) {
	var n atomic.Int32
	g := &GC{Allocs: a, API: api, Grace: 30 * time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), OnCollect: func() { n.Add(1) }}
	return g, &n
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStartupSweepReleasesOnlyVanishedPods(t *testing.T) {
	a := &fakeAllocs{recs: map[string]store.Allocation{
		"c1": rec("c1", "default", "alive", "u1"),
		"c2": rec("c2", "default", "gone", "u2"),
		"c3": rec("c3", "default", "recreated", "old-uid"), // same name, new UID in the API
	}}
	api := &fakeAPI{exists: map[string]bool{key("default", "alive", "u1"): true, key("default", "recreated", "new-uid"): true}}
	g, n := newGC(a, api)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g.Start(ctx)
	defer g.Stop()
	waitFor(t, func() bool { return len(a.deleted()) == 2 })
	time.Sleep(50 * time.Millisecond)
	got := a.deleted()
	if len(got) != 2 || (got[0] != "c2" && got[1] != "c2") || (got[0] != "c3" && got[1] != "c3") {
		t.Errorf("deleted %v, want c2 and c3", got)
	}
	if got := n.Load(); got != 2 {
		t.Errorf("collected %d, want 2", got)
	}
}

func TestPodGoneWaitsForGraceAndKubeletDel(t *testing.T) {
	a := &fakeAllocs{recs: map[string]store.Allocation{"c1": rec("c1", "ns", "p", "u")}}
	g, _ := newGC(a, &fakeAPI{exists: map[string]bool{}})
	g.Grace = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g.Start(ctx)
	defer g.Stop()
	// Startup already scheduled c1's pod; the event reschedules it.
	g.PodGone(podmeta.ID{Namespace: "ns", Name: "p", UID: "u"})
	time.Sleep(50 * time.Millisecond)
	if d := a.deleted(); len(d) != 0 {
		t.Fatalf("released before the grace period: %v", d)
	}
	// kubelet's DEL arrives within the grace period: nothing left to do.
	_ = a.Del(ctx, "c1")
	time.Sleep(300 * time.Millisecond)
	if d := a.deleted(); len(d) != 1 {
		t.Errorf("GC deleted again after kubelet's DEL: %v", d)
	}
}

func TestAPIErrorNeverReleases(t *testing.T) {
	a := &fakeAllocs{recs: map[string]store.Allocation{"c1": rec("c1", "ns", "p", "u")}}
	api := &fakeAPI{exists: map[string]bool{}, err: errors.New("connection refused")}
	g, _ := newGC(a, api)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g.Start(ctx)
	time.Sleep(150 * time.Millisecond) // several retries
	if d := a.deleted(); len(d) != 0 {
		t.Fatalf("released while the API was unreachable: %v", d)
	}
	api.mu.Lock()
	api.err = nil
	api.mu.Unlock()
	waitFor(t, func() bool { return len(a.deleted()) == 1 })
	g.Stop()
}
