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
// with 95 % of it, else under a share of it the machine keeps up with.
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
	r := churnRates{pods: 100, slices: 10, policies: 1}.scaled(0.25)
	if r != (churnRates{pods: 25, slices: 2.5, policies: 0.25}) {
		t.Errorf("a quarter of the churn: %+v", r)
	}
}

// What grows with the churn is projected from a paced churn to the full
// rates; what follows the state held is not.
func TestProjectedToTheFullChurn(t *testing.T) {
	rest := usage{rssMB: 50, cpuPct: 1, events: 0, watchBytes: 100, otherBytes: 10, requests: 0.5, relayEvents: 0}
	churn := usage{rssMB: 60, cpuPct: 3, events: 40, watchBytes: 2100, otherBytes: 10, requests: 0.5, relayEvents: 20}
	p := projected(rest, churn, 0.5)
	want := usage{rssMB: 60, cpuPct: 5, events: 80, watchBytes: 4100, otherBytes: 10, requests: 0.5, relayEvents: 40}
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
// met only when its measurement is above kube-proxy's projection.
func TestGoalsJudgeAPacedChurnByBounds(t *testing.T) {
	u := func(rss, cpu, kb float64) usage { return usage{rssMB: rss, cpuPct: cpu, watchBytes: kb * 1024} }
	const row = "| CPU under churn (at 50 % of the churn → projected) | "
	for _, tc := range []struct {
		policyCPU float64 // flock-policy's under churn (0 at rest); kube-proxy 2 at rest, 2.5 under churn: 3 projected
		want      string
	}{
		{1, row + "1.0 → 2.0 % of a core | 2.5 → 3.0 % of a core | ≤ kube-proxy | met |"},
		// Below kube-proxy projected to projected (4 > 3) and as
		// measured (2 < 2.5): still not judged.
		{2, row + "2.0 → 4.0 % of a core | 2.5 → 3.0 % of a core | ≤ kube-proxy | not judged: the two overlap"},
		{3.5, row + "3.5 → 7.0 % of a core | 2.5 → 3.0 % of a core | ≤ kube-proxy | **not met** |"},
	} {
		r := sizeResult{env: full.scaled(0.1), reached: 1, pace: 0.5,
			rest:  map[string]usage{procAgent: u(10, 0, 0), procPolicy: u(10, 0, 0), procProxy: u(100, 2, 4)},
			churn: map[string]usage{procAgent: u(10, 0, 0), procPolicy: u(10, tc.policyCPU, 2), procProxy: u(100, 2.5, 5)}}
		r.projected = projectedAll(r.rest, r.churn, r.pace)
		goals := goalsTable([]sizeResult{r})
		for _, want := range []string{
			tc.want,
			// Watch bytes: flock 2 → 4, kube-proxy 5 → 6.
			"| watch bytes under churn (at 50 % of the churn → projected) | 2.0 → 4.0 KB/s | 5.0 → 6.0 KB/s | ≤ kube-proxy | met |",
			"| RSS under churn (at 50 % of the churn) | 20.0 MB | 100.0 MB | ≤ kube-proxy | met |",
		} {
			if !strings.Contains(goals, want) {
				t.Errorf("flock-policy at %v %%: the goals lack %q:\n%s", tc.policyCPU, want, goals)
			}
		}
		// A paced churn that fell behind its own target (90 % of half the
		// churn: 45 % of it) is not judged.
		r.reached = 0.9
		goals = goalsTable([]sizeResult{r})
		if !strings.Contains(goals, tc.want[:strings.Index(tc.want, "≤ kube-proxy |")]+"≤ kube-proxy | not judged: below kube-proxy at 45 %") &&
			!strings.Contains(goals, tc.want[:strings.Index(tc.want, "≤ kube-proxy |")]+"≤ kube-proxy | **not met** (at 45 %") {
			t.Errorf("flock-policy at %v %%: judged under a churn that fell behind:\n%s", tc.policyCPU, goals)
		}
		if strings.Contains(goals, "| met |") != strings.Contains(goals, "| RSS at rest | 20.0 MB | 100.0 MB | ≤ kube-proxy | met |") || strings.Count(goals, "| met |") != 1 {
			t.Errorf("flock-policy at %v %%: a figure under a churn that fell behind is called met:\n%s", tc.policyCPU, goals)
		}
	}
	if got := withProjection("%.1f %%", 2, 4, 0.5); got != "2.0 % → 4.0 %" {
		t.Errorf("a paced figure reads %q", got)
	}
	if got := withProjection("%.1f %%", 2, 2, 1); got != "2.0 %" {
		t.Errorf("a figure at the full churn reads %q", got)
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
	r.projected = projectedAll(r.rest, r.churn, r.pace)
	for _, l := range strings.Split(goalsTable([]sizeResult{r}), "\n") {
		if strings.Contains(l, "CPU under churn") && strings.HasSuffix(l, "| met |") {
			t.Errorf("flock 11 %% > kube-proxy 10 %% at the full churn, called met: %s", l)
		}
	}
}

// A rest window that failed leaves nothing to project from: the figure is
// marked, not passed off as a projection, and not judged.
func TestARestErrorIsNotAProjection(t *testing.T) {
	p := projected(usage{cpuPct: 1, err: errors.New("relay counters")}, usage{cpuPct: 3}, 0.25)
	if p.err == nil {
		t.Fatalf("a paced figure whose rest failed passes as projected: %+v", p)
	}
	u := func(cpu float64) usage { return usage{cpuPct: cpu} }
	r := sizeResult{env: full.scaled(0.1), reached: 1, pace: 0.5,
		rest:  map[string]usage{procAgent: u(0), procPolicy: {err: errors.New("relay counters")}, procProxy: u(2)},
		churn: map[string]usage{procAgent: u(0), procPolicy: u(0.1), procProxy: u(2.5)}}
	r.projected = projectedAll(r.rest, r.churn, r.pace)
	goals := goalsTable([]sizeResult{r})
	if !strings.Contains(goals, "| ≤ kube-proxy | not judged: not projected: flock-policy: at rest: relay counters |") {
		t.Errorf("a size whose rest failed is judged:\n%s", goals)
	}
}

// A paced size that fell behind its own target says how much of the
// issue's churn it saw, not of its share.
func TestAPacedShortfallIsStatedAsTheIssuesChurn(t *testing.T) {
	u := func(cpu float64) usage { return usage{cpuPct: cpu} }
	r := sizeResult{env: full.scaled(0.1), reached: 0.8, pace: 0.25,
		rest:  map[string]usage{procAgent: u(0), procPolicy: u(0), procProxy: u(2)},
		churn: map[string]usage{procAgent: u(0), procPolicy: u(0.1), procProxy: u(2.5)}}
	r.projected = projectedAll(r.rest, r.churn, r.pace)
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
	if s := method(o); !strings.Contains(s, "First, for 20s (after the same 10 s)") {
		t.Errorf("the probe is not described:\n%s", s)
	}
}
