package main

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/hostinfo"
)

// flockOf is flock-agent and flock-policy together.
func flockOf(m map[string]usage, f func(usage) float64) float64 {
	return f(m[procAgent]) + f(m[procPolicy])
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

// churnReached is what a churn must achieve of its target for the
// figures under it to be judged: below it, flock's are shown beside
// kube-proxy's with the share, but are not called met (a lighter churn
// flatters flock-policy, whose work follows the pods).
const churnReached = 0.95

// boundVerdict is verdict for a figure measured under share of the
// issue's churn and projected to all of it. Neither process costs less
// under more churn, and the linear projection is no less than what it
// costs at the full churn (each grows at most in proportion: flock-policy
// decodes every event but patches at most once a second and loads at
// most half the time, kube-proxy syncs at most once a second), so each
// process's figure at the full churn lies between its measured and
// projected ones: met when flock's projection is at most kube-proxy's
// measurement (below whatever kube-proxy costs), not met when flock's
// measurement is above kube-proxy's projection, and between the two not
// judged. Projecting both and comparing would favour whichever batches
// more (its projection overstates it more), but for kube-proxy's watch
// bytes, which do not batch (goalsTable's exact). A churn that fell below
// churnReached of its target is never called met.
func boundVerdict(met, notMet bool, reached, share float64) string {
	short := reached < churnReached
	switch {
	case notMet && short:
		return fmt.Sprintf("**not met** (at %.0f %% of the churn)", 100*share)
	case notMet:
		return "**not met**"
	case met && short:
		return fmt.Sprintf("not judged: below kube-proxy at %.0f %% of the churn", 100*share)
	case met:
		return "met"
	case short:
		return fmt.Sprintf("not judged: the two overlap, at %.0f %% of the churn", 100*share)
	}
	return "not judged: the two overlap (flock's projection above kube-proxy as measured, flock as measured below kube-proxy's projection)"
}

func sizeName(e envelope) string {
	return fmt.Sprintf("%s nodes (%.0f%%)", thousands(e.Nodes), 100*float64(e.Nodes)/float64(full.Nodes))
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// goalsTable is the Goals section's heading and its sizes' rows (the
// rack's follow).
func goalsTable(rs []sizeResult) string {
	b := &strings.Builder{}
	b.WriteString("\n## Goals\n\n| size | figure | flock (agent + policy) | kube-proxy | target | |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		if r.err != nil || r.rest == nil || r.churn == nil {
			continue
		}
		rss := func(u usage) float64 { return u.rssMB }
		cpu := func(u usage) float64 { return u.cpuPct }
		wb := func(u usage) float64 { return u.watchBytes / 1024 }
		// share is the churn the window saw: the figures under
		// churn are bounded by what was measured and their projection
		// from it.
		share, proj := r.share(), ""
		if share < 1 {
			what := "at"
			if isPaced(r.pace) {
				what = "pods at" // the rest at the rates
			}
			proj = fmt.Sprintf(" (%s %.0f %% of the churn → projected)", what, 100*share)
		}
		up := r.upper()
		// exact: kube-proxy's figure grows exactly in proportion to the
		// churn, so its projection is its figure at the full churn, not
		// a bound above it. The API server sends each change it watches
		// as an event of its own, as it happens (its Services and
		// EndpointSlices: every slice change is a share of the churn);
		// flock's relays flush and compress events together, so flock's
		// projection still overstates flock.
		rows := []struct {
			name, unit   string
			m            map[string]usage
			f            func(usage) float64
			churn, exact bool
		}{
			{"RSS at rest", "MB", r.rest, rss, false, false},
			{"RSS under churn" + proj, "MB", r.churn, rss, true, false},
			{"CPU under churn" + proj, "% of a core", r.churn, cpu, true, false},
			{"watch bytes under churn" + proj, "KB/s", r.churn, wb, true, true},
		}
		for _, row := range rows {
			fl, kp := flockOf(row.m, row.f), row.f(row.m[procProxy])
			fls, kps := fmt.Sprintf("%.1f %s", fl, row.unit), fmt.Sprintf("%.1f %s", kp, row.unit)
			v, err := verdict(fl <= kp), errOf(r.rest)
			if row.churn {
				flU, kpU := flockOf(up, row.f), row.f(up[procProxy])
				kpLow := kp
				if row.exact {
					// By the share of what kube-proxy watches that the
					// window saw: the pods, which it does not watch, are
					// what falls behind.
					kpLow = row.f(projected(r.rest[procProxy], r.churn[procProxy], r.proxyShare()))
				}
				v = boundVerdict(flU <= kpLow, fl > kpU, r.reached, share)
				if share <= 0 {
					v = "not judged: no churn in the window"
				}
				if share < 1 {
					fls = fmt.Sprintf("%.1f → %.1f %s", fl, flU, row.unit)
					kps = fmt.Sprintf("%.1f → %.1f %s", kp, kpU, row.unit)
				}
				// Bounds need both windows.
				err = cmp.Or(errOf(r.rest), errOf(r.churn))
			}
			if err != nil {
				v = "not judged: " + strings.ReplaceAll(err.Error(), "|", "/")
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | ≤ kube-proxy | %s |\n", sizeName(r.env), row.name, fls, kps, v)
		}
		if r.env.Nodes == full.Nodes {
			d := r.ready[procAgent]
			fmt.Fprintf(b, "| %s | flock-agent serves CNI after start | %.2f s | | ≤ 2 s | %s |\n", sizeName(r.env), d.Seconds(), verdict(d <= 2*time.Second))
		}
	}
	return b.String()
}

// writeReport renders SCALE.md.
func writeReport(o options, rs []sizeResult, racks []rackResult, took time.Duration) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Scale\n\nGenerated by `%s` (e2e/cmd/scale); do not edit.\n\n", o.cmd)
	fmt.Fprintf(&b, "- commit: flock %s\n- date: %s (took %s)\n- machine: %s\n\n", o.rev, time.Now().UTC().Format("2006-01-02 15:04 MST"), took.Round(time.Second), hostinfo.Machine())
	svg := strings.TrimSuffix(o.out, ".md") + ".svg"
	if err := os.WriteFile(svg, []byte(plotOf(rs)), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(&b, "![Each process's RSS, watch bytes and CPU against the cluster's size, kube-proxy dashed](%s)\n\n", filepath.Base(svg))
	b.WriteString(method(o))

	b.WriteString(goalsTable(rs))
	for _, k := range racks {
		name := fmt.Sprintf("rack (%d × %d), %s", k.nodes, k.pods, k.tor)
		if k.err != nil {
			fmt.Fprintf(&b, "| %s | cold start | not measured: %s | | | |\n", name, strings.ReplaceAll(k.err.Error(), "|", "/"))
			continue
		}
		fmt.Fprintf(&b, "| %s | every route in the ToR's FIB after the last ADD | %.2f s | | ≤ 5 s | %s |\n", name, k.fib.Seconds(), verdict(k.fib <= 5*time.Second))
		fmt.Fprintf(&b, "| %s | the largest agent's RSS | %.1f MB | | ≤ 40 MB | %s |\n", name, k.rssMax, verdict(k.rssMax <= 40))
	}
	if len(rs) == 0 {
		b.WriteString("\nNo cluster size was measured in this run (`-sizes \"\"`).\n")
	} else if last := rs[len(rs)-1]; last.env.Nodes != full.Nodes || last.err != nil {
		fmt.Fprintf(&b, "\nThe full envelope (%s nodes) was **not reached**: the largest size measured is above; the goals at the full envelope are not shown as met.\n", thousands(full.Nodes))
	}

	b.WriteString("\n## Each process, at each size\n\n| size | process | ready after start | RSS at rest | CPU at rest | watch events/s at rest | RSS under churn | CPU under churn | watch events/s under churn | watch KB/s under churn | other KB/s under churn | requests/s under churn |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		up := r.upper()
		for _, p := range procNames {
			rest, ch := r.rest[p], r.churn[p]
			if r.rest == nil || r.churn == nil {
				fmt.Fprintf(&b, "| %s | %s | not measured: %v | | | | | | | | | |\n", sizeName(r.env), p, strings.ReplaceAll(fmt.Sprint(r.err), "|", "/"))
				continue
			}
			if rest.err != nil || ch.err != nil {
				fmt.Fprintf(&b, "| %s | %s | error: %v %v | | | | | | | | | |\n", sizeName(r.env), p, rest.err, ch.err)
				continue
			}
			pr, sh := up[p], r.shareOf(p)
			fmt.Fprintf(&b, "| %s | %s | %.2f s | %.1f MB | %.2f %% | %.1f | %.1f MB | %s | %s | %s | %s | %s |\n", sizeName(r.env), p,
				r.ready[p].Seconds(), rest.rssMB, rest.cpuPct, rest.events, ch.rssMB,
				withProjection("%.1f %%", ch.cpuPct, pr.cpuPct, sh), withProjection("%.0f", ch.events, pr.events, sh),
				withProjection("%.1f", ch.watchBytes/1024, pr.watchBytes/1024, sh), withProjection("%.1f", ch.otherBytes/1024, pr.otherBytes/1024, sh),
				withProjection("%.1f", ch.requests, pr.requests, sh))
		}
	}

	b.WriteString("\n## Watch traffic by resource, under churn\n\nAs measured: the pods at the share of their rate the size ran at, the EndpointSlice and NetworkPolicy changes at the issue's rates (the fill table gives the churn each achieved).\n\n| size | process | resource | events/s | KB/s |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		for _, p := range procNames {
			u := r.churn[p]
			var res []string
			for k := range u.byResource {
				res = append(res, k)
			}
			sort.Strings(res)
			for _, k := range res {
				w := u.byResource[k]
				secs := o.churnD.Seconds()
				fmt.Fprintf(&b, "| %s | %s | %s | %.1f | %.1f |\n", sizeName(r.env), p, k, float64(w.events)/secs, float64(w.bytes)/1024/secs)
			}
		}
	}

	b.WriteString(fanoutSection(rs))

	b.WriteString("\n## API requests of a CNI ADD and DEL (flock-agent)\n\n| size | per ADD | per DEL | requests over the ADDs | over the DELs |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		if r.cni.pods == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %s | %s |\n", sizeName(r.env), r.cni.perAdd, r.cni.perDel, orNone(r.cni.add.requestList()), orNone(r.cni.del.requestList()))
	}

	if len(racks) > 0 {
		b.WriteString("\n## Rack cold start\n\n| ToR | agents × pods | routes | ToR started → every node's summary in its FIB | the pods' ADDs (every node at once) | last ADD → every route in the ToR's FIB | agent RSS, median / largest |\n| --- | --- | --- | --- | --- | --- | --- |\n")
		for _, k := range racks {
			if k.err != nil {
				fmt.Fprintf(&b, "| %s | %d × %d | %s | error: %s | | | |\n", k.tor, k.nodes, k.pods, thousands(k.routesWanted), strings.ReplaceAll(k.err.Error(), "|", "/"))
				continue
			}
			fmt.Fprintf(&b, "| %s | %d × %d | %s | %.2f s | %.1f s | %.2f s | %.1f / %.1f MB |\n", k.tor, k.nodes, k.pods, thousands(k.routesWanted), k.sessions.Seconds(), k.adds.Seconds(), k.fib.Seconds(), k.rssMedian, k.rssMax)
		}
	}

	b.WriteString("\n## The cluster at each size\n\n| size | pods | Services | NetworkPolicies | filled in | writes | churn and background achieved; what flock-policy loaded and patched under it |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		status := strings.Join(r.activity, "; ")
		if r.err != nil {
			status = "error: " + r.err.Error()
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", sizeName(r.env), thousands(r.env.totalPods()), thousands(r.services), thousands(r.env.Policies),
			r.fill.Round(time.Second), thousands(int(r.objects)), strings.ReplaceAll(status, "|", "/"))
	}
	return os.WriteFile(o.out, []byte(b.String()), 0o644)
}

// errOf is the first error among flock's processes' and kube-proxy's
// figures in m.
func errOf(m map[string]usage) error {
	for _, p := range []string{procAgent, procPolicy, procProxy} {
		if err := m[p].err; err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// share is the churn a size's window saw: the share of its
// target the churn reached times the share of the pod rate it
// ran at. It is flock's: flock-policy is sent the pods; what flock
// watches that ran at the rate (EndpointSlices, NetworkPolicies)
// is projected by it too, which overstates flock.
func (r sizeResult) share() float64 {
	if isPaced(r.pace) {
		return r.reached * r.pace
	}
	return r.reached
}

// proxyShare is the share for what kube-proxy watches alone: the
// EndpointSlice changes, which run at the rate (churnRates.paced)
// and lack only what they fell short of it.
func (r sizeResult) proxyShare() float64 { return cmp.Or(r.proxyReached, r.reached) }

// shareOf is the share of the churn that process p's window saw.
func (r sizeResult) shareOf(p string) float64 {
	if p == procProxy {
		return r.proxyShare()
	}
	return r.share()
}

// upper is the figures under churn projected from each process's share
// to the full churn: each process's upper bound (see boundVerdict).
func (r sizeResult) upper() map[string]usage {
	up := projectedAll(r.rest, r.churn, r.share())
	if c, ok := r.churn[procProxy]; ok {
		up[procProxy] = projected(r.rest[procProxy], c, r.proxyShare())
	}
	return up
}

// isPaced says whether a churn ran at a share pace of the rates
// below them (0: not known, the full rates).
func isPaced(pace float64) bool { return pace > 0 && pace < 1 }

// withProjection is a figure under churn, and where the churn ran at
// pace < 1 of the rates, its projection to them after an arrow.
func withProjection(format string, measured, proj, pace float64) string {
	s := fmt.Sprintf(format, measured)
	if isPaced(pace) {
		s += " → " + fmt.Sprintf(format, proj)
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func method(o options) string {
	return fmt.Sprintf(`## How it is measured

- **The cluster.** The lab's kube-apiserver and etcd (API only: no controller-manager, no scheduler, no kubelet) are filled straight through the API, as kwok and kube-burner do, to fractions of Kubernetes' scalability envelope (sig-scalability thresholds.md): %s nodes, %d pods a node (%d of them host-network DaemonSet pods: kube-proxy, flock, flock-policy, a log shipper), about 10,000 Services (one a Deployment-like workload of 1 to 250 replicas, a heavy tail), their EndpointSlices as the controller writes them (one family each, 100 endpoints a slice), %s NetworkPolicies (ingress from frontends and a team's namespaces on a named port, every other one also an ipBlock with an except, every fourth also egress), a NodeConfig a node with its agent's status, and AddressClaims for one pod in %d (an `+"`addresses`"+` IP) and one Service in %d (a LoadBalancer of flock's class); one workload in %d carries an anycast IP. Pods are bound to Nodes that have no kubelet, their status (Running, Ready, an IPv6 address from the node's summary and an IPv4 one) written through the status subresource; objects carry what real ones do (labels, owner references, a container with ports, probes and environment, kubelet's conditions), since their size is what every watcher pays for. The sizes are filled one after another into the same API server.
- **The node.** One node of the lab runs flock-agent (bin/flock-agent, Kubernetes mode, peering BIRD as its ToR), flock-policy (bin/flock-policy) and kube-proxy (the lab's build, nftables mode): kube-proxy is the baseline, the Services and EndpointSlices fan-out a node already pays. flock-policy reads the pods from flock-relay (bin/flock-relay, run beside them), as every node does with deploy/relay: its pod traffic is what the relay sent it (the relay's counters, compressed as sent), and the relay's own row is what one relay costs, whatever the number of nodes it serves (a cluster runs two). Another node holds the LoadBalancer assigner's Lease (renewed every 5 s), as it does for all nodes but one. Each process talks to the API server through its own counting proxy (it ends TLS with the API server's certificate and makes the request again with the same client certificate), which counts requests by verb and resource and, for watches, the events and bytes streamed. At each size the four are stopped, the API is filled, and they are started again one after another (kube-proxy, flock-relay, flock-policy, flock-agent); *ready* is from start to kube-proxy's /healthz, flock-relay's /readyz (it holds every pod and is in the directory, where nodes find it), flock-policy's /readyz, flock-agent answering CNI STATUS.
- **At rest**: %s after the three are ready, a %s window. Nothing changes in the cluster: the other nodes' agents write no NodeConfig status while nothing they report changes.
- **Under churn**: %.0f pods created a second cluster-wide (random workloads and nodes, given their addresses through the status subresource, each deleted %s later; the other nodes' agents, which are not running, would write nothing for them: a NodeConfig's status changes only with its peers, readiness or errors), %.0f EndpointSlice changes a second (an endpoint's readiness flipped), %.0f NetworkPolicy change a second (a peer added or removed); after 10 s, a %s window.%s A churn that falls below 95 %% of its (paced) target in the window (it goes on through the fan-out, whose watchers load the API server) is shown, but not called met.
- **CPU** is from /proc/PID/stat over the window, of one core; **RSS** is VmRSS at the window's end; each reading only of the same live process. **Watch bytes** are the bodies the API server streamed (as sent).
- **CNI**: %d pods (their Pod objects on the node first, as the kubelet's are) are ADDed through libcni, then DELed; the agent's requests over each phase, watches aside.
- **Rack cold start**: %d agents (bin/flock-agent, node-config mode) in network namespaces, each with one uplink to a ToR namespace: BIRD with a neighbour statement a node, then FRR with `+"`bgp listen range`"+` (dynamic neighbours). The ToR installs what it learns in its kernel FIB, followed through netlink. The agents start first, then the ToR; once every node's summary is in the FIB, every node ADDs its %d pods through libcni at once (4 at a time a node; the pods' network namespaces are made beforehand), each pod with an anycast /128 of its own. The figure is from the last ADD's return to the last pod route in the FIB; RSS is each agent's VmRSS then.
`, thousands(full.Nodes), full.PodsPerNode, full.HostPods, thousands(full.Policies), addressesEvery, lbEvery, anycastEvery,
		o.settle, o.rest, o.rates.pods, churnLifetime, o.rates.slices, o.rates.policies, o.churnD, probeMethod(o), o.cniPods, o.rackNodes, o.rackPods)
}

// probeMethod is the method's passage on the churn probe and the
// projection ("" without a probe: every size under the rates).
func probeMethod(o options) string {
	if o.probe <= 0 {
		return ""
	}
	return fmt.Sprintf(" First, for %s (after the same 10 s), the churn runs at those rates to learn how many pods a second this machine's API server completes at this size (it runs the churn, the API server, etcd and the measured node on two cores). Where that is below 95 %% of the pod rate, the size is measured with the pods at a share of it the machine keeps up with (90 %% of what it completed, in 5 %% steps; the fill table gives it), and the EndpointSlice and NetworkPolicy changes at the issue's rates: a dozen writes a second against the pods' three each, which the API server keeps up with at every size, and all that kube-proxy watches of the churn, so kube-proxy is measured under the issue's churn. Where a window's churn falls below 95 %% of its target (a probe's 20 s flatter the machine; a failed or a dropped tick counts as not reached), the size is measured again (at most twice more), with the pods at 90 %% of the share of the churn that window reached (the least of its three kinds). Every figure under a churn short of the issue's (paced, or short of its target) is projected to the full churn: the rest figure plus the growth over rest divided by the share of the issue's churn the window saw (RSS, CPU, watch events and bytes, other bytes, requests), shown after an arrow beside the one measured: for kube-proxy the share of the EndpointSlice changes, for the others the share of the pods (flock-policy is sent the pods; what flock watches of the other changes, which ran at the issue's rates, is projected by it too, which overstates flock). No process costs less under more churn, and none grows faster than in proportion to it (flock-policy decodes each event, but patches its verdicts at most once a second and loads them at most half the time; kube-proxy syncs at most once a second), so each one's figure at the full churn lies between the two. The goals are judged by those bounds: met when flock's projection is at most kube-proxy's measurement, not met when flock's measurement is above kube-proxy's projection, not judged between (comparing the two projections would favour whichever batches more, whose projection overstates it more). kube-proxy's watch bytes are the exception: the API server sends each change kube-proxy watches as an event of its own, as it happens, so they grow exactly in proportion to the churn and its projection is its figure (flock's relays flush and compress events together: flock's projection is still a bound above it). The projection also multiplies the window's noise by the inverse of the share.", o.probe)
}

// fanoutSection is the API server's side: each window, then what one
// node costs it and the projection to the envelope.
func fanoutSection(rs []sizeResult) string {
	var b strings.Builder
	any := false
	for _, r := range rs {
		any = any || len(r.fanout) > 0
	}
	if !any {
		return ""
	}
	b.WriteString("\n## The API server's side, under churn\n\n")
	b.WriteString("A node's watches (flock-agent's and flock-policy's together, or kube-proxy's: the requests the measured processes made, as they made them) are opened again by n copies at once, each copy on a connection of its own, and the API server is read over a window beside one without copies (the measured node's processes run throughout). The API server serializes an event once per encoding and writes it to each watcher its selectors let through, whatever the watcher does with it, so copies of the watches cost it what as many nodes would. A node's cost is the slope from the windows without copies (one before, one after: their mean) to the one with the most copies that were served in full (a count whose copies each got less than 90 % of the watch events the real processes got under the same churn is saturated: this machine's two cores, which also run the churn and the copies' TLS, could not serve that many, so it is not used); the projection to 5,000 nodes is linear in the nodes (compare the two counts).\n\n")
	b.WriteString("| size | copies of | watchers | API server CPU | API server RSS | events/s sent to the copies | KB/s sent to the copies |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rs {
		for _, f := range r.fanout {
			if f.err != nil {
				fmt.Fprintf(&b, "| %s | %s | %d | error: %s | | | |\n", sizeName(r.env), kindName(f.kind), f.watchers, strings.ReplaceAll(f.err.Error(), "|", "/"))
				continue
			}
			sat := ""
			if saturated(r.fanout, f) {
				sat = " (saturated: not used)"
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %.1f %% | %.0f MB | %.0f%s | %.1f |\n", sizeName(r.env), kindName(f.kind), f.watchers, f.cpuPct, f.rssMB, f.eventsSec, sat, f.bytesSec/1024)
		}
	}
	b.WriteString("\n| size | one more node costs the API server | flock (agent + policy) | kube-proxy | at 5,000 nodes: flock | kube-proxy |\n| --- | --- | --- | --- | --- | --- |\n")
	n := float64(full.Nodes)
	for _, r := range rs {
		if len(r.fanout) == 0 {
			continue
		}
		baseCPU, _, bok := baseOf(r.fanout)
		f, fok := perWatcher(r.fanout, "flock")
		k, kok := perWatcher(r.fanout, "kube-proxy")
		// kube-proxy's churn, the EndpointSlices', ran at the rate.
		f = f.atFullChurn(r.pace)
		if !bok || !fok || !kok {
			fmt.Fprintf(&b, "| %s | not measured (every count saturated, or a window failed) | | | | |\n", sizeName(r.env))
			continue
		}
		fmt.Fprintf(&b, "| %s | watch events sent a second | %.0f | %.0f | %s | %s |\n", sizeName(r.env), f.eventsSec, k.eventsSec, thousands(int(n*f.eventsSec)), thousands(int(n*k.eventsSec)))
		fmt.Fprintf(&b, "| %s | watch bytes sent | %.1f KB/s | %.1f KB/s | %.0f MB/s | %.0f MB/s |\n", sizeName(r.env), f.bytesSec/1024, k.bytesSec/1024, n*f.bytesSec/1024/1024, n*k.bytesSec/1024/1024)
		cpu := func(c nodeCost) (string, string) {
			if math.Abs(c.cpuPct) <= c.cpuRes {
				return fmt.Sprintf("below the resolution (±%.2f %%)", c.cpuRes), "—"
			}
			return fmt.Sprintf("%.2f ± %.2f %%", c.cpuPct, c.cpuRes), fmt.Sprintf("%.0f cores", (baseCPU+n*c.cpuPct)/100)
		}
		fc, fp := cpu(f)
		kc, kp := cpu(k)
		fmt.Fprintf(&b, "| %s | API server CPU (of a core) | %s | %s | %s | %s |\n", sizeName(r.env), fc, kc, fp, kp)
	}
	b.WriteString("\nAt 5,000 nodes: the events and bytes are 5,000 times a node's (what the API servers send); the windows above are at the share of the pod churn the size ran at, and flock's events, bytes and CPU slope in this table are divided by that share (the watchers are sent what the churn makes, and the API server's work for them follows; what flock's watches are sent of the EndpointSlice and NetworkPolicy churn, which ran at the issue's rates, and at rest, their bookmarks, is divided too, which overstates flock); kube-proxy's, whose churn is the EndpointSlices', are as measured; the CPU is the mean of the windows without copies (as measured) plus 5,000 times a node's slope, shown only where the slope is larger than its resolution (the drift between the two windows without copies, over the copies: the churn's own cost on the API server varies by several % of a core from window to window). The API server's RSS keeps the Go runtime's high-water mark, so it is shown per window and not projected.\n")
	return b.String()
}
