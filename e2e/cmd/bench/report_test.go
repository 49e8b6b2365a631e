package main

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// A figure whose measurement failed part-way is never met, whatever the
// samples taken before the failure say; one measured within its limit is.
func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    figure
		want string
	}{
		{"met", figure{Name: "x", Value: 1, Base: math.NaN(), Unit: "ms", Max: true, Limit: 2}, "met"},
		{"over", figure{Name: "x", Value: 3, Base: math.NaN(), Unit: "ms", Max: true, Limit: 2}, "**not met**: 3.00 ms"},
		{"failed part-way", figure{Name: "x", Value: 1, Base: math.NaN(), Unit: "ms", Max: true, Limit: 2, Err: "ADD 137: boom"}, "**not met**: the measurement failed"},
		{"failed, no target", figure{Name: "x", Value: 1, Base: math.NaN(), Unit: "ms", Limit: math.NaN(), Err: "boom"}, "**failed**"},
		{"failed ratio", figure{Name: "x", Value: 1, Base: 4, Unit: "ms", Ratio: true, Max: true, Limit: 0.5, Err: "ptp: DEL 3: boom"}, "**not met**: the measurement failed"},
		{"not measured", figure{Name: "x", Value: math.NaN(), Base: math.NaN(), Unit: "ms", Max: true, Limit: 2}, "**not met**: not measured"},
		{"context", figure{Name: "x", Value: 1, Base: math.NaN(), Unit: "ms", Limit: math.NaN()}, ""},
	} {
		cells := tc.f.cells()
		if got := cells[len(cells)-1]; !strings.HasPrefix(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("%s: verdict %q, want %q", tc.name, got, tc.want)
		}
		if tc.f.Err != "" {
			if !strings.Contains(cells[1], tc.f.Err) {
				t.Errorf("%s: value cell %q lacks the error %q", tc.name, cells[1], tc.f.Err)
			}
			if cells[3] != "—" {
				t.Errorf("%s: a failed figure shows a ratio %q", tc.name, cells[3])
			}
		}
	}
}

// A report with a failed measurement says so: its row reads "not met" or
// "failed" with the error, never "met", the report says the run failed,
// and failures (the exit status) is an error naming it.
func TestReportWithAFailedMeasurement(t *testing.T) {
	figs := []figure{
		{Section: "s", Name: "fine", Value: 1, Base: 4, BaseName: "ptp", Unit: "ms", Ratio: true, Max: true, Limit: 0.5},
		// Samples taken before the failure would meet the target.
		{Section: "s", Name: "DEL p50", Value: 1, Base: 4, BaseName: "ptp", Unit: "ms", Ratio: true, Max: true, Limit: 1, Err: "flock dual-stack: DEL 17: agent gone"},
		{Section: "s", Name: "DEL throughput", Value: 900, Base: 300, Unit: "pods/s", Limit: math.NaN(), Err: "ptp IPv4-only: DELs: host veth veth1234: its deletion not announced"},
	}
	doc := render(figs, report{cmd: "test", started: time.Now(), bin: t.TempDir()})
	rows := map[string]string{}
	for _, l := range strings.Split(doc, "\n") {
		if f := strings.Split(l, " | "); len(f) == 6 {
			rows[strings.TrimPrefix(f[0], "| ")] = l
		}
	}
	if r := rows["fine"]; !strings.HasSuffix(r, "| met |") {
		t.Errorf("the measured figure: %q, want met", r)
	}
	for _, name := range []string{"DEL p50", "DEL throughput"} {
		r := rows[name]
		if r == "" {
			t.Fatalf("no row %q in\n%s", name, doc)
		}
		if strings.HasSuffix(r, "| met |") || !(strings.Contains(r, "not met") || strings.Contains(r, "failed")) {
			t.Errorf("failed figure %q renders as %q: want not met / failed", name, r)
		}
		if !strings.Contains(r, "error: ") {
			t.Errorf("failed figure %q renders without its error: %q", name, r)
		}
	}
	if !strings.Contains(doc, "**This run failed**") {
		t.Error("the report does not say the run failed")
	}
	err := failures(figs)
	if err == nil || !strings.Contains(err.Error(), "DEL p50") || !strings.Contains(err.Error(), "DEL throughput") || strings.Contains(err.Error(), "fine") {
		t.Errorf("failures = %v, want the two failed figures only", err)
	}
	if err := failures(figs[:1]); err != nil {
		t.Errorf("failures of a clean run = %v", err)
	}
	// A figure held to a target but not measured fails the run too.
	if failures([]figure{{Name: "x", Value: math.NaN(), Base: math.NaN(), Limit: 1}}) == nil {
		t.Error("an unmeasured figure with a target does not fail the run")
	}
	if !strings.Contains(doc, changesDoc) {
		t.Errorf("the report does not link %s", changesDoc)
	}
}

// Every CNI row carries the errors of both measurements it is made of:
// the DEL and throughput rows too (they used to pass none).
func TestCNIFiguresCarryErrors(t *testing.T) {
	ok := cniResult{addP50: 1, addP99: 2, delP50: 1, delP99: 2, addRate: 900, delRate: 900}
	bad := ok
	bad.err = errors.New("flock dual-stack: DEL 3: boom")
	base := cniResult{addP50: 4, addP99: 8, delP50: 4, delP99: 8, addRate: 300, delRate: 300}
	for _, f := range cniFigures("s", true, ok, ok, base, &base) {
		if f.Err != "" {
			t.Errorf("clean run: %q has error %q", f.Name, f.Err)
		}
	}
	figs := cniFigures("s", true, bad, ok, base, nil)
	var dual int
	for _, f := range figs {
		if strings.Contains(f.Name, "dual-stack") {
			dual++
			if !strings.Contains(f.Err, "boom") {
				t.Errorf("%q: error %q, want flock's", f.Name, f.Err)
			}
			if v := f.cells()[5]; v == "met" {
				t.Errorf("%q: met despite the failure", f.Name)
			}
		} else if f.Err != "" {
			t.Errorf("%q: error %q, want none (IPv4-only measured fine)", f.Name, f.Err)
		}
	}
	if dual < 5 {
		t.Errorf("%d dual-stack rows, want ADD p50/p99, DEL p50/p99 and both throughputs", dual)
	}
	pbad := base
	pbad.err = errors.New("ptp IPv4-only: ADD 9: boom")
	for _, f := range cniFigures("s", true, ok, ok, pbad, nil) {
		if !strings.Contains(f.Err, "ptp IPv4-only") {
			t.Errorf("%q: error %q, want the baseline's", f.Name, f.Err)
		}
	}
}

// The cnitool section is context: its rows have no target, however far
// from the libcni section's targets they land; the libcni section keeps
// them.
func TestCNIToolRowsHaveNoTarget(t *testing.T) {
	slow := cniResult{addP50: 9, addP99: 20, delP50: 9, delP99: 20, addRate: 10, delRate: 10}
	base := cniResult{addP50: 4, addP99: 8, delP50: 4, delP99: 8, addRate: 300, delRate: 300}
	for _, f := range cniFigures("cnitool", false, slow, slow, base, nil) {
		if !math.IsNaN(f.Limit) {
			t.Errorf("cnitool %q: target %v, want none", f.Name, f.Limit)
		}
		if f.failed() {
			t.Errorf("cnitool %q counts as failed", f.Name)
		}
	}
	targets := 0
	for _, f := range cniFigures("libcni", true, slow, slow, base, nil) {
		if !math.IsNaN(f.Limit) {
			targets++
		}
	}
	if targets == 0 {
		t.Error("the libcni section lost its targets")
	}
}
