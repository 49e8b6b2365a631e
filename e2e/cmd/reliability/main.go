// Command reliability renders RELIABILITY.md from the rows the e2e tests
// record (JSON lines, FLOCK_RELIABILITY_OUT): `make reliability` runs the
// fault tests (RELIABILITY_REPEATS times each) and then this. Nothing in
// RELIABILITY.md is typed by hand.
//
// A test records one row per run; rows of the same fault (section, fault,
// ToR) are one line of the document: how many runs (n), and each figure's
// min / median / max over them. A line of fewer than minRepeats runs is
// marked n<3; a row that ended in an error or a finding says so.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

type row = lab.ReliabilityRow

// minRepeats is how many runs a line needs to mean something.
const minRepeats = 3

// sections in the order the document shows them, with what each is about.
// A single section's rows are one bounded run each (a fuzz target's inputs
// are its sample), not repeated measurements.
var sections = []section{
	{name: "BFD", intro: "flock's own single-hop BFD (300 ms × 3) against each ToR: how fast it comes up, whether it stays up, what it survives."},
	{name: "ToR failures", intro: "The ToR dies, restarts, loses its link, or is replaced."},
	{name: "Agent restarts under traffic", intro: "The agent stops on purpose (SIGTERM, as in a DaemonSet rollout: BFD AdminDown first, C bit clear, no BGP Cease) or crashes (SIGKILL), and is restarted 1 s later, per ToR configuration, while the ToR pings a pod and an anycast address (IPv6 and IPv4) every 20 ms. \"Withdrawn\" counts the node's prefixes that left the ToR's FIB at any sample (every 20 ms). The configurations deploy/tor ships are the recommended ones (`bfd graceful` for BIRD, `bfd check-control-plane-failure` for FRR)."},
	{name: "Kubernetes node", intro: "The node's Ready condition through what the agent lives through on a real node (kubelet, containerd 2 asking the CNI plugin for STATUS), sampled every 250 ms. The ToR column carries the container runtime."},
	{name: "NetworkPolicy", intro: "flock-policy (kube-network-policies' engine as the judge, its verdicts compiled into nftables) or the agent stops or crashes while one pod that a NetworkPolicy allows and one it blocks each open a new connection to a selected pod every 200 ms. A blocked connection let through is a failure, and so is an allowed one refused: the kernel's rules keep deciding while flock-policy is down."},
	{name: "Services under load", intro: "A LoadBalancer Service (externalTrafficPolicy Local, an IPv6 and an IPv4 address assigned by flock, advertised to a BIRD ToR) in front of two pods, with kube-proxy (nftables) delivering, while the ToR opens a new connection to it every 20 ms, both families in turn, through each fault. A request that fails, a path the ToR loses at any sample (every 100 ms) or an address that changes is a failure, with one exception the fabric makes: where pods move between nodes (rolling update, drain), a request in flight at the very instant the ToR moves its route (the draining node leaves its ECMP set, taken from the ToR's netlink) continues to the other node, which has no state for it and resets it; those are counted apart. After an agent or assigner restart the ToR's route must not change at all."},
	{name: "Upgrades", intro: "flock's DaemonSet rolled from one release to another (`kubectl apply -k` of the other release's deploy/) on two nodes behind a BIRD ToR, with kube-proxy (nftables), while new connections are opened all the time: from the ToR to pods on both nodes (both families, and an `addresses` IP), from pods on each node to pods on the other, and, where both releases have them, to a LoadBalancer address (externalTrafficPolicy Local). A request that fails, a prefix the ToR loses (at a 100 ms sample or in its kernel), a pod IP or AddressClaim that changes, a node NotReady at any 250 ms sample, or a connection a NetworkPolicy blocks let through is a failure. Allowed connections to a pod a NetworkPolicy selects are counted apart: while flock-policy restarts they may be refused (see NetworkPolicy)."},
	{name: "Crash storm", intro: "Pods added and deleted concurrently while the agent is SIGKILLed at random moments and restarted."},
	{name: "Fuzzing", single: true, intro: "go test -fuzz targets, each run once for a bounded time (Inputs: inputs executed); every crasher found became a regression test in the seed corpus. A run that ended on an error of its own (the build, Go's fuzzing coordinator) is an **error**, not a clean run: nothing says its inputs were all tried."},
}

type section struct {
	name, intro string
	single      bool
}

// meta is what the rows were made from: the commit and when the run
// began (-stamp writes it before the tests; -meta reads it).
type meta struct {
	Commit  string    `json:"commit"`
	Started time.Time `json:"started"`
}

// header is the document's provenance.
type header struct {
	cmd      string
	meta     meta
	rendered time.Time
	machine  string
	tors     string
}

func main() {
	in := flag.String("in", "", "rows (JSON lines) recorded by the tests")
	out := flag.String("out", "RELIABILITY.md", "the document to write")
	cmdline := flag.String("cmd", "make reliability", "the command that produced the rows (named in the document)")
	stamp := flag.String("stamp", "", "write the commit and the time to this file and exit (before the tests run)")
	metaIn := flag.String("meta", "", "the file -stamp wrote when the rows' run began (default: the commit and time now)")
	merge := flag.Bool("merge", false, "keep the sections of the document (-out) that the rows have none of, marked with the commit they were rendered at (a run of some of the tests)")
	flag.Parse()
	now := time.Now()
	if *stamp != "" {
		b, _ := json.Marshal(meta{Commit: revision(*out), Started: now})
		if err := os.WriteFile(*stamp, append(b, '\n'), 0o644); err != nil {
			fail(err)
		}
		return
	}
	m := meta{Commit: revision(*out), Started: now}
	if *metaIn != "" {
		b, err := os.ReadFile(*metaIn)
		if err != nil {
			fail(err)
		}
		if err := json.Unmarshal(b, &m); err != nil {
			fail(fmt.Errorf("%s: %w", *metaIn, err))
		}
	}
	f, err := os.Open(*in)
	if err != nil {
		fail(err)
	}
	defer f.Close()
	rows, err := read(f)
	if err != nil {
		fail(err)
	}
	if len(rows) == 0 {
		fail(fmt.Errorf("%s: no rows (did the tests run with FLOCK_RELIABILITY_OUT?)", *in))
	}
	h := header{cmd: *cmdline, meta: m, rendered: now, machine: machine(),
		tors: version("bird", "--version") + "; " + version("/usr/lib/frr/bgpd", "--version")}
	var b strings.Builder
	render(&b, rows, h)
	doc := b.String()
	if *merge {
		old, err := os.ReadFile(*out)
		if err != nil {
			fail(fmt.Errorf("-merge: %w", err))
		}
		doc = mergeSections(doc, string(old))
	}
	if err := os.WriteFile(*out, []byte(doc), 0o644); err != nil {
		fail(err)
	}
	fmt.Printf("%s: %d rows\n", *out, len(rows))
}

// mergeSections adds to doc (a fresh rendering) the sections of old (the
// document before) that doc lacks, in the order of sections, each marked
// with the commit and date old was made from: a run of some of the
// tests replaces their sections and keeps the others' earlier rows.
func mergeSections(doc, old string) string {
	parse := func(s string) (head string, secs map[string]string) {
		secs = map[string]string{}
		parts := strings.Split(s, "\n## ")
		head = parts[0]
		for _, p := range parts[1:] {
			name, _, _ := strings.Cut(p, "\n")
			secs[name] = "## " + p
		}
		return head, secs
	}
	oldHead, oldSecs := parse(old)
	newHead, newSecs := parse(doc)
	from := ""
	for _, l := range strings.Split(oldHead, "\n") {
		if strings.HasPrefix(l, "- commit: ") || strings.HasPrefix(l, "- date: ") {
			from += strings.TrimPrefix(l, "- ") + "; "
		}
	}
	from = strings.TrimSuffix(from, "; ")
	names := make([]string, 0, len(sections))
	for _, sec := range sections {
		names = append(names, sec.name)
	}
	for _, n := range slices.Sorted(maps.Keys(oldSecs)) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	var b strings.Builder
	b.WriteString(strings.TrimRight(newHead, "\n") + "\n")
	kept := false
	for _, n := range names {
		switch {
		case newSecs[n] != "":
			b.WriteString("\n" + strings.TrimRight(newSecs[n], "\n") + "\n")
		case oldSecs[n] != "":
			kept = true
			title, rest, _ := strings.Cut(oldSecs[n], "\n")
			rest = strings.Trim(rest, "\n")
			if !strings.HasPrefix(rest, "_From an earlier run") { // else it names its own run already
				rest = fmt.Sprintf("_From an earlier run (%s)._\n\n%s", from, rest)
			}
			fmt.Fprintf(&b, "\n%s\n\n%s\n", title, rest)
		}
	}
	if kept {
		return strings.Replace(b.String(), "\n- date: ", "\n- sections marked \"from an earlier run\" keep that run's rows\n- date: ", 1)
	}
	return b.String()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "reliability:", err)
	os.Exit(1)
}

func read(r io.Reader) ([]row, error) {
	var rows []row
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var x row
		if err := json.Unmarshal([]byte(line), &x); err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		rows = append(rows, x)
	}
	return rows, sc.Err()
}

func command(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func version(args ...string) string {
	out, err := command(args...)
	if err != nil {
		return "unknown"
	}
	return strings.SplitN(out, "\n", 2)[0]
}

// revision is the commit (git rev-parse HEAD), "-dirty" if a tracked file
// other than the document itself differs from it.
func revision(doc string) string {
	rev, err := command("git", "rev-parse", "HEAD")
	if err != nil {
		return "unknown"
	}
	st, err := command("git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)"+doc)
	if err != nil || st != "" {
		rev += "-dirty"
	}
	return rev
}

// machine is the CPU model, the cores, the memory and the kernel.
func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		first, _, _ := strings.Cut(string(b), "\n")
		fmt.Sscanf(strings.TrimPrefix(first, "MemTotal:"), "%d", &kb)
		mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
	}
	kernel, err := command("uname", "-r")
	if err != nil {
		kernel = "unknown"
	}
	return fmt.Sprintf("%s, %d cores%s, kernel %s", cpu, runtime.NumCPU(), mem, kernel)
}

// group is the rows of one fault (section, fault, ToR): one per run.
type group struct {
	section, fault, tor string
	rows                []row
}

// groups gathers rows by fault, in the order each fault first appears.
func groups(rows []row) []*group {
	var gs []*group
	idx := map[[3]string]*group{}
	for _, r := range rows {
		k := [3]string{r.Section, r.Fault, r.ToR}
		g := idx[k]
		if g == nil {
			g = &group{section: r.Section, fault: r.Fault, tor: r.ToR}
			idx[k] = g
			gs = append(gs, g)
		}
		g.rows = append(g.rows, r)
	}
	return gs
}

func render(b *strings.Builder, rows []row, h header) {
	fmt.Fprintf(b, "# Reliability\n\n")
	fmt.Fprintf(b, "Generated by `%s` from the fault tests' own output (e2e/reliability_test.go records each row; e2e/cmd/reliability renders them). Do not edit by hand.\n\n", h.cmd)
	fmt.Fprintf(b, "- commit: %s\n", h.meta.Commit)
	fmt.Fprintf(b, "- date: %s (rendered %s)\n", h.meta.Started.UTC().Format("2006-01-02 15:04 MST"), h.rendered.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(b, "- machine: %s\n", h.machine)
	fmt.Fprintf(b, "- ToRs: %s. Every fault runs in network namespaces on one machine, against real daemons.\n\n", h.tors)
	fmt.Fprintf(b, "Each fault is run n times (the same test, `go test -count`); a line gives each figure as min / median / max over the runs (the median of an even n is the lower middle run), and each run's outcome. Faults per run is how often one run applied the fault (a range where the runs differ: a crash storm's rounds). A line of fewer than %d runs is marked **n<%d**: too few to mean much.\n\n", minRepeats, minRepeats)

	known := map[string]bool{}
	order := slices.Clone(sections)
	for _, s := range sections {
		known[s.name] = true
	}
	for _, r := range rows {
		if !known[r.Section] {
			known[r.Section] = true
			order = append(order, section{name: r.Section})
		}
	}
	gs := groups(rows)
	var few, bad int
	for _, g := range gs {
		if !single(g.section) && len(g.rows) < minRepeats {
			few++
		}
		for _, r := range g.rows {
			if status(r) != "" {
				bad++
			}
		}
	}
	if few > 0 {
		fmt.Fprintf(b, "**%d of %d faults were run fewer than %d times** (marked n<%d).\n\n", few, countFaults(gs), minRepeats, minRepeats)
	}
	if bad > 0 {
		fmt.Fprintf(b, "**%d runs ended in an error or a failure** (marked **error** or **FAILED**).\n\n", bad)
	}
	for _, s := range order {
		var in []*group
		for _, g := range gs {
			if g.section == s.name {
				in = append(in, g)
			}
		}
		if len(in) == 0 {
			continue
		}
		fmt.Fprintf(b, "## %s\n\n", s.name)
		if s.intro != "" {
			fmt.Fprintf(b, "%s\n\n", s.intro)
		}
		if s.single {
			fmt.Fprintf(b, "| Target | What was done | Inputs | Outcome |\n| --- | --- | --- | --- |\n")
			for _, g := range in {
				for _, r := range g.rows {
					fmt.Fprintf(b, "| %s | %s | %d | %s |\n", cell(r.Fault), cell(r.Done), r.Times, cell(outcome(r)))
				}
			}
			fmt.Fprintln(b)
			continue
		}
		fmt.Fprintf(b, "| Fault | ToR | What was done | n | Faults per run | What survived (each run) | Figures: min / median / max |\n| --- | --- | --- | --- | --- | --- | --- |\n")
		for _, g := range in {
			tor := g.tor
			if tor == "" {
				tor = "–"
			}
			var done, survived []string
			var times []float64
			for _, r := range g.rows {
				done = append(done, r.Done)
				survived = append(survived, outcome(r))
				times = append(times, float64(r.Times))
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s |\n", cell(g.fault), cell(tor), cell(variants(done)), nCell(len(g.rows)), timesCell(times), cell(variants(survived)), cell(figures(g.rows)))
		}
		fmt.Fprintln(b)
	}
}

func single(name string) bool {
	for _, s := range sections {
		if s.name == name {
			return s.single
		}
	}
	return false
}

func countFaults(gs []*group) int {
	n := 0
	for _, g := range gs {
		if !single(g.section) {
			n++
		}
	}
	return n
}

// status is "error" or "failed" for a run that did not end clean.
func status(r row) string {
	switch r.Status {
	case "", "ok":
		return ""
	}
	return r.Status
}

// outcome is what survived, or the error or failure the run ended on,
// marked so that it cannot read as clean.
func outcome(r row) string {
	switch status(r) {
	case "":
		return r.Survived
	case "error":
		return "**error**: " + strings.TrimPrefix(r.Survived, "error: ")
	case "failed":
		return "**FAILED**: " + strings.TrimPrefix(strings.TrimPrefix(r.Survived, "found: "), "failed: ")
	default:
		return "**" + r.Status + "**: " + r.Survived
	}
}

func nCell(n int) string {
	if n < minRepeats {
		return fmt.Sprintf("**%d (n<%d)**", n, minRepeats)
	}
	return strconv.Itoa(n)
}

func timesCell(t []float64) string {
	lo, hi := slices.Min(t), slices.Max(t)
	if lo == hi {
		return strconv.FormatFloat(lo, 'f', -1, 64)
	}
	return fmt.Sprintf("%s–%s", strconv.FormatFloat(lo, 'f', -1, 64), strconv.FormatFloat(hi, 'f', -1, 64))
}

// variants is the one value every run gave, else each distinct value
// with how many runs gave it, in the order they first came.
func variants(vals []string) string {
	var order []string
	count := map[string]int{}
	for _, v := range vals {
		if count[v] == 0 {
			order = append(order, v)
		}
		count[v]++
	}
	if len(order) == 1 {
		return order[0]
	}
	parts := make([]string, len(order))
	for i, v := range order {
		parts[i] = fmt.Sprintf("%d×: %s", count[v], v)
	}
	return strings.Join(parts, " · ")
}

// figures is each figure's min / median / max over the runs (of the runs
// that recorded it), by the quantity it starts with (a duration or a
// number: "596ms", "0 of 1005"); a value without one is listed as it is.
func figures(rows []row) string {
	keys := map[string]bool{}
	for _, r := range rows {
		for k := range r.Figures {
			keys[k] = true
		}
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	var out []string
	for _, k := range sorted {
		var vals []string
		for _, r := range rows {
			if v, ok := r.Figures[k]; ok {
				vals = append(vals, v)
			}
		}
		s := k + ": " + stats(vals)
		if len(vals) < len(rows) {
			s += fmt.Sprintf(" (recorded by %d of %d runs)", len(vals), len(rows))
		}
		out = append(out, s)
	}
	return strings.Join(out, "; ")
}

// stats is min / median / max of vals by their leading quantity (each
// shown as recorded); the values without one follow.
func stats(vals []string) string {
	type sample struct {
		v string
		q float64
	}
	byKind := map[string][]sample{}
	var text []string
	for _, v := range vals {
		if kind, q := quantity(v); kind != "" {
			byKind[kind] = append(byKind[kind], sample{v, q})
		} else {
			text = append(text, v)
		}
	}
	// Durations and plain numbers do not compare: the kind most runs
	// gave is ordered, the other listed.
	ordered, other := byKind["duration"], byKind["number"]
	if len(other) > len(ordered) {
		ordered, other = other, ordered
	}
	for _, s := range other {
		text = append(text, s.v)
	}
	var parts []string
	switch len(ordered) {
	case 0:
	case 1:
		parts = append(parts, ordered[0].v)
	default:
		slices.SortStableFunc(ordered, func(a, b sample) int { return cmp.Compare(a.q, b.q) })
		n := len(ordered)
		parts = append(parts, ordered[0].v+" / "+ordered[(n-1)/2].v+" / "+ordered[n-1].v)
	}
	if len(text) > 0 {
		t := variants(text)
		if len(parts) > 0 {
			t = "also " + t
		}
		parts = append(parts, t)
	}
	return strings.Join(parts, "; ")
}

// quantity reads the quantity a figure starts with: a Go duration
// ("1.731s") or a number ("0" of "0 of 1005").
func quantity(v string) (kind string, q float64) {
	f := strings.Fields(v)
	if len(f) == 0 {
		return "", 0
	}
	tok := strings.TrimRight(f[0], ",;:")
	if d, err := time.ParseDuration(tok); err == nil && tok != "0" {
		return "duration", float64(d)
	}
	if x, err := strconv.ParseFloat(tok, 64); err == nil && !math.IsNaN(x) && !math.IsInf(x, 0) {
		return "number", x
	}
	return "", 0
}

func cell(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ") }
