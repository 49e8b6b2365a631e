package main

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The model at the full envelope: the thresholds' counts, every node
// with its share of pods, no address twice, and a smaller size a prefix
// of a larger one (sizes are filled one after another).
func TestModel(t *testing.T) {
	m := newModel(1, full)
	if got := m.env.totalPods(); got != 150000 {
		t.Fatalf("pods: %d, want 150,000", got)
	}
	if n := len(m.workloads); n < 9000 || n > 11000 {
		t.Errorf("services: %d, want about 10,000", n)
	}
	if n := m.namespaces(); n < 900 || n > 1100 {
		t.Errorf("namespaces: %d, want about 1,000", n)
	}
	perNode := map[int]int{}
	seen := map[netip.Addr]int{}
	sum, biggest := 0, 0
	for _, w := range m.workloads {
		if w.first != sum {
			t.Fatalf("workload %d starts at %d, want %d", w.index, w.first, sum)
		}
		sum += w.size
		biggest = max(biggest, w.size)
		if w.size > maxEndpoints || w.size < 1 {
			t.Fatalf("workload %d: %d pods", w.index, w.size)
		}
	}
	if sum != m.env.netPods() || biggest < 200 {
		t.Fatalf("workloads cover %d pods (want %d), the biggest %d", sum, m.env.netPods(), biggest)
	}
	for k := range m.env.netPods() {
		perNode[podNode(k)]++
		v6, v4 := podIPs(k)
		for _, ip := range []netip.Addr{v6, v4} {
			if j, dup := seen[ip]; dup {
				t.Fatalf("%s: pods %d and %d", ip, j, k)
			}
			seen[ip] = k
		}
		if !netip.MustParsePrefix("198.18.0.0/15").Contains(v4) {
			t.Fatalf("pod %d: %s outside 198.18.0.0/15", k, v4)
		}
	}
	if len(perNode) != full.Nodes {
		t.Fatalf("pods on %d nodes, want %d", len(perNode), full.Nodes)
	}
	for n, c := range perNode {
		if c != full.PodsPerNode-full.HostPods {
			t.Fatalf("node %d: %d pods", n, c)
		}
	}
	small := newModel(1, full.scaled(0.1))
	if small.env.Nodes != 500 || small.env.Policies != 100 {
		t.Fatalf("a tenth: %+v", small.env)
	}
	for i, w := range small.workloads[:len(small.workloads)-1] {
		if w != m.workloads[i] {
			t.Fatalf("workload %d: %+v at a tenth, %+v in full", i, w, m.workloads[i])
		}
	}
	for k := range small.env.netPods() {
		if podNode(k) >= small.env.Nodes {
			t.Fatalf("pod %d on node %d of %d", k, podNode(k), small.env.Nodes)
		}
	}
	t.Logf("full: %d services, %d namespaces, largest %d", len(m.workloads), m.namespaces(), biggest)
}

// The plot has a line per process and flock's sum, with a point per
// size, and a failed reading is a gap, not a zero.
func TestPlot(t *testing.T) {
	u := func(rss float64) map[string]usage {
		return map[string]usage{procAgent: {rssMB: rss}, procPolicy: {rssMB: 2 * rss}, procProxy: {rssMB: 30}}
	}
	rs := []sizeResult{{env: full.scaled(0.1), rest: u(10), churn: u(10)}, {env: full.scaled(1), rest: u(20), churn: u(20)}}
	svg := plotOf(rs)
	for _, want := range []string{"flock-agent", "flock-policy", "flock (both)", "kube-proxy (baseline)", "<polyline", "RSS at rest"} {
		if !strings.Contains(svg, want) {
			t.Errorf("plot lacks %q", want)
		}
	}
	if n := strings.Count(svg, "<circle"); n != 3*4*2 {
		t.Errorf("%d points, want 24 (3 panels × 4 lines × 2 sizes)", n)
	}
	rs[1].rest[procAgent] = usage{err: errors.New("died")}
	if n := strings.Count(plotOf(rs), "<circle"); n != 24-4 {
		t.Errorf("%d points with a failed reading, want 20 (the size's rest panel is a gap for every line)", n)
	}
}

// A rack's rows: a route time over 5 s or an agent over 40 MB is not
// met, and a rack that failed says why instead of a figure.
func TestReportRack(t *testing.T) {
	out := filepath.Join(t.TempDir(), "SCALE.md")
	racks := []rackResult{
		{tor: rackTors[0], nodes: 48, pods: 250, routesWanted: 12000, sessions: 2 * time.Second, adds: 90 * time.Second, fib: 1200 * time.Millisecond, rssMedian: 30, rssMax: 35},
		{tor: rackTors[1], nodes: 48, pods: 250, routesWanted: 12000, fib: 6 * time.Second, rssMedian: 30, rssMax: 41},
		{tor: "X", nodes: 2, pods: 1, err: errors.New("ADD 0: no answer")},
	}
	if err := writeReport(options{out: out, cmd: "make scale", rackNodes: 48, rackPods: 250}, nil, racks, time.Minute); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{
		"| rack (48 × 250), BIRD | every route in the ToR's FIB after the last ADD | 1.20 s | | ≤ 5 s | met |",
		"| rack (48 × 250), BIRD | the largest agent's RSS | 35.0 MB | | ≤ 40 MB | met |",
		"| rack (48 × 250), FRR (dynamic neighbours) | every route in the ToR's FIB after the last ADD | 6.00 s | | ≤ 5 s | **not met** |",
		"| rack (48 × 250), FRR (dynamic neighbours) | the largest agent's RSS | 41.0 MB | | ≤ 40 MB | **not met** |",
		"| rack (2 × 1), X | cold start | not measured: ADD 0: no answer |",
		"No cluster size was measured",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("SCALE.md lacks %q\n%s", want, s)
		}
	}
}

// The envelope's PreferDualStack Services get an IPv4 address each: the
// IPv4 Service ranges hold them all (a full range fails the fill).
func TestServiceRangesHoldTheEnvelope(t *testing.T) {
	m := newModel(1, full)
	dual := 0
	for _, w := range m.workloads {
		if w.dualStack() {
			dual++
		}
	}
	usable := 0
	for _, p := range append([]netip.Prefix{svcV4CIDR}, extraSvcV4CIDRs...) {
		usable += 1<<(32-p.Bits()) - 2 // without the network and broadcast addresses
		for _, q := range []netip.Prefix{netip.PrefixFrom(podV4Base, 15)} {
			if p.Overlaps(q) {
				t.Errorf("Service range %s overlaps the pods' %s", p, q)
			}
		}
	}
	if dual > usable {
		t.Fatalf("%d PreferDualStack Services, %d IPv4 Service addresses", dual, usable)
	}
	t.Logf("%d PreferDualStack Services, %d IPv4 Service addresses", dual, usable)
}

// A stopped run leaves the report alone and writes what it measured
// beside it.
func TestStoppedRunWritesAside(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "SCALE.md")
	if err := os.WriteFile(out, []byte("the last complete run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{out: out, cmd: "make scale"}
	if err := writeReport(reportTo(o, true), nil, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "the last complete run\n" {
		t.Errorf("a stopped run changed %s: %q, %v", out, b, err)
	}
	for _, name := range []string{"SCALE.partial.md", "SCALE.partial.svg"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("a stopped run wrote no %s: %v", name, err)
		}
	}
	if got := reportTo(o, false).out; got != out {
		t.Errorf("a finished run writes %s, want %s", got, out)
	}
}
