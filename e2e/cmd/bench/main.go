// Command bench is `make bench`: flock's performance figures, each beside
// a baseline measured in the same run on the same machine, printed as one
// table and written to BENCHMARKS.md. Root only (network namespaces, a
// BIRD ToR, a kube-apiserver for the claim and NetworkPolicy figures).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"

	"code.fritzlab.net/fritzlab/flock/e2e/hostinfo"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/procfs"
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

type options struct {
	out, binDir, cmd     string
	seqN, slowN, tputN   int
	rounds               int
	tputSlow             int
	pods, perPod, routeN int
	claimN               int
	idle, settle         time.Duration
	claims               bool
	services             bool
	svcFlips             int
	svcServices          int
	svcEndpoints         int
	profiles             string
	agentLog             string
	cniOnly              bool
	cnitool              bool
	netpol               bool
	npConnects           int
	npPolicies, npPods   int
	npRateTime           time.Duration
	only                 string
}

func main() {
	var o options
	flag.StringVar(&o.out, "out", "BENCHMARKS.md", "where to write the report")
	flag.StringVar(&o.binDir, "bin", "bin", "the flock binaries as shipped (make build)")
	flag.StringVar(&o.cmd, "cmd", "make bench", "the command named in the report")
	flag.IntVar(&o.seqN, "n", 200, "sequential ADDs (then DELs) per configuration")
	flag.IntVar(&o.slowN, "n-slow", 20, "sequential ADDs for ptp dual-stack (it waits for IPv6 DAD: ~2 s each)")
	flag.IntVar(&o.tputN, "tput", 200, "pods ADDed by 8 workers for the throughput figure")
	flag.IntVar(&o.rounds, "rounds", 3, "CNI rounds, flock and ptp in turn in each (sequential samples pooled, the median round's throughput)")
	flag.IntVar(&o.tputSlow, "tput-slow", 64, "the same for ptp dual-stack")
	flag.IntVar(&o.pods, "pods", 1000, "pods in the scale run")
	flag.IntVar(&o.perPod, "routes-per-pod", 10, "distinct anycast routes per pod in the scale run")
	flag.IntVar(&o.routeN, "route-samples", 200, "ADD/DEL pairs timed on the wire with the scale state held")
	flag.IntVar(&o.claimN, "claim-samples", 100, "ADDs per case in the AddressPool claim figures")
	flag.DurationVar(&o.idle, "idle", 60*time.Second, "how long idle CPU is measured")
	flag.DurationVar(&o.settle, "settle", 10*time.Second, "wait before an RSS reading (the Go scavenger returns a burst's memory in the background)")
	flag.StringVar(&o.agentLog, "agent-log", "", "copy the agent's log here at the end")
	flag.StringVar(&o.profiles, "profiles", "", "save the agent's heap profiles (empty, loaded) and memory split into this directory")
	flag.BoolVar(&o.claims, "claims", true, "measure the AddressPool claim cost against a kube-apiserver (the e2e lab's; built once into /var/cache/flock-e2e)")
	flag.BoolVar(&o.services, "services", true, "measure Services: an EndpointSlice change to the UPDATE on the ToR's wire, and the agent's RSS with many Services (against the same kube-apiserver as -claims)")
	flag.IntVar(&o.svcFlips, "svc-flips", 200, "endpoint readiness flips timed in the Services figures")
	flag.IntVar(&o.svcServices, "svc-services", 1000, "Services (each with an EndpointSlice) for the agent's RSS")
	flag.IntVar(&o.svcEndpoints, "svc-endpoints", 10, "endpoints per Service for the agent's RSS")
	flag.BoolVar(&o.cniOnly, "cni-only", false, "measure the CNI figures only and print them (BENCHMARKS.md is left alone): for quick comparisons while optimizing")
	flag.BoolVar(&o.cnitool, "cnitool", true, "also measure ADD and DEL through an exec of cnitool per call (built from the module proxy at go.mod's CNI version), flock and ptp alike")
	flag.BoolVar(&o.netpol, "netpol", true, "measure NetworkPolicy: what flock-policy adds to new connections of a pod policies select, and its RSS (against the same kube-apiserver as -claims)")
	flag.IntVar(&o.npConnects, "netpol-connects", 20000, "sequential connects timed to each server in the NetworkPolicy latency figures (a p99 of 2,000 swung by ±0.3 ms between runs on a loaded 2-core machine)")
	flag.IntVar(&o.npPolicies, "netpol-policies", 100, "NetworkPolicies selecting the server pod")
	flag.IntVar(&o.npPods, "netpol-pods", 1000, "further Pod objects in the API for flock-policy's loaded RSS")
	flag.DurationVar(&o.npRateTime, "netpol-rate-time", 5*time.Second, "how long the connection rate is measured, per server")
	flag.StringVar(&o.only, "only", "", "measure only these sections, comma-separated (claims, netpol, services), and print them (BENCHMARKS.md is left alone)")
	flag.Parse()
	if _, _, _, err := o.apiSections(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: must run as root (network namespaces, BIRD, kube-apiserver)")
		os.Exit(2)
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	started := time.Now()
	revision = hostinfo.Revision("BENCHMARKS.md") // what is measured: HEAD now, not when the report is written
	bin, err := filepath.Abs(o.binDir)
	if err != nil {
		return err
	}
	claims, netpol, svcs, err := o.apiSections()
	if err != nil {
		return err
	}
	var need []string
	if o.only == "" || claims || svcs {
		need = append(need, "flock", "flock-agent")
	}
	if netpol && (o.only != "" || !o.cniOnly) {
		need = append(need, "flock-policy")
	}
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("%w (run make build first)", err)
		}
	}
	dir, err := os.MkdirTemp("", "flock-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	prefix := randPrefix()
	if o.only != "" {
		figs := apiFigures(ctx, o, dir, bin, prefix, claims, netpol, svcs)
		var n []string
		if netpol {
			n = append(n, netpolNote(o))
		}
		fmt.Println(render(figs, report{cmd: o.cmd + " -only " + o.only, started: started, notes: n, bin: bin}))
		return failures(figs)
	}
	var figs []figure
	add := func(f figure) { figs = append(figs, f) }

	// The scale run's pods, plus one for the route figures.
	npods := max(o.seqN, o.tputN, o.pods+1, o.slowN, o.tputSlow)
	if o.cniOnly {
		npods = max(o.seqN, o.tputN, o.slowN, o.tputSlow)
	}
	logf("creating %d pod namespaces", npods)
	pool, err := newPodPool(prefix+"p", npods)
	if err != nil {
		return err
	}
	defer pool.Close()

	logf("lab: BIRD ToR, flock agent on node1")
	nl, err := newNodeLab(prefix, filepath.Join(dir, "lab"), bin)
	if err != nil {
		return err
	}
	defer nl.Close()

	mem := memFigures{empty: nan(), bEmpty: nan(), bLoaded: nan()}
	routes := o.pods * o.perPod
	if !o.cniOnly {
		mem = nl.memoryBaseline(dir, o, routes)
	}

	// CNI: flock and ptp+host-local, through libcni, the same pod
	// namespaces.
	ptpHost, err := lab.NewNS(prefix + "ptp")
	if err != nil {
		return err
	}
	defer ptpHost.Delete()
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		_ = ptpHost.Sysctl(k, "1") // what ptp would set; set once, outside the timings
	}
	ptp4, err := ptpPlugin(filepath.Join(dir, "ptp4"), ptpHost, false)
	if err != nil {
		return err
	}
	ptp6, err := ptpPlugin(filepath.Join(dir, "ptp6"), ptpHost, true)
	if err != nil {
		return err
	}
	// Rounds, each plugin in turn within a round: the machine's speed
	// drifts over minutes, and interleaving keeps the ratios honest.
	confs := []cniConf{
		{nl.flock(), "fd", o.seqN, o.tputN, o.rounds},
		{nl.flockV4(), "f4", o.seqN, o.tputN, o.rounds},
		{ptp4, "p4", o.seqN, o.tputN, o.rounds},
		{ptp6, "p6", o.slowN, o.tputSlow, 1}, // DAD makes each ADD ~2 s; it is context only
	}
	results := map[string]*cniResult{}
	// The same, through an exec of cnitool per ADD and per DEL.
	var tools []plugin
	var toolVersion []string
	if o.cnitool {
		logf("CNI: building cnitool")
		v, err := buildCnitool(filepath.Join(dir, "cnitool-bin"))
		if err == nil {
			toolVersion = []string{"cnitool " + v + " (go.mod's CNI version)"}
			tbin := filepath.Join(dir, "cnitool-bin", "cnitool")
			for _, c := range []struct {
				p       plugin
				cniPath string
				list    *libcni.NetworkConfigList
			}{
				{nl.flock(), bin, nl.n.CNI.List},
				{nl.flockV4(), bin, nl.n.CNI.List},
				{ptp4, "/usr/lib/cni", ptp4.cni.List},
			} {
				var t plugin
				if t, err = cnitoolPlugin(c.p, tbin, filepath.Join(dir, "cnitool", fmt.Sprint(len(tools))), c.cniPath, c.list); err != nil {
					break
				}
				tools = append(tools, t)
			}
		}
		if err != nil {
			logf("CNI: cnitool: %v", err)
			for _, p := range []plugin{nl.flock(), nl.flockV4(), ptp4} {
				results[p.name+" (cnitool)"] = &cniResult{err: fmt.Errorf("cnitool: %w", err)}
			}
			tools = nil
		}
		for _, t := range tools {
			confs = append(confs, cniConf{t, "x", o.seqN, o.tputN, o.rounds})
		}
	}
	for _, c := range confs {
		results[c.p.name] = &cniResult{}
	}
	for round := 1; round <= o.rounds; round++ {
		logf("CNI: round %d of %d", round, o.rounds)
		for _, c := range confs {
			if round <= c.rounds {
				measureRound(ctx, c.p, pool, fmt.Sprintf("%s%d", c.tag, round), c.seq, c.tput, results[c.p.name])
			}
		}
	}
	for name, r := range results {
		r.finish()
		if r.err != nil {
			logf("CNI: %s: %v", name, r.err)
		}
	}
	if o.profiles != "" {
		// What the agent spends its CPU on while ADDs come 8 at a time.
		wait := cpuProfile(nl.n.Agent.AdminSocket, o.profiles, "cpu-tput", 3*time.Second)
		// Each run on an idle node (the last run's veths released: the
		// pool's namespaces are reused) under a tag of its own.
		for i, start := 0, time.Now(); time.Since(start) < 3*time.Second; i++ {
			err := nl.flock().settle()
			if err == nil {
				_, _, _, err = nl.flock().throughput(ctx, pool, fmt.Sprintf("pf%d-", i), o.tputN)
			}
			if err != nil {
				logf("profile run: %v", err)
				break
			}
		}
		wait()
	}
	const sec = "CNI through libcni (exec of the plugin), real namespaces, sequential unless noted"
	figs = append(figs, cniFigures(sec, true, *results["flock dual-stack"], *results["flock IPv4-only"], *results["ptp IPv4-only"], results["ptp dual-stack"])...)
	if o.cnitool {
		const tsec = "CNI through cnitool (one exec of cnitool per ADD and per DEL, which execs the plugin), the same namespaces and rounds"
		figs = append(figs, cniFigures(tsec, false, *results["flock dual-stack (cnitool)"], *results["flock IPv4-only (cnitool)"], *results["ptp IPv4-only (cnitool)"], nil)...)
	}
	rep := report{cmd: o.cmd, started: started, bin: bin, extra: toolVersion}

	if o.cniOnly {
		if o.agentLog != "" {
			_ = os.WriteFile(o.agentLog, []byte(nl.n.Agent.Log()), 0o644)
		}
		rep.cmd, rep.notes = o.cmd+" -cni-only", notes(o, mem)[:2]
		fmt.Println(render(figs, rep))
		return failures(figs)
	}

	// Scale: pods × anycast routes.
	logf("scale: %d pods × %d routes from 8 workers", o.pods, o.perPod)
	scaleSec := fmt.Sprintf("Scale: %d pods, %d originated routes, BIRD ToR", o.pods, routes)
	m := nl.cap.Mark()
	var lastMu sync.Mutex
	var lastAdd time.Time
	// The agent must be the same live process from the first ADD to the
	// last reading: a crashed agent reads as 0 % CPU and a small RSS.
	agent, serr := nl.agent()
	scaleStart := time.Now()
	if serr == nil {
		_, serr = nl.flock().concurrent(8, o.pods, func(i int) error {
			p := nl.scalePod(i, o.perPod)
			p.NS = pool[i]
			if _, err := nl.n.CNI.Add(ctx, p); err != nil {
				return fmt.Errorf("scale ADD %d: %w", i, err)
			}
			lastMu.Lock()
			lastAdd = time.Now()
			lastMu.Unlock()
			return nil
		})
	}
	wire, fib, loaded, loadedIdle, cpu := nan(), nan(), nan(), nan(), nan()
	wireErr, fibErr, loadedErr, cpuErr, idleErr := serr, serr, serr, serr, serr
	if serr == nil {
		logf("scale: ADDs took %s", lastAdd.Sub(scaleStart).Round(time.Millisecond))
		if at, err := nl.cap.WaitAnnounced(m, routes, 2*time.Minute); err != nil {
			wireErr = err
		} else {
			wire = float64(at.Sub(lastAdd).Microseconds()) / 1000
		}
		if at, err := nl.fib.WaitCount(netip.MustParsePrefix(anycastRange), routes, 2*time.Minute); err != nil {
			fibErr = err
		} else {
			fib = float64(at.Sub(lastAdd).Microseconds()) / 1000
		}
		if err := agent.Alive(); err != nil {
			wireErr, fibErr = errors.Join(wireErr, err), errors.Join(fibErr, err)
		}
		loaded, loadedErr = agent.SettledRSS(o.settle)
		logf("agent loaded: %s", smaps(nl.pid()))
		if err := saveProfile(nl.n.Agent.AdminSocket, o.profiles, "heap-loaded", "heap"); err != nil {
			logf("profile: %v", err)
		}
		logf("scale: RSS %.1f MB; idle CPU over %s", loaded, o.idle)
		wait := cpuProfile(nl.n.Agent.AdminSocket, o.profiles, "cpu-idle", o.idle)
		cpu, cpuErr = agent.IdleCPU(o.idle)
		wait()
		loadedIdle, idleErr = agent.RSS()
		logf("agent after idle: %s", smaps(nl.pid()))
		if err := saveProfile(nl.n.Agent.AdminSocket, o.profiles, "heap-idle", "heap"); err != nil {
			logf("profile: %v", err)
		}
	}
	add(figure{Section: scaleSec, Name: "all routes on the wire, after the last ADD returned (negative: before)", Value: wire, Base: nan(), Unit: "ms", Limit: nan(), Err: errStr(wireErr)})
	add(figure{Section: scaleSec, Name: "all routes in the ToR's FIB, after the last ADD returned (negative: before)", Value: fib, Base: nan(), Unit: "ms", Limit: nan(), Err: errStr(fibErr)})
	add(figure{Section: scaleSec, Name: "agent RSS, empty (BGP session up)", Value: mem.empty, Base: mem.bEmpty, BaseName: mem.baseName(), Unit: "MB", Max: true, Limit: 40, Err: errStr(errors.Join(mem.emptyErr, mem.bEmptyErr))})
	add(figure{Section: scaleSec, Name: "agent RSS, loaded", Value: loaded, Base: mem.bLoaded, BaseName: mem.baseName(), Unit: "MB", Max: true, Limit: 64, Err: errStr(errors.Join(loadedErr, mem.bLoadedErr))})
	add(figure{Section: scaleSec, Name: fmt.Sprintf("agent RSS, loaded, after %s idle", o.idle), Value: loadedIdle, Base: nan(), Unit: "MB", Max: true, Limit: 64, Err: errStr(idleErr)})
	add(figure{Section: scaleSec, Name: fmt.Sprintf("agent CPU, idle %s, loaded", o.idle), Value: cpu, Base: nan(), Unit: "% of a core", Max: true, Limit: 0.5, Err: errStr(cpuErr)})

	// Route latency with the scale state held.
	routeSec := fmt.Sprintf("Route latency, %d routes held, one pod with a /128 at a time", routes)
	var rl routeLat
	var rerr error
	if serr == nil {
		logf("routes: %d ADD/DEL pairs timed on the wire", o.routeN)
		wait := cpuProfile(nl.n.Agent.AdminSocket, o.profiles, "cpu-routes", 5*time.Second)
		rl, rerr = nl.routeLatency(ctx, pool[o.pods], o.routeN)
		wait()
		if err := agent.Alive(); err != nil {
			rerr = errors.Join(rerr, err)
		}
	} else {
		rerr = fmt.Errorf("scale run failed")
	}
	for _, r := range []struct {
		name string
		d    []time.Duration
		lim  float64
	}{
		{"ADD returned → UPDATE on the wire (negative: sent before ADD returned)", rl.addRetToWire, 0},
		{"ADD called → UPDATE on the wire", rl.addToWire, nan()},
		{"ADD called → route in BIRD's FIB", rl.addToFIB, nan()},
		{"DEL called → WITHDRAW on the wire", rl.delToWire, nan()},
		{"DEL returned → WITHDRAW on the wire (negative: sent before DEL returned)", rl.delRetToWire, nan()},
		{"DEL called → route gone from BIRD's FIB", rl.delToFIB, nan()},
	} {
		for _, q := range []float64{.5, .99} {
			f := figure{Section: routeSec, Name: fmt.Sprintf("%s, p%.0f", r.name, q*100), Value: pct(r.d, q), Base: nan(), Unit: "ms", Max: true, Limit: nan(), Err: errStr(rerr)}
			if q == .5 {
				f.Limit = r.lim
			}
			add(f)
		}
	}

	// Restart with the scale state.
	restartSec := fmt.Sprintf("Agent restart with %d pods and %d routes (BIRD ToR, graceful restart)", o.pods, routes)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		var rr restartResult
		var err error
		if serr == nil {
			logf("restart: %s", sig)
			rr, err = nl.restart(sig)
			if err == nil {
				_, err = nl.agent() // the restarted agent, still running
			}
		} else {
			err = fmt.Errorf("scale run failed")
		}
		v := func(x float64) float64 {
			if err != nil {
				return nan()
			}
			return x
		}
		name := "SIGTERM"
		if sig == syscall.SIGKILL {
			name = "SIGKILL"
		}
		add(figure{Section: restartSec, Name: name + ": started → ready (answers CNI)", Value: v(rr.ready.Seconds()), Base: nan(), Unit: "s", Max: true, Limit: 1, Err: errStr(err)})
		add(figure{Section: restartSec, Name: name + ": started → End-of-RIB on the wire", Value: v(rr.eor.Seconds()), Base: nan(), Unit: "s", Limit: nan(), Err: errStr(err)})
		add(figure{Section: restartSec, Name: name + ": prefixes withdrawn on the wire", Value: v(float64(rr.withdrawn)), Base: nan(), Unit: "routes", Max: true, Limit: 0, Err: errStr(err)})
		add(figure{Section: restartSec, Name: name + ": routes lost from BIRD's FIB", Value: v(float64(rr.fibLost)), Base: nan(), Unit: "routes", Max: true, Limit: 0, Err: errStr(err)})
	}
	logf("scale: DEL of %d pods", o.pods)
	_, _ = nl.flock().concurrent(8, o.pods, func(i int) error {
		p := nl.scalePod(i, o.perPod)
		p.NS = pool[i]
		return nl.n.CNI.Del(ctx, p)
	})
	if o.agentLog != "" {
		_ = os.WriteFile(o.agentLog, []byte(nl.n.Agent.Log()), 0o644)
	}
	nl.Close()

	figs = append(figs, apiFigures(ctx, o, dir, bin, prefix, claims, netpol, svcs)...)

	rep.notes = notes(o, mem)
	doc := render(figs, rep)
	fmt.Println(doc)
	if err := os.WriteFile(o.out, []byte(doc), 0o644); err != nil {
		return err
	}
	// The report says which figures failed; so does the exit status.
	return failures(figs)
}

type cniConf struct {
	p         plugin
	tag       string
	seq, tput int
	rounds    int
}

func errStr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// cniFigures are a CNI section's rows: flock against ptp IPv4-only (and
// ptp dual-stack, if measured, as context). A row carries the errors of
// both sides' measurements: a ratio is no better than its worse half.
// Only the libcni section has targets (containerd and CRI-O exec the
// plugin alone, through libcni); the cnitool one is context.
func cniFigures(sec string, targets bool, fd, f4, p4 cniResult, p6 *cniResult) []figure {
	var figs []figure
	row := func(name string, v, b float64, bn, unit string, ratio, maxi bool, limit float64, errs ...error) {
		if !targets {
			limit = nan()
		}
		figs = append(figs, figure{Section: sec, Name: name, Value: v, Base: b, BaseName: bn, Unit: unit, Ratio: ratio, Max: maxi, Limit: limit, Err: errStr(errors.Join(errs...))})
	}
	const p4n, p6n = "ptp IPv4-only", "ptp dual-stack"
	row("ADD p50, dual-stack", fd.addP50, p4.addP50, p4n, "ms", true, true, 0.5, fd.err, p4.err)
	row("ADD p50, IPv4-only", f4.addP50, p4.addP50, p4n, "ms", true, true, 0.5, f4.err, p4.err)
	if p6 != nil {
		row("ADD p50, dual-stack vs dual-stack", fd.addP50, p6.addP50, p6n, "ms", false, false, nan(), fd.err, p6.err)
	}
	row("ADD p99, dual-stack", fd.addP99, p4.addP99, p4n, "ms", false, false, nan(), fd.err, p4.err)
	row("ADD p99, IPv4-only", f4.addP99, p4.addP99, p4n, "ms", false, false, nan(), f4.err, p4.err)
	row("DEL p50 (until the host veth is deleted), dual-stack", fd.delP50, p4.delP50, p4n, "ms", true, true, 1.0, fd.err, p4.err)
	row("DEL p50 (until the host veth is deleted), IPv4-only", f4.delP50, p4.delP50, p4n, "ms", true, true, 1.0, f4.err, p4.err)
	row("DEL p99 (until the host veth is deleted), dual-stack", fd.delP99, p4.delP99, p4n, "ms", false, false, nan(), fd.err, p4.err)
	row("ADD throughput, 8 concurrent, dual-stack", fd.addRate, p4.addRate, p4n, "pods/s", true, false, 2.0, fd.err, p4.err)
	row("ADD throughput, 8 concurrent, IPv4-only", f4.addRate, p4.addRate, p4n, "pods/s", true, false, 2.0, f4.err, p4.err)
	if p6 != nil {
		row("ADD throughput, 8 concurrent, dual-stack vs dual-stack", fd.addRate, p6.addRate, p6n, "pods/s", false, false, nan(), fd.err, p6.err)
	}
	row("DEL throughput (until every host veth is deleted), 8 concurrent, dual-stack", fd.delRate, p4.delRate, p4n, "pods/s", false, false, nan(), fd.err, p4.err)
	return figs
}

// apiSections says which of the sections that need a Kubernetes API
// (claims, netpol, services) run: those -only names, else those enabled.
func (o options) apiSections() (claims, netpol, services bool, err error) {
	if o.only == "" {
		return o.claims, o.netpol, o.services, nil
	}
	for _, s := range strings.Split(o.only, ",") {
		switch strings.TrimSpace(s) {
		case "claims":
			claims = true
		case "netpol":
			netpol = true
		case "services":
			services = true
		default:
			return false, false, false, fmt.Errorf("-only %q: the sections are claims, netpol and services", o.only)
		}
	}
	return claims, netpol, services, nil
}

// apiFigures measures the sections that need a Kubernetes API against
// one API-only lab (etcd and kube-apiserver, built once into
// /var/cache/flock-e2e), torn down before it returns.
func apiFigures(ctx context.Context, o options, dir, bin, prefix string, claims, netpol, svcs bool) []figure {
	if !claims && !netpol && !svcs {
		return nil
	}
	logf("k8s: API-only lab (etcd, kube-apiserver)")
	a, err := upAPILab(ctx, dir)
	var figs []figure
	if claims {
		var cc []claimCost
		if err == nil {
			logf("claims: AddressPool claims against the kube-apiserver")
			cc, err = measureClaims(ctx, a, dir, bin, prefix+"k", o.claimN)
		}
		if err != nil {
			logf("claims: %v", err)
		}
		figs = append(figs, claimFigures(cc, err)...)
	}
	if svcs {
		r := svcResult{err: err, services: o.svcServices, endpoints: o.svcEndpoints, rssEmpty: nan(), rssLoaded: nan()}
		if a != nil {
			logf("services: EndpointSlice flips and Services against the kube-apiserver")
			r = measureServices(ctx, a, dir, bin, prefix+"s", o.svcFlips, o.svcServices, o.svcEndpoints, o.settle)
		}
		if r.err != nil {
			logf("services: %v", r.err)
		}
		figs = append(figs, svcFigures(r)...)
	}
	if netpol {
		r := newNetpolResult()
		if a == nil {
			r.failRest(err)
		} else {
			logf("netpol: NetworkPolicy against the kube-apiserver")
			r = measureNetpol(ctx, a, dir, bin, prefix+"n", o)
		}
		r.logErrors()
		figs = append(figs, netpolFigures(r, o)...)
	}
	if a != nil {
		a.Close()
	}
	return figs
}

// memFigures are the agent's RSS when empty and a bare embedded GoBGP's
// beside it, empty and loaded; each with its own error.
type memFigures struct {
	empty, bEmpty, bLoaded          float64
	emptyErr, bEmptyErr, bLoadedErr error
	// gogc is the GOGC the baseline ran with: the agent's, read from it
	// (gogcErr: it could not be, and the baseline ran with the
	// environment's).
	gogc    string
	gogcErr error
	gobgp   string // the baseline binary's GoBGP version
}

// baseName is the baseline column's name, saying whether its GC ran
// like the agent's.
func (m memFigures) baseName() string {
	if m.gogcErr != nil || m.gogc == "" {
		return "bare embedded GoBGP, GOGC not the agent's (unread)"
	}
	return "bare embedded GoBGP, GOGC=" + m.gogc + " like the agent"
}

// memoryBaseline reads the empty agent's RSS, then a bare embedded GoBGP's
// with the same session and the agent's GOGC, empty and holding routes
// routes. Each reading is of a process verified alive and unchanged.
func (nl *nodeLab) memoryBaseline(dir string, o options, routes int) memFigures {
	m := memFigures{empty: nan(), bEmpty: nan(), bLoaded: nan()}
	agent, err := nl.agent()
	if err == nil {
		m.empty, err = agent.SettledRSS(o.settle)
	}
	m.emptyErr = err
	logf("agent empty: %s", smaps(nl.pid()))
	if err := saveProfile(nl.n.Agent.AdminSocket, o.profiles, "heap-empty", "heap"); err != nil {
		logf("profile: %v", err)
	}
	// The agent at rest: its GOGC as it stands now (its own setting
	// unless the environment sets one) is the one the baseline gets.
	if m.gogc, m.gogcErr = nl.agentGOGC(); m.gogcErr != nil {
		logf("baseline: the agent's GOGC: %v", m.gogcErr)
	}
	logf("baseline: bare GoBGP (GOGC %q), empty then %d routes", m.gogc, routes)
	bin := filepath.Join(dir, "gobgp-baseline")
	b, err := nl.startBaseline(bin, m.gogc)
	if err != nil {
		logf("baseline: %v", err)
		m.bEmptyErr, m.bLoadedErr = err, err
		return m
	}
	defer b.stop()
	if m.gobgp, err = binaryModuleVersion(bin, gobgpModule); err != nil {
		logf("baseline: %v", err)
		m.gobgp = "unknown (" + err.Error() + ")"
	}
	bp, err := procfs.Watch("the bare GoBGP", b.cmd.Process.Pid)
	if err == nil {
		m.bEmpty, err = bp.SettledRSS(o.settle)
	}
	m.bEmptyErr = err
	if err := b.add(routes, netip.MustParseAddr("2001:db8:b::")); err != nil {
		m.bLoadedErr = fmt.Errorf("the bare GoBGP: %w", err)
	} else if _, err := nl.fib.WaitCount(netip.MustParsePrefix(baselineRange), routes, 2*time.Minute); err != nil {
		m.bLoadedErr = fmt.Errorf("the bare GoBGP's routes: %w", err)
	} else {
		m.bLoaded, m.bLoadedErr = bp.SettledRSS(o.settle)
	}
	for _, err := range []error{m.bEmptyErr, m.bLoadedErr} {
		if err != nil {
			logf("baseline: %v", err)
		}
	}
	return m
}

func notes(o options, m memFigures) []string {
	gobgp := m.gobgp
	if gobgp == "" {
		gobgp = "(not run)"
	}
	gc := "GOGC=" + m.gogc + ", the agent's own at rest, read from its go_gc_gogc_percent metric before the baseline started"
	if m.gogcErr != nil || m.gogc == "" {
		gc = "the environment's GOGC, not the agent's: the agent's could not be read"
	}
	n := []string{
		fmt.Sprintf("CNI: %d rounds, each configuration in turn within a round (the machine's speed drifts; interleaving keeps the ratios fair): %d sequential ADDs, then %d sequential DELs (ptp dual-stack: %d, in the first round only, it waits for IPv6 DAD); throughput: %d pods ADDed by 8 workers, then DELed (ptp dual-stack: %d). Latency percentiles pool every round's samples; throughput is the median round's. Each pod in its own namespace; each timed phase starts once the node is idle (no veth of an earlier DEL still being unregistered). flock's agent has a BGP session with the ToR up, and is checked to be the same live process at the end of every round; ptp runs inside a namespace of its own.", o.rounds, o.seqN, o.seqN, o.slowN, o.tputN, o.tputSlow),
		"DEL, for flock and ptp alike, is timed from the call until both the DEL returned and the kernel announced the deletion of the pod's host veth (RTM_DELLINK, read from a netlink subscription in the namespace the veth is in; the kernel sends it once the link is unlisted, about 1 ms into the deletion, before it waits ~15–20 ms here for the device to be released). ptp deletes the veth inside its DEL, so its DEL returns after that wait too; flock's DEL returns once the routes are withdrawn and the veth is down, and the agent deletes the veth after answering (the bench logs how long after the return each deletion was announced), waiting out the release while it holds the container's lock and addresses. The DEL throughput runs to the last such deletion. The cnitool section drives the same configurations, namespaces and rounds through `cnitool add|del <network> <netns>` (CNI_PATH, NETCONFPATH, CNI_ARGS; cnitool names the container after the namespace and keeps libcni's result cache in /var/lib/cni), one process per call and one more for the plugin, as a runtime that execs a CNI client would.",
		"Wire figures come from a packet socket on the ToR's port (the node's UPDATEs before BIRD processes them); FIB figures from a netlink watch of the ToR's kernel table, which BIRD programs.",
		fmt.Sprintf("RSS is VmRSS read %s after the load (the Go scavenger returns freed memory in the background), and CPU from /proc/PID/stat, each only of a process verified to be the same one (its start time) and not a zombie before and after the reading: a dead agent is an error, not 0 %% CPU. The baseline is a bare embedded GoBGP %s (its binary's build info; e2e/cmd/gobgp-baseline, built like the agent) with the same session to the ToR, originating the same number of routes, run with %s. The agent raises its GOGC to 100 while CNI requests come in bursts and hands freed heap back after them; the baseline does neither.", o.settle, gobgp, gc),
		"Restart: the agent is stopped (SIGTERM) or killed (SIGKILL) and started again at once; ready is from exec to the first answered CNI STATUS. Withdrawals are counted on the wire from the stop until 3 s after the new End-of-RIB.",
	}
	_, netpol, svcs, _ := o.apiSections()
	if svcs {
		n = append(n, fmt.Sprintf("Services: a Kubernetes-mode agent against the API lab, peered with a BIRD ToR. One selectorless Service with an external IP (an AddressPool of use externalIP allows it) and an EndpointSlice written by the bench; its one endpoint's ready condition is flipped %d times, each timed from the EndpointSlice update until the UPDATE announcing (ready) or withdrawing (not ready) the external IP is captured on the ToR's port. Then %d Services with %d endpoints each are created and the agent's RSS read %s later.", o.svcFlips, o.svcServices, o.svcEndpoints, o.settle))
	}
	if netpol {
		n = append(n, netpolNote(o))
	}
	return n
}

// lineReader reads a child's stdout line by line.
type lineReader struct {
	lines chan string
}

func newLineReader(r io.Reader) *lineReader {
	l := &lineReader{lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.lines <- sc.Text()
		}
		close(l.lines)
	}()
	return l
}

func (l *lineReader) expect(want string, timeout time.Duration) (string, error) {
	select {
	case s, ok := <-l.lines:
		if !ok {
			return "", fmt.Errorf("child exited, want %q", want)
		}
		if s != want {
			return s, fmt.Errorf("child said %q, want %q", s, want)
		}
		return s, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("child silent for %s, want %q", timeout, want)
	}
}
