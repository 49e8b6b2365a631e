package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// lineOf is the table line of the document that starts with prefix.
func lineOf(t *testing.T, doc, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line %q in\n%s", prefix, doc)
	return ""
}

// Runs of the same fault are one line: n, each figure's min / median /
// max (as recorded), each run's outcome; fewer than 3 runs are marked;
// the provenance is in the header.
func TestRenderGroupsRuns(t *testing.T) {
	soak := func(up, flaps, survived string) row {
		return row{Section: "BFD", Fault: "none (soak)", ToR: "bird", Done: "BFD watched for 10s", Times: 1, Survived: survived,
			Figures: map[string]string{"BFD up after BGP established": up, "BFD or BGP flaps": flaps}, Test: "TestBFD/bird"}
	}
	restart := func(lost, back string) row {
		return row{Section: "Agent restarts under traffic", Fault: "agent SIGKILL, restarted 1 s later", ToR: "BIRD, GR + `bfd on`", Done: "pings every 20 ms", Times: 1,
			Survived: "every route stayed", Figures: map[string]string{"pings lost (pod, anycast ×2)": lost, "ToR session back after": back}}
	}
	rows := []row{
		soak("700ms", "0", "164 of 164 samples up"),
		restart("0 of 1005", "1.69s"),
		soak("998ms", "0", "164 of 164 samples up"),
		{Section: "ToR failures", Fault: "link flap", ToR: "frr", Done: "ip link set down, 2 s, up", Times: 1, Survived: "all 5 routes back",
			Figures: map[string]string{"session re-established after link up": "40ms"}},
		soak("1.2s", "1", "98 of 100 samples up"),
		restart("144 of 825", "BIRD waits out its error wait time (60 s)"),
		restart("0 of 873", "2.1s"),
		{Section: "Crash storm", Fault: "storm", ToR: "bird", Done: "d", Times: 20, Survived: "no leak", Figures: map[string]string{"kills": "20"}},
		{Section: "Crash storm", Fault: "storm", ToR: "bird", Done: "d", Times: 25, Survived: "no leak", Figures: map[string]string{"kills": "25", "only once": "3s"}},
		{Section: "Fuzzing", Fault: "arbitrary input to FuzzA", Done: "go test -fuzz FuzzA", Times: 1000, Survived: "no crash, no failure", Status: "ok"},
		{Section: "Fuzzing", Fault: "arbitrary input to FuzzB", Done: "go test -fuzz FuzzB", Times: 0, Survived: "error: the build failed: x.go:3:1: syntax error", Status: "error"},
		{Section: "Fuzzing", Fault: "arbitrary input to FuzzC", Done: "go test -fuzz FuzzC", Times: 50, Survived: "found: a failing input, written to testdata/fuzz/FuzzC/ab12", Status: "failed"},
	}
	h := header{cmd: "make reliability", meta: meta{Commit: "0123456789abcdef0123456789abcdef01234567-dirty", Started: time.Date(2026, 11, 26, 20, 0, 0, 0, time.UTC)},
		rendered: time.Date(2026, 11, 26, 23, 30, 0, 0, time.UTC), machine: "Some CPU @ 2.0GHz, 2 cores, 8 GiB, kernel 6.1.0", tors: "BIRD 2; bgpd 8"}
	var b strings.Builder
	render(&b, rows, h)
	doc := b.String()

	for _, want := range []string{
		"- commit: 0123456789abcdef0123456789abcdef01234567-dirty\n",
		"- date: 2026-11-26 20:00 UTC (rendered 2026-11-26 23:30 UTC)\n",
		"- machine: Some CPU @ 2.0GHz, 2 cores, 8 GiB, kernel 6.1.0\n",
		"**2 of 4 faults were run fewer than 3 times** (marked n<3)",
		"**2 runs ended in an error or a failure**",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the document lacks %q:\n%s", want, doc)
		}
	}
	// Three runs: n 3, no n<3 mark, min / median / max as recorded
	// (durations compared as durations: 998ms < 1.2s).
	l := lineOf(t, doc, "| none (soak) | bird |")
	for _, want := range []string{"| 3 |", "BFD up after BGP established: 700ms / 998ms / 1.2s", "BFD or BGP flaps: 0 / 0 / 1", "2×: 164 of 164 samples up · 1×: 98 of 100 samples up"} {
		if !strings.Contains(l, want) {
			t.Errorf("soak line lacks %q: %s", want, l)
		}
	}
	if strings.Contains(l, "n<3") {
		t.Errorf("three runs marked n<3: %s", l)
	}
	// A figure a run could not give as a duration is listed, not dropped.
	l = lineOf(t, doc, "| agent SIGKILL, restarted 1 s later |")
	for _, want := range []string{"| 3 |", "pings lost (pod, anycast ×2): 0 of 1005 / 0 of 873 / 144 of 825", "ToR session back after: 1.69s / 1.69s / 2.1s; also BIRD waits out its error wait time (60 s)"} {
		if !strings.Contains(l, want) {
			t.Errorf("restart line lacks %q: %s", want, l)
		}
	}
	// The column says what its cells are: how often a run applied the
	// fault, not a time.
	if !strings.Contains(doc, "| n | Faults per run | What survived (each run) |") || strings.Contains(doc, "Times (each run)") {
		t.Error("the table header does not name the faults-per-run column")
	}
	// One run, two runs: marked; a figure only some runs recorded says so;
	// Times varying per run is a range.
	if l := lineOf(t, doc, "| link flap | frr |"); !strings.Contains(l, "| **1 (n<3)** |") || !strings.Contains(l, "40ms") {
		t.Errorf("single run: %s", l)
	}
	l = lineOf(t, doc, "| storm | bird |")
	for _, want := range []string{"| **2 (n<3)** |", "| 20–25 |", "kills: 20 / 20 / 25", "only once: 3s (recorded by 1 of 2 runs)"} {
		if !strings.Contains(l, want) {
			t.Errorf("storm line lacks %q: %s", want, l)
		}
	}
	// Fuzzing: one run per target, no n; an error and a finding are marked
	// apart from a clean run, and never read as clean.
	if l := lineOf(t, doc, "| arbitrary input to FuzzA |"); !strings.HasSuffix(l, "| no crash, no failure |") {
		t.Errorf("clean fuzz run: %s", l)
	}
	if l := lineOf(t, doc, "| arbitrary input to FuzzB |"); !strings.Contains(l, "| **error**: the build failed: x.go:3:1: syntax error |") || strings.Contains(l, "no crash") {
		t.Errorf("fuzz run that ended on its own error: %s", l)
	}
	if l := lineOf(t, doc, "| arbitrary input to FuzzC |"); !strings.Contains(l, "| **FAILED**: a failing input, written to testdata/fuzz/FuzzC/ab12 |") {
		t.Errorf("fuzz finding: %s", l)
	}
	if strings.Index(doc, "## BFD") > strings.Index(doc, "## Agent restarts under traffic") {
		t.Error("sections out of their order")
	}
}

func TestStats(t *testing.T) {
	for _, tc := range []struct {
		vals []string
		want string
	}{
		{[]string{"5s"}, "5s"},
		{[]string{"3s", "1s", "2s"}, "1s / 2s / 3s"},
		{[]string{"4", "1", "3", "2"}, "1 / 2 / 4"}, // the lower middle of an even n
		{[]string{"1m2s", "900ms", "61s"}, "900ms / 61s / 1m2s"},
		{[]string{"2 of 10", "0 of 12", "1 of 9"}, "0 of 12 / 1 of 9 / 2 of 10"},
		{[]string{"0", "0", "0"}, "0 / 0 / 0"},
		{[]string{"n/a", "n/a"}, "n/a"},
		{[]string{"waited", "stuck", "waited"}, "2×: waited · 1×: stuck"},
		{[]string{"1s", "2s", "3"}, "1s / 1s / 2s; also 3"},
	} {
		if got := stats(tc.vals); got != tc.want {
			t.Errorf("stats(%q) = %q, want %q", tc.vals, got, tc.want)
		}
	}
}

// The provenance is real: a commit (and -dirty), the machine.
func TestProvenance(t *testing.T) {
	if rev := revision("RELIABILITY.md"); !regexp.MustCompile(`^([0-9a-f]{40}(-dirty)?|unknown)$`).MatchString(rev) {
		t.Errorf("revision = %q", rev)
	}
	if m := machine(); !regexp.MustCompile(`, \d+ cores, \d+ GiB, kernel \S+$`).MatchString(m) {
		t.Errorf("machine = %q", m)
	}
}

// .ci/fuzz's classification of one target's run, on fabricated go test
// output: a finding is "found", a run that ended on an error of its own
// (the build, the coordinator race, no such test) is "error", never
// clean; the row it writes carries that status, and renders as such.
func TestFuzzClassification(t *testing.T) {
	script, err := filepath.Abs("../../../.ci/fuzz")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name, out string
		rc        int
		want      string
	}{
		{"clean", `fuzz: elapsed: 0s, gathering baseline coverage: 5/5 completed, now fuzzing with 2 workers
fuzz: elapsed: 10s, execs: 561234 (56123/sec), new interesting: 0 (total: 5)
PASS
ok  	code.fritzlab.net/fritzlab/flock/ipam	10.013s
`, 0, "clean: no crash, no failure"},
		{"coordinator race", `fuzz: elapsed: 3s, execs: 155075 (0/sec), new interesting: 3 (total: 131)
--- FAIL: FuzzX (3.02s)
    context deadline exceeded
FAIL
exit status 1
FAIL	code.fritzlab.net/fritzlab/flock/ipam	3.020s
`, 1, "error: go test ended on a bare 'context deadline exceeded'"},
		{"build failed", `# code.fritzlab.net/fritzlab/flock/ipam [code.fritzlab.net/fritzlab/flock/ipam.test]
ipam/algo.go:12:2: undefined: frobnicate
FAIL	code.fritzlab.net/fritzlab/flock/ipam [build failed]
`, 1, "error: the build failed: ipam/algo.go:12:2: undefined: frobnicate"},
		{"no such fuzz test", "testing: warning: no fuzz tests to fuzz\nPASS\nok  \tcode.fritzlab.net/fritzlab/flock/ipam\t0.002s\n", 0, "error: go test fuzzed nothing (no fuzz test FuzzX)"},
		{"finding", `fuzz: elapsed: 0s, gathering baseline coverage: 3/3 completed, now fuzzing with 2 workers
fuzz: minimizing 40-byte failing input file
--- FAIL: FuzzX (0.08s)
    --- FAIL: FuzzX (0.00s)
        x_test.go:12: boom

    Failing input written to testdata/fuzz/FuzzX/771e938e4458e983
    To re-run:
    go test -run=FuzzX/771e938e4458e983
FAIL
exit status 1
FAIL	code.fritzlab.net/fritzlab/flock/ipam	0.090s
`, 1, "found: a failing input, written to testdata/fuzz/FuzzX/771e938e4458e983"},
		{"seed corpus", `failure while testing seed corpus entry: FuzzX/seed1
fuzz: elapsed: 0s, gathering baseline coverage: 1/3 completed
--- FAIL: FuzzX (0.01s)
    --- FAIL: FuzzX (0.00s)
        x_test.go:12: boom
FAIL
`, 1, "found: seed corpus entry FuzzX/seed1 fails"},
		{"test timeout", "panic: test timed out after 10m0s\n\trunning tests:\n\t\tFuzzX (10m0s)\n", 2, "error: go test panicked: test timed out after 10m0s"},
		{"other failure", "--- FAIL: FuzzX (0.00s)\n    x_test.go:9: cannot open the fixture\nFAIL\n", 1, "error: go test failed (exit status 1): x_test.go:9: cannot open the fixture"},
		{"killed", "fuzz: elapsed: 3s, execs: 10\nsignal: killed\n", 137, "error: go test exited with status 137: signal: killed"},
	} {
		out := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".out")
		if err := os.WriteFile(out, []byte(tc.out), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("bash", "-c", `source "$1" && classify "$2" FuzzX "$3"`, "classify-test", script, out, strconv.Itoa(tc.rc))
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", tc.name, err, got)
		}
		if v := strings.TrimSpace(string(got)); !strings.HasPrefix(v, tc.want) {
			t.Errorf("%s: classify = %q, want %q…", tc.name, v, tc.want)
		}
	}

	// The row a verdict becomes: valid JSON, with its status.
	for verdict, want := range map[string]struct{ status, survived string }{
		"clean: no crash, no failure":                       {"ok", "no crash, no failure"},
		"found: a failing input, written to testdata/x/1":   {"failed", "found: a failing input, written to testdata/x/1"},
		`error: the build failed: a.go:1:2: "quoted" \ x	y`: {"error", `error: the build failed: a.go:1:2: "quoted" \ x y`},
	} {
		cmd := exec.Command("bash", "-c", `source "$1" && FUZZTIME=10s row ./ipam FuzzX 7 1234 "$2"`, "row-test", script, verdict)
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("row: %v: %s", err, got)
		}
		var r row
		if err := json.Unmarshal(got, &r); err != nil {
			t.Fatalf("row %q: %v", got, err)
		}
		if r.Status != want.status || r.Survived != want.survived || r.Section != "Fuzzing" || r.Times != 1234 || r.Done != "go test -fuzz FuzzX ./ipam for 10s, from 7 seed inputs" {
			t.Errorf("row for %q = %+v, want status %q, survived %q", verdict, r, want.status, want.survived)
		}
		var b strings.Builder
		render(&b, []row{r}, header{})
		l := lineOf(t, b.String(), "| arbitrary input to FuzzX |")
		if clean := strings.HasSuffix(l, "| no crash, no failure |"); clean != (want.status == "ok") {
			t.Errorf("%s row renders as %q", want.status, l)
		}
		if want.status == "error" && !strings.Contains(l, "**error**") {
			t.Errorf("error row renders as %q", l)
		}
	}
}

// A run of some of the tests replaces their sections and keeps the
// others, marked with the run they come from; merged again, a kept
// section still names its own run.
func TestMergeSections(t *testing.T) {
	old := "# Reliability\n\n- commit: aaa\n- date: 2026-11-27 01:56 UTC (rendered x)\n\n## BFD\n\nold bfd rows\n\n## Upgrades\n\nold upgrade rows\n"
	doc := "# Reliability\n\n- commit: bbb\n- date: 2026-11-29 04:00 UTC (rendered y)\n\n## Upgrades\n\nnew upgrade rows\n"
	got := mergeSections(doc, old)
	for _, want := range []string{"- commit: bbb", "## BFD\n\n_From an earlier run (commit: aaa; date: 2026-11-27 01:56 UTC (rendered x))._\n\nold bfd rows", "## Upgrades\n\nnew upgrade rows", "keep that run's rows"} {
		if !strings.Contains(got, want) {
			t.Errorf("merged document lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "old upgrade rows") || strings.Index(got, "## BFD") > strings.Index(got, "## Upgrades") {
		t.Errorf("merged document:\n%s", got)
	}
	again := mergeSections("# Reliability\n\n- commit: ccc\n- date: d\n\n## Upgrades\n\nnewer\n", got)
	if !strings.Contains(again, "_From an earlier run (commit: aaa;") || strings.Contains(again, "commit: bbb;") {
		t.Errorf("merged twice:\n%s", again)
	}
}
