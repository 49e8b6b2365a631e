package main

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// A size is measured under the issue's churn where the machine keeps up
// with 95 % of it, else with its pods at a share of their rate the
// machine keeps up with.
func TestPaceFor(t *testing.T) {
	for _, tc := range []struct{ sustained, target, want float64 }{
		{100, 100, 1},
		{120, 100, 1},
		{95, 100, 1},
		{94, 100, 0.80}, // 84.6 % of the rates, in 5 % steps down
		{70, 100, 0.60},
		{32, 100, 0.25},
		{0, 100, 0.05},
		{5, 0, 1}, // no pods to churn: nothing to pace
	} {
		if got := paceFor(tc.sustained, tc.target); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("paceFor(%v, %v) = %v, want %v", tc.sustained, tc.target, got, tc.want)
		}
	}
	// The pods at a quarter of their rate; the rest, which the API
	// server keeps up with, at the issue's.
	r := churnRates{pods: 100, slices: 10, policies: 1}.paced(0.25)
	if r != (churnRates{pods: 25, slices: 10, policies: 1}) {
		t.Errorf("a quarter of the pod churn: %+v", r)
	}
}

// A window whose churn fell short of its target is measured again under
// 90 % of what it reached; one that kept up, or has no lower step, is not.
func TestRepace(t *testing.T) {
	for _, tc := range []struct{ pace, reached, want float64 }{
		{1, 1, 0},
		{1, 0.95, 0},
		{1, 0.90, 0.80},    // 500 nodes: the probe kept up, the window did not
		{0.75, 0.84, 0.55}, // 5,000 nodes: 63 % of the rates, 56.7 % in 5 % steps down
		{0.05, 0.5, 0},     // no lower step
		{0.1, 0.2, 0.05},
	} {
		if got := repace(tc.pace, tc.reached); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("repace(%v, %v) = %v, want %v", tc.pace, tc.reached, got, tc.want)
		}
	}
}

// What grows with the churn is projected from a paced churn to the full
// rates, RSS too (its garbage follows the churn).
func TestProjectedToTheFullChurn(t *testing.T) {
	rest := usage{rssMB: 50, cpuPct: 1, events: 0, watchBytes: 100, otherBytes: 10, requests: 0.5, relayEvents: 0}
	churn := usage{rssMB: 60, cpuPct: 3, events: 40, watchBytes: 2100, otherBytes: 10, requests: 0.5, relayEvents: 20}
	p := projected(rest, churn, 0.5)
	want := usage{rssMB: 70, cpuPct: 5, events: 80, watchBytes: 4100, otherBytes: 10, requests: 0.5, relayEvents: 40}
	if p.rssMB != want.rssMB || p.cpuPct != want.cpuPct || p.events != want.events || p.watchBytes != want.watchBytes ||
		p.otherBytes != want.otherBytes || p.requests != want.requests || p.relayEvents != want.relayEvents {
		t.Errorf("projected %+v, want %+v", p, want)
	}
	// Below rest (noise) is not projected below rest.
	if p := projected(usage{cpuPct: 2}, usage{cpuPct: 1}, 0.5); p.cpuPct != 2 {
		t.Errorf("a churn below rest projected to %v %%, want rest's 2 %%", p.cpuPct)
	}
	if p := projected(rest, churn, 1); p.cpuPct != churn.cpuPct || p.watchBytes != churn.watchBytes {
		t.Errorf("the full churn projected: %+v", p)
	}
	if got := projectedAll(nil, nil, 0.5); got != nil {
		t.Errorf("nothing measured projected to %v", got)
	}
	c := nodeCost{cpuPct: 0.1, cpuRes: 0.02, eventsSec: 30, bytesSec: 3000}.atFullChurn(0.25)
	if c != (nodeCost{cpuPct: 0.4, cpuRes: 0.08, eventsSec: 120, bytesSec: 12000}) {
		t.Errorf("a node's API server cost at the full churn: %+v", c)
	}
}

// The goals judge a paced size by bounds: each process's figure at the
// full churn lies between its measurement and its projection, so flock is
// met only when its projection is at most kube-proxy's measurement, not
// met only when its measurement is above kube-proxy's projection; a churn
// short of its own target is never met. The pace is the pods': kube-proxy,
// whose churn is the EndpointSlices' (at the issue's rate), is projected
// only by what they fell short of their target.
func TestGoalsJudgeAPacedChurnByBounds(t *testing.T) {
	u := func(rss, cpu, kb float64) usage { return usage{rssMB: rss, cpuPct: cpu, watchBytes: kb * 1024} }
	for _, tc := range []struct {
		policyCPU float64 // flock-policy's under churn (0 at rest); kube-proxy 2 at rest, 2.5 under churn
		reached   float64
		want      string
	}{
		// The pods at half their rate: kube-proxy at its full churn.
		{1, 1, "| CPU under churn (pods at 50 % of the churn → projected) | 1.0 → 2.0 % of a core | 2.5 → 2.5 % of a core | ≤ kube-proxy | met |"},
		{2, 1, "| CPU under churn (pods at 50 % of the churn → projected) | 2.0 → 4.0 % of a core | 2.5 → 2.5 % of a core | ≤ kube-proxy | not judged: the two overlap (flock's projection above kube-proxy as measured, flock as measured below kube-proxy's projection) |"},
		{3.5, 1, "| CPU under churn (pods at 50 % of the churn → projected) | 3.5 → 7.0 % of a core | 2.5 → 2.5 % of a core | ≤ kube-proxy | **not met** |"},
		// 90 % of target: the pods at 45 % of theirs, kube-proxy's slices
		// at 90 %: 2 + 0.5 / 0.9 = 2.56.
		{1, 0.9, "| CPU under churn (pods at 45 % of the churn → projected) | 1.0 → 2.2 % of a core | 2.5 → 2.6 % of a core | ≤ kube-proxy | not judged: below kube-proxy at 45 % of the churn |"},
		{2, 0.9, "| CPU under churn (pods at 45 % of the churn → projected) | 2.0 → 4.4 % of a core | 2.5 → 2.6 % of a core | ≤ kube-proxy | not judged: the two overlap, at 45 % of the churn |"},
		{3.5, 0.9, "| CPU under churn (pods at 45 % of the churn → projected) | 3.5 → 7.8 % of a core | 2.5 → 2.6 % of a core | ≤ kube-proxy | **not met** (at 45 % of the churn) |"},
	} {
		r := sizeResult{env: full.scaled(0.1), reached: tc.reached, pace: 0.5,
			rest:  map[string]usage{procAgent: u(10, 0, 0), procPolicy: u(10, 0, 0), procProxy: u(100, 2, 4)},
			churn: map[string]usage{procAgent: u(10, 0, 0), procPolicy: u(10, tc.policyCPU, 2), procProxy: u(100, 2.5, 5)}}
		goals := goalsTable([]sizeResult{r})
		if !strings.Contains(goals, tc.want) {
			t.Errorf("flock-policy at %v %%, %v of the paced churn: the goals lack %q:\n%s", tc.policyCPU, tc.reached, tc.want, goals)
		}
		if tc.reached < 1 {
			continue
		}
		for _, want := range []string{
			"| watch bytes under churn (pods at 50 % of the churn → projected) | 2.0 → 4.0 KB/s | 5.0 → 5.0 KB/s | ≤ kube-proxy | met |",
			"| RSS under churn (pods at 50 % of the churn → projected) | 20.0 → 20.0 MB | 100.0 → 100.0 MB | ≤ kube-proxy | met |",
		} {
			if !strings.Contains(goals, want) {
				t.Errorf("the goals lack %q:\n%s", want, goals)
			}
		}
		// Each process's row: flock-policy's projected by the pods' share,
		// kube-proxy's, at its full churn, not.
		if up := r.upper(); up[procPolicy].cpuPct != 2*tc.policyCPU || up[procProxy].cpuPct != 2.5 {
			t.Errorf("projected: flock-policy %v %%, kube-proxy %v %%; want %v and 2.5", up[procPolicy].cpuPct, up[procProxy].cpuPct, 2*tc.policyCPU)
		}
	}
	if got := withProjection("%.1f %%", 2, 4, 0.5); got != "2.0 % → 4.0 %" {
		t.Errorf("a paced figure reads %q", got)
	}
	if got := withProjection("%.1f %%", 2, 2, 1); got != "2.0 %" {
		t.Errorf("a figure at the full churn reads %q", got)
	}
}

// kube-proxy's watch bytes grow exactly with the churn (the API server
// sends each change as its own event): its projection is its figure at
// the full churn, and flock's projection at most that is met. Its CPU
// batches (a sync a second): the same numbers there overlap.
func TestKubeProxysWatchBytesAreItsProjection(t *testing.T) {
	u := func(cpu, kb float64) usage { return usage{rssMB: 10, cpuPct: cpu, watchBytes: kb * 1024} }
	// The churn reached 96 % of its target: the pods, at half their
	// rate, 48 % of the issue's; the slices 96 %. kube-proxy 4.8 → 5.0.
	for _, tc := range []struct {
		flock float64 // flock-policy's watch KB/s and CPU under churn (0 at rest)
		bytes string  // the watch bytes' verdict
	}{
		{2.35, "| watch bytes under churn (pods at 48 % of the churn → projected) | 2.4 → 4.9 KB/s | 4.8 → 5.0 KB/s | ≤ kube-proxy | met |"},
		{2.45, "| watch bytes under churn (pods at 48 % of the churn → projected) | 2.5 → 5.1 KB/s | 4.8 → 5.0 KB/s | ≤ kube-proxy | not judged: the two overlap"},
		{5.5, "| watch bytes under churn (pods at 48 % of the churn → projected) | 5.5 → 11.5 KB/s | 4.8 → 5.0 KB/s | ≤ kube-proxy | **not met** |"},
	} {
		r := sizeResult{env: full.scaled(0.1), reached: 0.96, proxyReached: 0.96, pace: 0.5,
			rest:  map[string]usage{procAgent: u(0, 0), procPolicy: u(0, 0), procProxy: u(0, 0)},
			churn: map[string]usage{procAgent: u(0, 0), procPolicy: u(tc.flock, tc.flock), procProxy: u(4.8, 4.8)}}
		goals := goalsTable([]sizeResult{r})
		if !strings.Contains(goals, tc.bytes) {
			t.Errorf("flock at %v KB/s: the goals lack %q:\n%s", tc.flock, tc.bytes, goals)
		}
		if tc.flock != 2.35 {
			continue
		}
		if !strings.Contains(goals, "| CPU under churn (pods at 48 % of the churn → projected) | 2.4 → 4.9 % of a core | 4.8 → 5.0 % of a core | ≤ kube-proxy | not judged: the two overlap") {
			t.Errorf("kube-proxy's CPU, which batches, taken as its projection:\n%s", goals)
		}
		// The pods fell behind (96 % of them), the slices kube-proxy
		// watches did not: kube-proxy's figure is what it was sent, not
		// that over 0.96; flock's projection above it is not met.
		behind := sizeResult{env: full.scaled(0.1), reached: 0.96, proxyReached: 1, pace: 1,
			rest:  map[string]usage{procAgent: u(0, 0), procPolicy: u(0, 0), procProxy: u(0, 0)},
			churn: map[string]usage{procAgent: u(0, 0), procPolicy: u(0, 4.9), procProxy: u(0, 5)}}
		if g := goalsTable([]sizeResult{behind}); !strings.Contains(g, "| watch bytes under churn (at 96 % of the churn → projected) | 4.9 → 5.1 KB/s | 5.0 → 5.0 KB/s | ≤ kube-proxy | not judged: the two overlap") {
			t.Errorf("pods behind, slices not:\n%s", g)
		}
	}
}

// RSS grows with the churn too: with the pods at a quarter of it,
// flock's measured RSS below kube-proxy's proves nothing.
func TestRSSUnderAPacedChurnIsBounded(t *testing.T) {
	u := func(rss float64) usage { return usage{rssMB: rss} }
	m := func(a, p, k float64) map[string]usage {
		return map[string]usage{procAgent: u(a), procPolicy: u(p), procProxy: u(k)}
	}
	// flock 40 → 48 (bound 40 + 8 / 0.25 = 72), kube-proxy 50 at its
	// full churn.
	paced := sizeResult{env: full.scaled(0.1), reached: 1, pace: 0.25, rest: m(10, 30, 45), churn: m(10, 38, 50)}
	if g := goalsTable([]sizeResult{paced}); !strings.Contains(g, "| RSS under churn (pods at 25 % of the churn → projected) | 48.0 → 72.0 MB | 50.0 → 50.0 MB | ≤ kube-proxy | not judged: the two overlap") {
		t.Errorf("RSS at a quarter of the churn:\n%s", g)
	}
}

// A baseline that batches (kube-proxy syncs at most once a second,
// whatever the changes) is not projected into a bar flock passes: flock
// 11 % against kube-proxy's 10 % at the full churn is never called met.
func TestBatchingBaselineDoesNotMakeAPacedSizeMet(t *testing.T) {
	u := func(rss, cpu float64) usage { return usage{rssMB: rss, cpuPct: cpu} }
	// At a quarter of the churn: flock-policy (linear) 1 + 10/4 = 3.5;
	// kube-proxy (one sync a second at 2.5 or 10 changes a second) 10.
	r := sizeResult{env: full.scaled(0.1), reached: 1, pace: 0.25,
		rest:  map[string]usage{procAgent: u(10, 0), procPolicy: u(10, 1), procProxy: u(100, 1)},
		churn: map[string]usage{procAgent: u(10, 0), procPolicy: u(10, 3.5), procProxy: u(100, 10)}}
	for _, l := range strings.Split(goalsTable([]sizeResult{r}), "\n") {
		if strings.Contains(l, "CPU under churn") && strings.HasSuffix(l, "| met |") {
			t.Errorf("flock 11 %% > kube-proxy 10 %% at the full churn, called met: %s", l)
		}
	}
}

// A window that failed is judged neither way: nothing to project from,
// and a process that is gone counts nothing.
func TestAFailedWindowIsNotJudged(t *testing.T) {
	p := projected(usage{cpuPct: 1, err: errors.New("relay counters")}, usage{cpuPct: 3}, 0.25)
	if p.err == nil {
		t.Fatalf("a paced figure whose rest failed passes as projected: %+v", p)
	}
	u := func(rss, cpu float64) usage { return usage{rssMB: rss, cpuPct: cpu} }
	gone := usage{err: errors.New("flock-policy is not running")}
	for _, pace := range []float64{1, 0.5} {
		for _, failed := range []string{"rest", "churn"} {
			r := sizeResult{env: full.scaled(0.1), reached: 1, pace: pace,
				rest:  map[string]usage{procAgent: u(10, 0), procPolicy: u(10, 0), procProxy: u(100, 2)},
				churn: map[string]usage{procAgent: u(10, 0), procPolicy: u(10, 0), procProxy: u(100, 2.5)}}
			map[string]map[string]usage{"rest": r.rest, "churn": r.churn}[failed][procPolicy] = gone
			judged := 0
			for _, l := range strings.Split(goalsTable([]sizeResult{r}), "\n") {
				if strings.HasSuffix(l, "| met |") || strings.Contains(l, "| **not met**") {
					if failed == "rest" || !strings.Contains(l, "RSS at rest") {
						t.Errorf("pace %v, %s failed: judged: %s", pace, failed, l)
					}
				}
				if strings.Contains(l, "not judged: flock-policy: flock-policy is not running") {
					judged++
				}
			}
			if want := map[string]int{"rest": 4, "churn": 3}[failed]; judged != want {
				t.Errorf("pace %v, %s failed: %d rows say why they are not judged, want %d", pace, failed, judged, want)
			}
		}
	}
}

// A paced size that fell behind its own target says how much of the
// issue's churn it saw, not of its share.
func TestAPacedShortfallIsStatedAsTheIssuesChurn(t *testing.T) {
	u := func(cpu float64) usage { return usage{cpuPct: cpu} }
	r := sizeResult{env: full.scaled(0.1), reached: 0.8, pace: 0.25,
		rest:  map[string]usage{procAgent: u(0), procPolicy: u(0), procProxy: u(2)},
		churn: map[string]usage{procAgent: u(0), procPolicy: u(0.1), procProxy: u(2.5)}}
	goals := goalsTable([]sizeResult{r})
	if !strings.Contains(goals, "not judged: below kube-proxy at 20 % of the churn") {
		t.Errorf("80 %% of a quarter is 20 %% of the churn:\n%s", goals)
	}
}

// A probe cut short gives no rate, and the size is not measured under a
// pace made up from it.
func TestAProbeCutShortIsNoPace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f := &filler{cs: fake.NewClientset()}
	if _, ok := f.probe(ctx, newModel(1, full.scaled(0.02)), churnRates{pods: 100, slices: 10, policies: 1}, 1, time.Second); ok {
		t.Error("a probe cut short reported a rate")
	}
}

// Without a probe the method does not describe one.
func TestMethodWithoutAProbe(t *testing.T) {
	o := options{rates: churnRates{100, 10, 1}, churnD: time.Minute}
	if s := method(o); strings.Contains(s, "First, for") || strings.Contains(s, "projected") {
		t.Errorf("no probe, but the method describes one:\n%s", s)
	}
	o.probe = 20 * time.Second
	if s := method(o); !strings.Contains(s, "First, for 20s (after the same 10 s)") || strings.Contains(s, "%!") {
		t.Errorf("the probe is not described:\n%s", s)
	}
}
