package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// target holds a map; it can be told to fail the next n Sets.
type target struct {
	mu    sync.Mutex
	held  map[string]int
	fails int
	sets  int
	fulls int
}

func (t *target) Set(_ context.Context, d map[string]int, full bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sets++
	if full {
		t.fulls++
	}
	if t.fails > 0 {
		t.fails--
		return fmt.Errorf("injected failure (%d left)", t.fails)
	}
	t.held = maps.Clone(d)
	return nil
}

func (t *target) get() (map[string]int, int, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.held), t.sets, t.fulls
}

// source is a versioned desired set.
type source struct {
	mu   sync.Mutex
	m    map[string]int
	gen  uint64
	wake chan struct{}
}

func newSource() *source { return &source{m: map[string]int{}, wake: make(chan struct{}, 1)} }

func (s *source) desired() (map[string]int, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.m), s.gen
}

func (s *source) put(k string, v int) uint64 {
	s.mu.Lock()
	s.m[k] = v
	s.gen++
	g := s.gen
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return g
}

func run(t *testing.T, l *Loop[map[string]int]) {
	t.Helper()
	testutil.Run(t, l.Run)
}

func wait(t *testing.T, l *Loop[map[string]int], gen uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	if err := l.Wait(ctx, gen); err != nil {
		t.Fatalf("Wait(%d): %v", gen, err)
	}
}

func TestEventPathAppliesBeforeWaitReturns(t *testing.T) {
	src, tg := newSource(), &target{}
	l := &Loop[map[string]int]{Name: "t", Target: tg, Desired: src.desired, Wake: src.wake, Log: discard}
	run(t, l)
	for i := range 50 {
		gen := src.put(fmt.Sprint(i), i)
		wait(t, l, gen)
		if held, _, _ := tg.get(); held[fmt.Sprint(i)] != i {
			t.Fatalf("after Wait(%d) the target lacks key %d: %v", gen, i, held)
		}
	}
	st := l.Status()
	if st.Errors != 0 || st.Failing || st.Target != "t" || st.Passes == 0 {
		t.Errorf("Status = %+v", st)
	}
}

// A failing target is retried with back-off until it succeeds, without any
// new event; the errors are counted and the last one is kept.
func TestErrorsAreRetriedAndCounted(t *testing.T) {
	src, tg := newSource(), &target{fails: 3}
	var observed []error
	var mu sync.Mutex
	l := &Loop[map[string]int]{Name: "kernel", Target: tg, Desired: src.desired, Wake: src.wake, Log: discard,
		MinBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		Observe: func(target string, full bool, d time.Duration, err error) {
			mu.Lock()
			observed = append(observed, err)
			mu.Unlock()
		}}
	src.put("a", 1)
	run(t, l)
	// The status follows the target's Set (and Observe): wait on it.
	testutil.Eventually(t, "a successful pass", func() (bool, string) {
		st := l.Status()
		return !st.LastSuccess.IsZero(), fmt.Sprintf("%+v", st)
	})
	if held, _, _ := tg.get(); held["a"] != 1 {
		t.Errorf("target holds %v after a successful pass", held)
	}
	st := l.Status()
	if st.Errors != 3 || st.Failing || st.LastError == "" || st.LastErrorAt.IsZero() || st.LastSuccess.Before(st.LastErrorAt) {
		t.Errorf("Status after recovery = %+v, want 3 errors, not failing, last error kept", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(observed) < 4 || observed[0] == nil || observed[len(observed)-1] != nil {
		t.Errorf("observed %v", observed)
	}
}

// Wait does not hang on a pass that failed: the event path must return.
func TestWaitReturnsAfterFailedPass(t *testing.T) {
	src, tg := newSource(), &target{fails: 1 << 30}
	l := &Loop[map[string]int]{Name: "bgp", Target: tg, Desired: src.desired, Wake: src.wake, Log: discard,
		MinBackoff: time.Hour, MaxBackoff: time.Hour}
	run(t, l)
	gen := src.put("a", 1)
	wait(t, l, gen)
	if st := l.Status(); !st.Failing || st.Errors == 0 {
		t.Errorf("Status = %+v, want failing", st)
	}
	// A new event still gets a pass right away, back-off or not.
	_, before, _ := tg.get()
	wait(t, l, src.put("b", 2))
	if _, after, _ := tg.get(); after <= before {
		t.Error("an event during back-off did not run a pass")
	}
}

// The periodic repair runs full passes; Wait honours its context.
func TestRepairAndWaitContext(t *testing.T) {
	src, tg := newSource(), &target{}
	l := &Loop[map[string]int]{Name: "t", Target: tg, Desired: src.desired, Wake: src.wake, Log: discard, Repair: 5 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Wait(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait on a cancelled context before any pass = %v", err)
	}
	run(t, l)
	testutil.WaitFor(t, "periodic full passes", func() bool { _, _, fulls := tg.get(); return fulls >= 3 })
}

// Concurrent events are coalesced, and every waiter is released.
func TestConcurrentWaiters(t *testing.T) {
	src, tg := newSource(), &target{}
	l := &Loop[map[string]int]{Name: "t", Target: tg, Desired: src.desired, Wake: src.wake, Log: discard}
	run(t, l)
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait(t, l, src.put(fmt.Sprint(i), i))
		}()
	}
	wg.Wait()
	held, sets, _ := tg.get()
	if len(held) != 100 {
		t.Errorf("target holds %d keys, want 100", len(held))
	}
	t.Logf("100 events, %d passes", sets)
}
