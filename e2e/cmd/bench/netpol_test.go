package main

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestPct(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		var d []time.Duration
		for _, x := range xs {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	hundred := make([]time.Duration, 0, 100)
	for i := 100; i >= 1; i-- { // unsorted on purpose
		hundred = append(hundred, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		name string
		d    []time.Duration
		q    float64
		want float64
	}{
		{"one sample", ms(7), .5, 7},
		{"one sample p99", ms(7), .99, 7},
		{"median of odd", ms(3, 1, 2), .5, 2},
		{"median of even is the lower", ms(4, 1, 3, 2), .5, 2},
		{"p50 of 1..100", hundred, .5, 50},
		{"p99 of 1..100", hundred, .99, 99},
		{"p100 of 1..100", hundred, 1, 100},
		{"p0 is the least", hundred, 0, 1},
		{"microseconds kept", []time.Duration{1500 * time.Microsecond}, .5, 1.5},
	} {
		if got := pct(tc.d, tc.q); got != tc.want {
			t.Errorf("%s: pct(q=%v) = %v, want %v", tc.name, tc.q, got, tc.want)
		}
	}
	if got := pct(nil, .5); !math.IsNaN(got) {
		t.Errorf("pct of no samples = %v, want NaN", got)
	}
	d := ms(3, 1, 2)
	pct(d, .5)
	if d[0] != 3*time.Millisecond {
		t.Error("pct sorted its argument")
	}
}
func TestConnBudget(t *testing.T) {
	for _, tc := range []struct{ limit, count, want int }{
		{262144, 0, 131072},
		{262144, 100000, 31072},
		{262144, 131072, 0},
		{262144, 200000, 0},
		{0, 5, math.MaxInt}, // no limit
	} {
		if got := connBudget(tc.limit, tc.count); got != tc.want {
			t.Errorf("connBudget(%d, %d) = %d, want %d", tc.limit, tc.count, got, tc.want)
		}
	}
}

func verdict(f figure) string {
	c := f.cells()
	return c[len(c)-1]
}

func findFigure(t *testing.T, figs []figure, prefix string) figure {
	t.Helper()
	for _, f := range figs {
		if strings.HasPrefix(f.Name, prefix) {
			return f
		}
	}
	t.Fatalf("no figure %q", prefix)
	return figure{}
}

func samples(base time.Duration, n int) []time.Duration {
	d := make([]time.Duration, n)
	for i := range d {
		d[i] = base + time.Duration(i)*time.Microsecond
	}
	return d
}

func TestNetpolFigures(t *testing.T) {
	o := options{npPolicies: 100, npPods: 1000, npConnects: 2000, npRateTime: 5 * time.Second, settle: 10 * time.Second}
	const added99 = "TCP connect p99 the policies add"

	// Within the target: 0.1 ms + i µs against 0.05 ms + i µs.
	r := newNetpolResult()
	r.sel, r.unsel = samples(100*time.Microsecond, 1000), samples(50*time.Microsecond, 1000)
	r.selRate, r.unselRate = 5000, 20000
	r.rssEmpty, r.rssLoaded = 20, 30
	r.distinctSel, r.distinctUnsel = 990, 1000
	r.udpSel, r.udpUnsel = 2000, 2000
	r.changeAllow, r.changeDeny = samples(20*time.Millisecond, 20), samples(150*time.Millisecond, 20)
	r.rssMany = 45
	r.adminSel, r.adminUnsel = 4900, 15000
	r.adminOffSel, r.adminOffUnsel = 5000, 20000
	figs := netpolFigures(r, o)
	if len(figs) != 15 {
		t.Fatalf("%d figures", len(figs))
	}
	f := findFigure(t, figs, added99)
	if math.Abs(f.Value-0.05) > 1e-9 || verdict(f) != "met" {
		t.Errorf("added p99 %v, verdict %q", f.Value, verdict(f))
	}
	if f := findFigure(t, figs, "new TCP connections per second, 8"); f.Value != 5000 || f.Base != 20000 || f.cells()[3] != "0.25×" || verdict(f) == "met" {
		t.Errorf("rate: %+v, verdict %q (the target is 0.95×)", f, verdict(f))
	}
	if f := findFigure(t, figs, "new TCP connections per second from"); verdict(f) != "met" {
		t.Errorf("distinct sources at 0.99×: verdict %q", verdict(f))
	}
	if f := findFigure(t, figs, "UDP request/response"); verdict(f) != "met" {
		t.Errorf("UDP at 1×: verdict %q", verdict(f))
	}
	if f := findFigure(t, figs, "a policy change holds for new connections, p99 (allowing)"); verdict(f) != "met" {
		t.Errorf("a change allowing in 20 ms: verdict %q", verdict(f))
	}
	if f := findFigure(t, figs, "a policy change holds for new connections, p99 (taking back)"); verdict(f) == "met" {
		t.Errorf("a change taken back in 150 ms: verdict %q, want not met (100 ms)", verdict(f))
	}
	if f := findFigure(t, figs, "flock-policy RSS, loaded"); f.Value != 30 || f.Base != 20 || !strings.Contains(f.Name, "1005 pods") {
		t.Errorf("loaded RSS: %+v", f)
	}

	if f := findFigure(t, figs, "flock-policy RSS, 1000 policies"); f.Value != 45 || f.Base != 20 {
		t.Errorf("RSS with 1000 policies: %+v", f)
	}
	// With the admin policies on, against the same pod with them off.
	if f := findFigure(t, figs, "new TCP connections per second, 8 concurrent clients, to the pod the policies select, with AdminNetworkPolicy"); f.Value != 4900 || f.Base != 5000 || verdict(f) != "met" {
		t.Errorf("admin on, selected at 0.98×: %+v, verdict %q", f, verdict(f))
	}
	if f := findFigure(t, figs, "new TCP connections per second, 8 concurrent clients, to the unselected pod, with AdminNetworkPolicy"); f.Value != 15000 || f.Base != 20000 || verdict(f) == "met" {
		t.Errorf("admin on, unselected at 0.75×: %+v, verdict %q", f, verdict(f))
	}
	if f := findFigure(t, figs, "packets sent to the engine's queue"); f.Value != 0 || verdict(f) != "met" {
		t.Errorf("nothing queued: %+v, verdict %q", f, verdict(f))
	}
	r3 := r
	r3.adminQueued = 12
	if f := findFigure(t, netpolFigures(r3, o), "packets sent to the engine's queue"); verdict(f) == "met" {
		t.Errorf("12 packets queued: verdict %q", verdict(f))
	}
	// The comparison failed part-way: not met, and says why.
	r2 := r
	r2.adminErr = errors.New("boom")
	if f := findFigure(t, netpolFigures(r2, o), "new TCP connections per second, 8 concurrent clients, to the unselected pod, with AdminNetworkPolicy"); f.Err == "" || verdict(f) == "met" {
		t.Errorf("admin on without a baseline: %+v, verdict %q", f, verdict(f))
	}

	// Over the target.
	r.sel = samples(2*time.Millisecond, 1000)
	if v := verdict(findFigure(t, netpolFigures(r, o), added99)); !strings.HasPrefix(v, "**not met**: 1.95 ms") {
		t.Errorf("over the target: verdict %q", v)
	}

	// Failed part-way: whatever samples there are, never met, and
	// every latency row says so.
	r.sel = samples(100*time.Microsecond, 1000)
	r.latErr = errors.New("connect 137 to [fd00:6e70:0:1::2]:8080: i/o timeout\nlog tail")
	figs = netpolFigures(r, o)
	if v := verdict(findFigure(t, figs, added99)); v != "**not met**: the measurement failed" {
		t.Errorf("failed: verdict %q", v)
	}
	for _, f := range figs[:4] {
		if c := f.cells()[1]; !strings.HasPrefix(c, "error: connect 137") || strings.Contains(c, "\n") {
			t.Errorf("%s: cell %q", f.Name, c)
		}
	}
	if f := findFigure(t, figs, "new TCP connections"); f.Err != "" {
		t.Errorf("the rate failed with the latency: %q", f.Err)
	}

	// Nothing measured (the lab did not come up): every row an error, the
	// one with a target not met.
	r = newNetpolResult()
	r.failRest(errors.New("k8slab up: port 6443 taken"))
	figs = netpolFigures(r, o)
	for _, f := range figs {
		if f.Err == "" {
			t.Errorf("%s: no error", f.Name)
		}
		if v := verdict(f); v == "met" {
			t.Errorf("%s: met", f.Name)
		}
	}
	if v := verdict(findFigure(t, figs, added99)); v != "**not met**: the measurement failed" {
		t.Errorf("not measured: verdict %q", v)
	}

	// No samples and no error is still not a figure.
	if v := verdict(findFigure(t, netpolFigures(newNetpolResult(), o), added99)); v == "met" {
		t.Errorf("empty: verdict %q", v)
	}
}

// failRest fails only what is not measured yet: an RSS read before the
// process died stands.
func TestNetpolFailRest(t *testing.T) {
	r := newNetpolResult()
	r.rssEmpty = 21
	r.sel, r.unsel = samples(time.Millisecond, 10), samples(time.Millisecond, 10)
	r.failRest(errors.New("flock-policy exited"))
	if r.emptyErr != nil || r.latErr != nil {
		t.Errorf("measured figures failed: %v %v", r.emptyErr, r.latErr)
	}
	if r.rateErr == nil || r.loadedErr == nil {
		t.Errorf("unmeasured figures not failed: %v %v", r.rateErr, r.loadedErr)
	}
	r.failRest(nil)
	if r.rateErr == nil {
		t.Error("failRest(nil) cleared an error")
	}
}

func TestAPISections(t *testing.T) {
	for _, tc := range []struct {
		o                        options
		claims, netpol, services bool
		err                      bool
	}{
		{options{claims: true, netpol: true, services: true}, true, true, true, false},
		{options{claims: true, netpol: false}, true, false, false, false},
		{options{claims: true, netpol: true, only: "netpol"}, false, true, false, false},
		{options{claims: false, netpol: false, only: "netpol"}, false, true, false, false},
		{options{only: "claims, netpol"}, true, true, false, false},
		{options{claims: true, only: "services"}, false, false, true, false},
		{options{only: "cni"}, false, false, false, true},
	} {
		c, n, s, err := tc.o.apiSections()
		if c != tc.claims || n != tc.netpol || s != tc.services || (err != nil) != tc.err {
			t.Errorf("%+v: %v %v %v %v", tc.o, c, n, s, err)
		}
	}
}
