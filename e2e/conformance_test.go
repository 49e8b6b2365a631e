//go:build conformance

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// Kubernetes' own e2e suite (network tests, built from the lab's release)
// against a lab cluster with flock as its CNI, kube-proxy and CoreDNS:
// `make conformance` (-tags conformance). Kubernetes, not this file, says
// what passes. The results go to FLOCK_CONFORMANCE_OUT as JSON lines, from
// which e2e/cmd/conformance writes CONFORMANCE.md.
//
//	FLOCK_CONFORMANCE_FAMILY  ipv6 (IPv6-primary dual-stack, the default),
//	                          ipv4 (IPv4-primary dual-stack) or ipv6only
//	FLOCK_CONFORMANCE_SUITES  which specs, by name (suites below); default
//	                          "conformance netpol"
//	FLOCK_CONFORMANCE_SHARDS  e2e.test processes at once (default 3)

// suites are the spec sets a run can take, as ginkgo focus regexes.
var suites = map[string]string{
	// The 45 [sig-network] Conformance tests.
	"conformance": `\[sig-network\].*\[Conformance\]`,
	// The NetworkPolicy suite, whole.
	"netpol": `\[sig-network\] Netpol `,
	// What CI runs of it: ingress, egress, ports, named ports, namespace
	// and pod selectors, CIDR with except, UDP, policy deletion.
	"netpol-ci": `\[sig-network\] Netpol .*(` + strings.Join([]string{
		`should support a 'default-deny-ingress' policy \[`,
		`should deny egress from pods based on PodSelector`,
		`should enforce policy based on Ports \[`,
		`should allow ingress access on one named port`,
		`should enforce policy based on PodSelector and NamespaceSelector`,
		`should enforce except clause while egress access to server in CIDR block`,
		`using UDP should support a 'default-deny-ingress' policy`,
		`should stop enforcing policies after they are deleted`,
	}, "|") + `)`,
}

// suiteSkips are specs this lab cannot run, with the reason the report
// gives: nothing is skipped without one.
var suiteSkips = []struct{ re, why string }{
	{`\[Feature:SCTPConnectivity\]`, "this machine's kernel has no SCTP (socket: protocol not supported)"},
}

// conformanceNodes are the node's addresses and flock's pools per family
// setup, primary first. The node's addresses are the lab's own (on
// k8slab.LabLink), never the machine's uplink.
var conformanceNodes = map[string]struct {
	nodeIP   string
	pools    []string
	ipv4     bool
	routerID string
}{
	"ipv6":     {"fd00:0:5::2,198.19.0.2", []string{"fd00:10:99::/64", "198.51.100.0/24"}, true, "198.19.0.2"},
	"ipv4":     {"198.19.0.2,fd00:0:5::2", []string{"198.51.100.0/24", "fd00:10:99::/64"}, true, "198.19.0.2"},
	"ipv6only": {"fd00:0:5::2", []string{"fd00:10:99::/64"}, false, "198.19.0.2"},
}

const conformanceNodeConfig = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: vm
spec:
  asn: 64512
  routerID: %s
  defaults:
    ipv4: %t
  pools:
%s`

// specResult is one line of FLOCK_CONFORMANCE_OUT.
type specResult struct {
	Kind    string  `json:"kind"` // "run" or "spec"
	Family  string  `json:"family"`
	Name    string  `json:"name,omitempty"`
	State   string  `json:"state,omitempty"` // passed, failed, skipped
	Seconds float64 `json:"seconds,omitempty"`
	Reason  string  `json:"reason,omitempty"` // why skipped, or the failure
	// On the run line:
	Kube, Containerd, Commit, Date, Machine, Suites string  `json:",omitempty"`
	Wall                                            float64 `json:",omitempty"`
}

func TestConformance(t *testing.T) {
	ctx := context.Background()
	family := envOr("FLOCK_CONFORMANCE_FAMILY", "ipv6")
	node, ok := conformanceNodes[family]
	if !ok {
		t.Fatalf("FLOCK_CONFORMANCE_FAMILY=%q: want ipv6, ipv4 or ipv6only", family)
	}
	suiteNames := envOr("FLOCK_CONFORMANCE_SUITES", "conformance netpol")
	var focus []string
	for _, name := range strings.Fields(suiteNames) {
		re, ok := suites[name]
		if !ok {
			t.Fatalf("FLOCK_CONFORMANCE_SUITES: no suite %q (conformance, netpol, netpol-ci)", name)
		}
		focus = append(focus, re)
	}
	shards, err := strconv.Atoi(envOr("FLOCK_CONFORMANCE_SHARDS", "3"))
	if err != nil || shards < 1 {
		t.Fatalf("FLOCK_CONFORMANCE_SHARDS=%q: want a positive number", os.Getenv("FLOCK_CONFORMANCE_SHARDS"))
	}
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	release, err := k8slab.SelectedRelease()
	if err != nil {
		t.Fatal(err)
	}
	opts := k8slab.Options{Dir: filepath.Join(dir, "k8s"), Release: release, NodeName: k8sNode, NodeIP: node.nodeIP,
		CNIBinDir: cniBinDir, CNIConfDir: cniConfDir, Services: true, PodCIDRs: node.pools, Log: t.Logf}
	suiteDir, err := k8slab.BuildNetsuite(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	suite := filepath.Join(suiteDir, k8slab.NetsuiteBin)
	images, err := k8slab.SuiteImages(ctx, suite)
	if err != nil {
		t.Fatal(err)
	}
	prepareK8sHost(t)
	imageTar := buildFlockImage(t, root, dir)

	t.Logf("bringing up the cluster (%s, node %s)", release, node.nodeIP)
	c, err := k8slab.Up(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &k8sEnv{t: t, c: c}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.Kubectl(context.Background(), "-n", "flock-system", "logs", "ds/flock", "-c", "agent", "--tail=60")
			t.Logf("agent log:\n%s", out)
		}
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, _ = c.Kubectl(dctx, "delete", "-k", filepath.Join(root, "deploy"), "--wait=true", "--timeout=60s")
		if err := c.Down(); err != nil {
			t.Errorf("cluster teardown: %v", err)
		}
	})
	if err := c.ImportImage(ctx, imageTar); err != nil {
		t.Fatal(err)
	}
	if err := c.ImportSuiteImages(ctx, images, filepath.Join(suiteDir, "agnhost")); err != nil {
		t.Fatal(err)
	}

	t.Log("installing flock: kubectl apply -k deploy/")
	e.kubectl("apply", "-k", filepath.Join(root, "deploy"))
	var pools strings.Builder
	for _, p := range node.pools {
		fmt.Fprintf(&pools, "  - cidr: %s\n", p)
	}
	e.apply(fmt.Sprintf(conformanceNodeConfig, node.routerID, node.ipv4, pools.String()))
	e.waitPods("the flock agent", "-n", "flock-system", "-l", "app.kubernetes.io/name=flock")
	if err := c.WaitNodeReady(ctx); err != nil {
		t.Fatalf("node not Ready with flock's CNI config: %v", err)
	}

	var specs []string
	for _, f := range focus {
		got := listSpecs(t, suite, c.Kubeconfig, f, dir)
		if len(got) == 0 {
			t.Fatalf("focus %q selects no spec", f)
		}
		for _, s := range got {
			if !slices.Contains(specs, s) {
				specs = append(specs, s)
			}
		}
	}
	t.Logf("running %d specs in %d e2e.test processes", len(specs), shards)
	start := time.Now()
	results := runSpecs(t, suite, c.Kubeconfig, specs, shards, dir)
	wall := time.Since(start)

	// Kubernetes judges: every spec it ran must pass; a skip carries
	// upstream's reason or one of suiteSkips.
	var failed []string
	for _, r := range results {
		switch r.State {
		case "passed", "skipped":
		default:
			failed = append(failed, r.Name+": "+r.Reason)
		}
	}
	t.Logf("%d specs in %s: %d failed", len(results), wall.Round(time.Second), len(failed))
	writeConformance(t, family, suiteNames, release, wall, results)
	for _, f := range failed {
		t.Errorf("upstream e2e failed: %s", f)
	}
	checkNothingLeaked(t, e)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// e2eArgs are the flags every e2e.test run gets: this lab is one node of
// no cloud provider.
func e2eArgs(kubeconfig string) []string {
	return []string{"--kubeconfig=" + kubeconfig, "--provider=skeleton", "--num-nodes=1",
		"--ginkgo.no-color", "--ginkgo.timeout=2h"}
}

func skipRegex() string {
	var res []string
	for _, s := range suiteSkips {
		res = append(res, s.re)
	}
	return strings.Join(res, "|")
}

// ginkgoReport is the part of ginkgo's JSON report the results come from.
type ginkgoReport []struct {
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeText            string
		LeafNodeType            string
		State                   string
		RunTime                 time.Duration
		Failure                 struct{ Message string }
	}
}

func readReport(t *testing.T, path string) ginkgoReport {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read e2e report: %v", err)
	}
	var r ginkgoReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decode e2e report %s: %v", path, err)
	}
	return r
}

// listSpecs asks the suite (dry run) for the names focus selects, the
// suiteSkips ones included: they are reported as skipped, with why.
func listSpecs(t *testing.T, suite, kubeconfig, focus, dir string) []string {
	path := filepath.Join(dir, "specs.json")
	cmd := exec.Command(suite, append(e2eArgs(kubeconfig), "--ginkgo.dry-run", "--ginkgo.focus="+focus, "--ginkgo.json-report="+path)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("list specs: %v\n%s", err, tail(string(out), 30))
	}
	var names []string
	for _, s := range readReport(t, path) {
		for _, sp := range s.SpecReports {
			if sp.LeafNodeType == "It" && sp.State == "passed" {
				names = append(names, specName(sp.ContainerHierarchyTexts, sp.LeafNodeText))
			}
		}
	}
	return names
}

func specName(containers []string, leaf string) string {
	return strings.Join(append(slices.Clone(containers), leaf), " ")
}

// runSpecs runs specs in shards e2e.test processes at once, [Serial] ones
// alone afterwards, and returns one result per spec.
func runSpecs(t *testing.T, suite, kubeconfig string, specs []string, shards int, dir string) []specResult {
	var parallel, serial []string
	for _, s := range specs {
		if strings.Contains(s, "[Serial]") || strings.Contains(s, "[Disruptive]") {
			serial = append(serial, s)
		} else {
			parallel = append(parallel, s)
		}
	}
	groups := make([][]string, shards)
	for i, s := range parallel {
		groups[i%shards] = append(groups[i%shards], s)
	}
	var mu sync.Mutex
	var results []specResult
	run := func(i int, names []string) {
		if len(names) == 0 {
			return
		}
		quoted := make([]string, len(names))
		for j, n := range names {
			quoted[j] = regexp.QuoteMeta(n)
		}
		report := filepath.Join(dir, fmt.Sprintf("report-%d.json", i))
		logPath := filepath.Join(dir, fmt.Sprintf("e2e-%d.log", i))
		args := append(e2eArgs(kubeconfig), "--ginkgo.focus="+strings.Join(quoted, "|"),
			"--ginkgo.skip="+skipRegex(), "--ginkgo.json-report="+report)
		out, err := exec.Command(suite, args...).CombinedOutput()
		_ = os.WriteFile(logPath, out, 0o644)
		if _, serr := os.Stat(report); serr != nil {
			t.Errorf("e2e.test shard %d wrote no report (%v):\n%s", i, err, tail(string(out), 40))
			return
		}
		// The report lists every spec the binary has; those not given to
		// this shard show as skipped and are not results.
		mine := map[string]bool{}
		for _, n := range names {
			mine[n] = true
		}
		var rs []specResult
		for _, s := range readReport(t, report) {
			for _, sp := range s.SpecReports {
				if sp.LeafNodeType != "It" {
					if sp.State != "passed" && sp.State != "skipped" {
						// A suite node (BeforeSuite) failing fails its specs.
						t.Errorf("e2e.test shard %d: %s %s: %s", i, sp.LeafNodeType, sp.State, firstLine(sp.Failure.Message))
					}
					continue
				}
				name := specName(sp.ContainerHierarchyTexts, sp.LeafNodeText)
				if !mine[name] {
					continue
				}
				r := specResult{Kind: "spec", Name: name, State: sp.State, Seconds: sp.RunTime.Seconds()}
				if sp.State != "passed" {
					r.Reason = firstLine(sp.Failure.Message)
				}
				for _, sk := range suiteSkips {
					if sp.State == "skipped" && regexp.MustCompile(sk.re).MatchString(name) {
						r.Reason = sk.why
					}
				}
				rs = append(rs, r)
			}
		}
		if err != nil {
			t.Logf("e2e.test shard %d: %v (log %s)", i, err, logPath)
		}
		mu.Lock()
		results = append(results, rs...)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(i, g)
		}()
	}
	wg.Wait()
	run(shards, serial)
	// A spec no report has (its e2e.test died) failed.
	got := map[string]bool{}
	for _, r := range results {
		got[r.Name] = true
	}
	for _, s := range specs {
		if !got[s] {
			results = append(results, specResult{Kind: "spec", Name: s, State: "failed", Reason: "no result: its e2e.test process ended without reporting it"})
		}
	}
	slices.SortFunc(results, func(a, b specResult) int { return strings.Compare(a.Name, b.Name) })
	return results
}

// writeConformance appends this run to FLOCK_CONFORMANCE_OUT, if set.
func writeConformance(t *testing.T, family, suiteNames string, r k8slab.Release, wall time.Duration, results []specResult) {
	path := os.Getenv("FLOCK_CONFORMANCE_OUT")
	if path == "" {
		return
	}
	commit, _ := exec.Command("git", "describe", "--always", "--dirty", "--abbrev=12").Output()
	host, _ := os.Hostname()
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	run := specResult{Kind: "run", Family: family, Kube: r.Kube, Containerd: r.Containerd,
		Commit: strings.TrimSpace(string(commit)), Date: time.Now().UTC().Format("2006-01-02"),
		Machine: fmt.Sprintf("%s, %d cores, Linux %s", host, runtime.NumCPU(), strings.TrimSpace(string(kernel))),
		Suites:  suiteNames, Wall: wall.Seconds()}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	_ = enc.Encode(run)
	for _, res := range results {
		res.Family = family
		if err := enc.Encode(res); err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
	}
}

// checkNothingLeaked: after the suite deleted its namespaces, flock holds
// no allocation and the host no pod veth.
func checkNothingLeaked(t *testing.T, e *k8sEnv) {
	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, _ := e.c.Kubectl(ctx, "get", "pods", "-A", "--field-selector", "spec.hostNetwork=false", "-o", "name")
		pods := strings.Fields(out)
		veths := hostVeths(t)
		if len(veths) == len(pods) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("after the suite: %d pod-network pods but %d pod veths on the host: %v", len(pods), len(veths), veths)
			return
		}
		time.Sleep(2 * time.Second)
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
