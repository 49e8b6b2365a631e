// Command scale measures what flock costs each node, and the API server,
// as a cluster grows to Kubernetes' scalability envelope: the lab's
// kube-apiserver and etcd are filled straight through the API with the
// objects of a 5,000-node cluster (in steps: the sizes), and one real
// node runs flock-agent, flock-policy and kube-proxy (the baseline)
// against it, at rest and under churn. It writes SCALE.md (make scale).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/e2e/hostinfo"
	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000")+" scale: "+format+"\n", args...)
}

type options struct {
	out, binDir, cmd, dir string
	sizes                 []float64
	seed                  uint64
	workers               int
	settle, rest, churnD  time.Duration
	rates                 churnRates
	cniPods               int
	readyTimeout          time.Duration
	// rackNodes agents × rackPods pods cold-start against each ToR (0: no
	// rack).
	rackNodes, rackPods int
	// profiles, if set, is where flock-policy's and flock-agent's CPU
	// profiles under churn and heap profiles at rest are saved
	// (flock-policy's admin socket is on then).
	profiles string
	// fanout are the counts of copies of a node's watches the API
	// server is measured with under churn (empty: not measured); fanoutD
	// is each window.
	fanout  []int
	fanoutD time.Duration
	// probe is how long the churn runs at the rates to learn
	// what this machine sustains (0: every size is measured under the
	// issue's rates, whatever it keeps up with).
	probe time.Duration
	// rev is the commit measured, read when the run starts (a commit made
	// while it runs is not what it measured).
	rev string
}

func main() {
	var o options
	var sizes string
	flag.StringVar(&o.out, "out", "SCALE.md", "where to write the report")
	flag.StringVar(&o.binDir, "bin", "bin", "the flock binaries as shipped (make build)")
	flag.StringVar(&o.cmd, "cmd", "make scale", "the command named in the report")
	flag.StringVar(&o.dir, "dir", "", "working directory (default: a new one under /tmp, removed at the end)")
	flag.StringVar(&sizes, "sizes", "0.1,0.34,1", "cluster sizes, fractions of the envelope (5,000 nodes), filled in this order (each a whole number of 100-node groups)")
	flag.Uint64Var(&o.seed, "seed", 1, "the model cluster's seed")
	flag.IntVar(&o.workers, "workers", 48, "concurrent writers while filling")
	flag.DurationVar(&o.settle, "settle", 20*time.Second, "wait after the processes are ready before measuring")
	flag.DurationVar(&o.rest, "rest", 60*time.Second, "the at-rest window")
	flag.DurationVar(&o.churnD, "churn", 60*time.Second, "the churn window")
	flag.Float64Var(&o.rates.pods, "pod-rate", 100, "pods created (and deleted) a second, cluster-wide, under churn")
	flag.Float64Var(&o.rates.slices, "slice-rate", 10, "EndpointSlice changes a second under churn")
	flag.Float64Var(&o.rates.policies, "policy-rate", 1, "NetworkPolicy changes a second under churn")
	flag.DurationVar(&o.probe, "churn-probe", 20*time.Second, "how long the churn runs at the full rates first to learn what the machine sustains; below 95 % of them, the size is measured under a share of them it keeps up with and projected (0: always the full rates)")
	flag.IntVar(&o.cniPods, "cni-pods", 10, "pods ADDed and DELed on the node to count the API requests of each")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 10*time.Minute, "how long a process may take to be ready")
	flag.IntVar(&o.rackNodes, "rack-nodes", 48, "agents in the rack cold start (0: none)")
	flag.IntVar(&o.rackPods, "rack-pods", 250, "pods a node in the rack cold start")
	flag.StringVar(&o.profiles, "profiles", "", "save flock-policy's CPU and allocation profiles and flock-agent's and this process's CPU profiles under churn, and both's heap profiles at rest, here (go tool pprof reads them); empty: none")
	var fanout string
	flag.StringVar(&fanout, "fanout", "5,10", "the API server's side: copies of one node's watches (flock's, then kube-proxy's) it is measured with under churn, each count a window; empty: not measured")
	flag.DurationVar(&o.fanoutD, "fanout-window", 30*time.Second, "each fan-out window")
	flag.Parse()
	var err error
	if o.fanout, err = parseCounts(fanout); err != nil {
		fmt.Fprintf(os.Stderr, "scale: -fanout: %v\n", err)
		os.Exit(2)
	}
	for _, s := range strings.Split(sizes, ",") {
		if sizes == "" {
			break // the rack alone
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || f <= 0 || f > 1 {
			fmt.Fprintf(os.Stderr, "scale: -sizes: %q is not a fraction in (0, 1]\n", s)
			os.Exit(2)
		}
		o.sizes = append(o.sizes, f)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "scale: must run as root (network namespaces, BIRD, kube-apiserver)")
		os.Exit(2)
	}
	o.rev = hostinfo.Revision(o.out)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// parseCounts reads "5,10": positive counts ("" none).
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if s == "" {
			break
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// sizeResult is one size's figures.
type sizeResult struct {
	env      envelope
	services int
	fill     time.Duration // filling up to it (from the last size)
	objects  int64         // writes made to fill it
	ready    map[string]time.Duration
	rest     map[string]usage
	churn    map[string]usage
	activity []string // what the churn and the background achieved
	// reached is the least share of its target rate a churn activity
	// achieved (1 when every tick was served).
	reached float64
	// proxyReached is the share the activity kube-proxy watches reached
	// (0: not known, reached).
	proxyReached float64
	// pace is the share of the pod rate the churn ran at (its
	// EndpointSlice and NetworkPolicy changes ran at theirs), and
	// sustained the pods a second the probe at the full rates completed
	// (0: no probe).
	pace, sustained float64
	fanout          []fanoutRow
	cni             cniCost
	err             error
}

func run(ctx context.Context, o options) error {
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "flock-scale-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	start := time.Now()
	var racks []rackResult
	if o.rackNodes > 0 && o.rackPods > 0 {
		for _, tor := range rackTors {
			k := rackColdStart(ctx, o, dir, tor, o.rackNodes, o.rackPods)
			if k.err != nil {
				logf("rack, %s: %v", tor, k.err)
			}
			racks = append(racks, k)
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	if len(o.sizes) == 0 {
		return writeReport(reportTo(o, ctx.Err() != nil), nil, racks, time.Since(start))
	}
	c, err := k8slab.Up(ctx, k8slab.Options{Dir: filepath.Join(dir, "k8s"), APIOnly: true, KubeProxy: true, Log: logf,
		ServiceCIDRs: []string{svcV6CIDR.String(), svcV4CIDR.String()}, EtcdQuotaBytes: 8 << 30})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Down(); err != nil {
			logf("k8slab down: %v", err)
		}
	}()
	root, err := lab.RepoRoot()
	if err != nil {
		return err
	}
	if out, err := c.Kubectl(ctx, "apply", "-f", filepath.Join(root, "deploy", "crd")); err != nil {
		return fmt.Errorf("apply CRDs: %w\n%s", err, out)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 1e5, 1e5 // the filler paces itself by its workers
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, ns := range []string{"flock-system", "kube-system"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); ignoreExists(err) != nil {
			return err
		}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}, metav1.CreateOptions{}); ignoreExists(err) != nil {
			return err
		}
	}
	// CRDs take a moment to be served.
	for i := 0; ; i++ {
		if _, err := dyn.Resource(nodeConfigGVR).List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
			break
		} else if i > 60 {
			return fmt.Errorf("NodeConfigs not served: %w", err)
		}
		time.Sleep(time.Second)
	}
	node, err := upNode(ctx, c, filepath.Join(dir, "node"), o.binDir, "fs")
	if err != nil {
		return err
	}
	defer node.close()
	if o.profiles != "" {
		node.policyAdmin = filepath.Join(dir, "node", "policy-admin.sock")
	}
	if err := node.register(ctx, cs, c); err != nil {
		return err
	}
	lctx, stopLease := context.WithCancel(ctx)
	defer stopLease()
	go holdLoadBalancerLease(lctx, cs)
	f := &filler{cs: cs, dyn: dyn, workers: o.workers}
	var results []sizeResult
	for _, frac := range o.sizes {
		m := newModel(o.seed, full.scaled(frac))
		r := measureSize(ctx, o, f, m, node)
		results = append(results, r)
		if r.err != nil {
			logf("%d nodes: %v", m.env.Nodes, r.err)
			break
		}
	}
	o = reportTo(o, ctx.Err() != nil)
	if ctx.Err() != nil {
		logf("stopped: what was measured goes to %s", o.out)
	}
	return writeReport(o, results, racks, time.Since(start))
}

// reportTo is o writing its report where a stopped run must: beside the
// report (name.partial.md and .svg), which a run that did not finish
// must not replace.
func reportTo(o options, stopped bool) options {
	if stopped {
		o.out = strings.TrimSuffix(o.out, ".md") + ".partial.md"
	}
	return o
}

// measureSize fills the API up to m and measures the node there.
func measureSize(ctx context.Context, o options, f *filler, m *model, node *measuredNode) (r sizeResult) {
	r.env, r.services = m.env, len(m.workloads)
	logf("size: %d nodes, %d pods, %d services, %d policies", m.env.Nodes, m.env.totalPods(), len(m.workloads), m.env.Policies)
	for _, p := range procNames {
		node.stop(p)
	}
	before := f.objects.Load()
	t0 := time.Now()
	if r.err = f.fill(ctx, m); r.err != nil {
		return r
	}
	r.fill, r.objects = time.Since(t0), f.objects.Load()-before
	logf("filled in %s (%d writes)", r.fill.Round(time.Second), r.objects)

	r.ready = map[string]time.Duration{}
	for _, p := range []string{procProxy, procRelay, procPolicy, procAgent} {
		d, err := node.start(ctx, p, o.readyTimeout)
		if err != nil {
			r.err = fmt.Errorf("start %s: %w", p, err)
			return r
		}
		r.ready[p] = d
		logf("%s ready in %s", p, d.Round(time.Millisecond))
	}
	time.Sleep(o.settle)
	r.rest = node.window(o.rest)
	for _, p := range procNames {
		logf("at rest: %s: %s", p, r.rest[p])
	}
	tag := fmt.Sprintf("%d-nodes", m.env.Nodes)
	node.policyProfile(o.profiles, "heap-rest-"+tag, "heap", 0)
	node.agentProfile(o.profiles, "heap-rest-"+tag, "heap", 0)
	r.cni, r.err = node.cniCost(ctx, o.cniPods)
	if r.err != nil {
		return r
	}
	r.pace = 1
	if o.probe > 0 {
		var ok bool
		if r.sustained, ok = f.probe(ctx, m, o.rates, o.seed, o.probe); !ok {
			r.err = fmt.Errorf("churn probe: %w", ctx.Err())
			return r
		}
		r.pace = paceFor(r.sustained, o.rates.pods)
		logf("churn probe: %.1f pods a second completed of %.0f; measured under %.0f %% of the issue's pod rate", r.sustained, o.rates.pods, 100*r.pace)
	}
	var (
		acts      []*activity
		churned   func()
		stopChurn context.CancelFunc
		verdicts  string
		repaced   []string
	)
	for {
		var cctx context.Context
		cctx, stopChurn = context.WithCancel(ctx)
		acts, churned = f.churn(cctx, m, o.rates.paced(r.pace), o.seed)
		time.Sleep(churnWarmup)
		var profiled sync.WaitGroup
		profiled.Go(func() { node.policyProfile(o.profiles, "cpu-churn-"+tag, "profile", o.churnD-5*time.Second) })
		// What was allocated over the window (a delta heap profile), which
		// the collector's share of the CPU follows.
		profiled.Go(func() { node.policyProfile(o.profiles, "allocs-churn-"+tag, "allocs", o.churnD-5*time.Second) })
		profiled.Go(func() { node.agentProfile(o.profiles, "cpu-churn-"+tag, "profile", o.churnD-5*time.Second) })
		// This process's own (the churn, the counting proxies): what it
		// takes of the two cores the API server does not have.
		profiled.Go(func() { selfProfile(o.profiles, "cpu-churn-"+tag, o.churnD-5*time.Second) })
		counted := node.verdictCounters()
		start := make([]tally, len(acts))
		for i, a := range acts {
			start[i] = a.tally()
		}
		r.churn = node.window(o.churnD)
		// The churn the window saw: it goes on through the fan-out.
		r.reached, r.proxyReached = 1, 1
		for i, a := range acts {
			r.reached = min(r.reached, a.reachedSince(start[i]))
			if a.kubeProxy {
				r.proxyReached = a.reachedSince(start[i])
			}
		}
		verdicts = "flock-policy's verdicts under churn: " + orNone(countersSince(counted, node.verdictCounters()))
		logf("%s", verdicts)
		profiled.Wait()
		next := repace(r.pace, r.reached)
		if o.probe <= 0 || len(repaced) == maxRepaces || next == 0 {
			break
		}
		repaced = append(repaced, fmt.Sprintf("churn with its pods at %.0f %% of the issue's rate reached %.0f %% of its target in a window: measured again with them at %.0f %%", 100*r.pace, 100*r.reached, 100*next))
		logf("%s", repaced[len(repaced)-1])
		stopChurn()
		churned()
		r.pace = next
	}
	if len(o.fanout) > 0 {
		r.fanout = node.measureFanout(o.fanout, 10*time.Second, o.fanoutD, r.churn)
	}
	stopChurn()
	churned() // its pods deleted
	for _, p := range procNames {
		logf("under churn: %s: %s", p, r.churn[p])
	}
	for _, a := range acts {
		r.activity = append(r.activity, a.String())
		logf("%s", a)
	}
	logf("the churn (its pods at %.0f %% of the issue's rate) reached %.0f %% of its target in the window measured", 100*r.pace, 100*r.reached)
	if r.share() < 1 {
		up := r.upper()
		for _, p := range procNames {
			logf("under churn, projected from %.0f %% to the issue's churn: %s: %s", 100*r.shareOf(p), p, up[p])
		}
	}
	if isPaced(r.pace) {
		r.activity = append(r.activity, fmt.Sprintf("churn with its pods at %.0f %% of the issue's rate (the probe at the full rates completed %.1f pods a second)", 100*r.pace, r.sustained))
	}
	r.activity = append(r.activity, repaced...)
	r.activity = append(r.activity, verdicts)
	return r
}
