package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A figure under a churn that fell short of its target is not called met,
// however it compares: a lighter churn flatters flock-policy.
func TestGoalsUnderAShortChurn(t *testing.T) {
	u := func(rss, cpu, kb float64) usage { return usage{rssMB: rss, cpuPct: cpu, watchBytes: kb * 1024} }
	size := func(reached float64) sizeResult {
		return sizeResult{env: full.scaled(0.1), reached: reached,
			rest:  map[string]usage{procAgent: u(10, 0, 0), procPolicy: u(10, 0, 0), procProxy: u(100, 0, 0)},
			churn: map[string]usage{procAgent: u(10, 1, 1), procPolicy: u(10, 1, 1), procProxy: u(100, 10, 10)}}
	}
	for _, tc := range []struct {
		reached float64
		want    string
	}{
		{1, "| watch bytes under churn | 2.0 KB/s | 10.0 KB/s | ≤ kube-proxy | met |"},
		// Short of the churn: bounded by its projection (2 / 0.95, 10 / 0.95).
		{0.95, "| watch bytes under churn (at 95 % of the churn → projected) | 2.0 → 2.1 KB/s | 10.0 → 10.5 KB/s | ≤ kube-proxy | met |"},
		{0.78, "| watch bytes under churn (at 78 % of the churn → projected) | 2.0 → 2.6 KB/s | 10.0 → 12.8 KB/s | ≤ kube-proxy | not judged: below kube-proxy at 78 % of the churn |"},
	} {
		var acts []*activity
		a := &activity{name: "pods"}
		a.done.Store(int64(100 * tc.reached))
		a.missed.Store(100 - int64(100*tc.reached))
		acts = append(acts, a)
		if got := acts[0].reached(); got != tc.reached {
			t.Fatalf("reached %v, want %v", got, tc.reached)
		}
		goals := goalsTable([]sizeResult{size(tc.reached)})
		if !strings.Contains(goals, tc.want) {
			t.Errorf("at %v of the churn, the goals lack %q:\n%s", tc.reached, tc.want, goals)
		}
		// At rest the churn does not count.
		if !strings.Contains(goals, "| RSS at rest | 20.0 MB | 100.0 MB | ≤ kube-proxy | met |") {
			t.Errorf("at %v of the churn, RSS at rest not judged on its own:\n%s", tc.reached, goals)
		}
	}
	if got := boundVerdict(false, true, 0.5, 0.5); got != "**not met** (at 50 % of the churn)" {
		t.Errorf("not met at half the churn: %q", got)
	}
}

// The churn a window is judged by is the one in it: what the churn did
// before the window, or missed after it, does not count.
func TestReachedSinceCountsTheWindowOnly(t *testing.T) {
	a := &activity{name: "pods"}
	a.done.Store(50)
	a.missed.Store(50) // before the window: half missed
	start := a.tally()
	a.done.Add(99)
	a.missed.Add(1)
	if got := a.reachedSince(start); got != 0.99 {
		t.Fatalf("reached %v in the window, want 0.99", got)
	}
	if got := a.reached(); got != 149.0/200 {
		t.Fatalf("reached %v overall, want %v", got, 149.0/200)
	}
	if got := a.reachedSince(a.tally()); got != 1 {
		t.Fatalf("reached %v in an empty window, want 1", got)
	}
}

// A tick whose call failed made no churn, and a tick the ticker dropped
// while the loop was late is one the churn missed: neither is reached.
func TestReachedCountsFailedAndDroppedTicks(t *testing.T) {
	a := &activity{name: "pods"}
	a.done.Store(50)
	a.failed.Store(50)
	if got := a.reached(); got != 0.5 {
		t.Errorf("half the ticks failed: reached %v, want 0.5", got)
	}
	// A tick every 50 µs: more than a ticker delivers to this loop.
	b := &activity{name: "fast"}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	const rate = 20000
	paced(ctx, rate, 1<<16, func(context.Context, int) error { return nil }, &b.done, &b.missed, &b.failed, &b.lastErr)
	if n := b.done.Load() + b.missed.Load(); float64(n) < 0.9*rate*0.2 {
		t.Errorf("%d ticks counted of about %d due: the dropped ones are not missed (reached %.2f)", n, rate/5, b.reached())
	}
}
