package main

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// The NetworkPolicy section: what flock-policy (kube-network-policies'
// engine, k8s/netpol) costs a pod's new connections, and its memory.
//
// Everything runs in namespaces of the bench's own, so that the host's
// nftables are untouched: a "node" namespace where flock-policy runs (its
// table inet flock-netpol hooks that namespace's postrouting, and its
// NFQUEUE is that namespace's), and one namespace per "pod", each joined
// to the node by a veth and routed through it. The pods exist in the
// API as Pod objects on the node with status.podIPs set to their veths'
// addresses; the servers are TCP listeners of this process inside the
// server pods' namespaces, the clients dial from the client pods'.
const (
	npNamespace = "flock-bench-netpol"
	npNode      = "bench-netpol-node"
	npPort      = 8080
	npWorkers   = 8 // concurrent clients in the connection rate figure
	// npNet holds the pods' links (fd00:6e70:0:K::/64, the node ::1, the
	// pod ::2) and the filler pods' addresses (fd00:6e70:ff::/64, in the
	// API only).
	npNet = "fd00:6e70::/32"
	// npBenchLabel is the namespace's label (the policies' extra rules
	// select the namespace by it).
	npBenchLabel = "flock.fritzlab.net/bench"
)

// npPod is one pod of the section: a namespace with a veth to the node,
// and a Pod object.
type npPod struct {
	name   string
	labels map[string]string
	ns     *lab.NS
	ip, gw netip.Addr
	nodeIf string // the node's end of its link
}

func (p *npPod) addr() string { return netip.AddrPortFrom(p.ip, npPort).String() }

// The pods: two servers, one the policies select and one none does; the
// client every policy allows; an intruder none allows; the probe only
// the last policy created allows (it connecting while the intruder is
// refused says that the engine has seen all the policies).
const (
	podServer   = "server"
	podOpen     = "open"
	podClient   = "client"
	podIntruder = "intruder"
	podProbe    = "probe"
)

func npPeer(i int) string { return fmt.Sprintf("p%03d", i) }

type npPodSpec struct {
	name   string
	labels map[string]string
}

func npPodSpecs(policies int) []npPodSpec {
	return []npPodSpec{
		{podServer, map[string]string{"app": "server"}},
		{podOpen, map[string]string{"app": "open"}},
		{podClient, map[string]string{"role": "client"}},
		{podIntruder, map[string]string{"role": "intruder"}},
		{podProbe, map[string]string{"role": "probe", "peer": npPeer(policies - 1)}},
	}
}

// npPolicy is policy i of n: it selects the server and allows the client
// (podSelector role=client); besides, a rule of its own: from the pods
// labelled peer=p<i> in namespaces with the bench's label, to the port.
// The engine takes the first policy that allows a packet, so the client's
// SYN costs the selection of every policy (the server's ingress and the
// client's egress) and the evaluation of one.
//
// Policy 0 also lets in the client's outside addresses (outside, by
// ipBlock): the sources of the distinct-source figure.
func npPolicy(i int, outside netip.Prefix) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(npPort)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%03d", i), Namespace: npNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{
					From: []networkingv1.NetworkPolicyPeer{{
						NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{npBenchLabel: "netpol"}},
						PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"peer": npPeer(i)}},
					}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				},
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}},
			},
		},
	}
	if i == 0 {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: outside.String()}}}})
	}
	return np
}

// netpolResult is what the section measured; an error per figure group.
type netpolResult struct {
	sel, unsel          []time.Duration // connect latency samples
	latErr              error
	selRate, unselRate  float64 // new connections per second
	rateErr             error
	rssEmpty, rssLoaded float64 // MB
	emptyErr, loadedErr error
	// From npDistinct sources each once; UDP, a new source port a
	// request (per second); a policy change to the first connection it
	// decides, allowing and taking back.
	distinctSel, distinctUnsel float64
	distinctErr                error
	udpSel, udpUnsel           float64
	udpErr                     error
	changeAllow, changeDeny    []time.Duration
	changeErr                  error
	// RSS with npMany policies; the rates of connRates with the admin
	// policies on and off (adminRates).
	rssMany                    float64
	manyErr                    error
	adminSel, adminUnsel       float64
	adminOffSel, adminOffUnsel float64
	adminQueued                int // packets queued to the engine meanwhile
	adminErr                   error
}

func newNetpolResult() netpolResult {
	return netpolResult{selRate: nan(), unselRate: nan(), rssEmpty: nan(), rssLoaded: nan(),
		distinctSel: nan(), distinctUnsel: nan(), udpSel: nan(), udpUnsel: nan(), rssMany: nan(), adminSel: nan(), adminUnsel: nan(), adminOffSel: nan(), adminOffUnsel: nan()}
}

// failRest marks every figure not measured yet as failed with err.
func (r *netpolResult) failRest(err error) {
	if err == nil {
		return
	}
	if len(r.sel) == 0 && r.latErr == nil {
		r.latErr = err
	}
	if math.IsNaN(r.selRate) && r.rateErr == nil {
		r.rateErr = err
	}
	if math.IsNaN(r.rssEmpty) && r.emptyErr == nil {
		r.emptyErr = err
	}
	if math.IsNaN(r.distinctSel) && r.distinctErr == nil {
		r.distinctErr = err
	}
	if math.IsNaN(r.udpSel) && r.udpErr == nil {
		r.udpErr = err
	}
	if len(r.changeAllow) == 0 && r.changeErr == nil {
		r.changeErr = err
	}
	if math.IsNaN(r.rssLoaded) && r.loadedErr == nil {
		r.loadedErr = err
	}
	if math.IsNaN(r.rssMany) && r.manyErr == nil {
		r.manyErr = err
	}
	if math.IsNaN(r.adminSel) && r.adminErr == nil {
		r.adminErr = err
	}
}

// logErrors logs each figure group's error in full (the table shows the
// first line).
func (r netpolResult) logErrors() {
	for _, e := range []struct {
		what string
		err  error
	}{{"connect latency", r.latErr}, {"connection rate", r.rateErr}, {"distinct sources", r.distinctErr}, {"UDP", r.udpErr}, {"policy change", r.changeErr}, {"RSS empty", r.emptyErr}, {"RSS loaded", r.loadedErr}, {"RSS with many policies", r.manyErr}, {"admin policies on", r.adminErr}} {
		if e.err != nil {
			logf("netpol: %s: %v", e.what, e.err)
		}
	}
}

func netpolSection(o options) string {
	return fmt.Sprintf("NetworkPolicy: flock-policy in a node namespace, %d NetworkPolicies selecting one pod, real kube-apiserver", o.npPolicies)
}

// netpolFigures are the section's rows. A figure whose measurement failed
// carries the error (and so is never met); the differences are taken
// only from two complete sample sets.
func netpolFigures(r netpolResult, o options) []figure {
	sec := netpolSection(o)
	errStr := func(err error) string {
		if err == nil {
			return ""
		}
		return firstLine(err.Error()) // a table cell; the whole error is in the log
	}
	selP50, selP99, unP50, unP99 := nan(), nan(), nan(), nan()
	if r.latErr == nil && len(r.sel) > 0 && len(r.unsel) > 0 {
		selP50, selP99, unP50, unP99 = pct(r.sel, .5), pct(r.sel, .99), pct(r.unsel, .5), pct(r.unsel, .99)
	}
	latErr := errStr(r.latErr)
	if latErr == "" && (len(r.sel) == 0 || len(r.unsel) == 0) {
		latErr = "no samples"
	}
	rateErr := errStr(r.rateErr)
	selRate, unselRate := r.selRate, r.unselRate
	if rateErr != "" {
		selRate, unselRate = nan(), nan()
	}
	empty, loaded := r.rssEmpty, r.rssLoaded
	if r.emptyErr != nil {
		empty = nan()
	}
	if r.loadedErr != nil {
		loaded = nan()
	}
	distinctSel, distinctUnsel, distinctErr := r.distinctSel, r.distinctUnsel, errStr(r.distinctErr)
	if distinctErr != "" {
		distinctSel, distinctUnsel = nan(), nan()
	}
	udpSel, udpUnsel, udpErr := r.udpSel, r.udpUnsel, errStr(r.udpErr)
	if udpErr != "" {
		udpSel, udpUnsel = nan(), nan()
	}
	changeAllow, changeDeny, changeErr := nan(), nan(), errStr(r.changeErr)
	if changeErr == "" && len(r.changeAllow) > 0 && len(r.changeDeny) > 0 {
		changeAllow, changeDeny = pct(r.changeAllow, .99), pct(r.changeDeny, .99)
	} else if changeErr == "" {
		changeErr = "no samples"
	}
	many, manyErr := r.rssMany, errStr(r.manyErr)
	if manyErr != "" {
		many = nan()
	}
	adminSel, adminUnsel, adminOffSel, adminOffUnsel, adminErr := r.adminSel, r.adminUnsel, r.adminOffSel, r.adminOffUnsel, errStr(r.adminErr)
	if adminErr != "" {
		adminSel, adminUnsel, adminOffSel, adminOffUnsel = nan(), nan(), nan(), nan()
	}
	queued := float64(r.adminQueued)
	if adminErr != "" {
		queued = nan()
	}
	const base = "unselected pod"
	const adminBase = "the same, admin policies off"
	return []figure{
		{Section: sec, Name: "TCP connect p50, to the pod the policies select", Value: selP50, Base: unP50, BaseName: base, Unit: "ms", Limit: nan(), Err: latErr},
		{Section: sec, Name: "TCP connect p99, to the pod the policies select", Value: selP99, Base: unP99, BaseName: base, Unit: "ms", Limit: nan(), Err: latErr},
		{Section: sec, Name: "TCP connect p50 the policies add (selected − unselected)", Value: selP50 - unP50, Base: nan(), Unit: "ms", Limit: nan(), Err: latErr},
		{Section: sec, Name: "TCP connect p99 the policies add (selected − unselected)", Value: selP99 - unP99, Base: nan(), Unit: "ms", Max: true, Limit: 0.1, Err: latErr},
		{Section: sec, Name: fmt.Sprintf("new TCP connections per second, %d concurrent clients, to the pod the policies select", npWorkers), Value: selRate, Base: unselRate, BaseName: base, Unit: "conn/s", Ratio: true, Limit: 0.95, Err: rateErr},
		{Section: sec, Name: fmt.Sprintf("new TCP connections per second from %d distinct source addresses, each connecting once, to the pod the policies select", npDistinct), Value: distinctSel, Base: distinctUnsel, BaseName: base, Unit: "conn/s", Ratio: true, Limit: 0.95, Err: distinctErr},
		{Section: sec, Name: fmt.Sprintf("UDP request/response per second, a new source port each, %d concurrent clients, to the pod the policies select", npWorkers), Value: udpSel, Base: udpUnsel, BaseName: base, Unit: "req/s", Ratio: true, Limit: 0.95, Err: udpErr},
		{Section: sec, Name: "a policy change holds for new connections, p99 (allowing)", Value: changeAllow, Base: nan(), Unit: "ms", Max: true, Limit: 100, Err: changeErr},
		{Section: sec, Name: "a policy change holds for new connections, p99 (taking back)", Value: changeDeny, Base: nan(), Unit: "ms", Max: true, Limit: 100, Err: changeErr},
		{Section: sec, Name: fmt.Sprintf("new TCP connections per second, %d concurrent clients, to the pod the policies select, with AdminNetworkPolicy and BaselineAdminNetworkPolicy on (applying to another pod)", npWorkers), Value: adminSel, Base: adminOffSel, BaseName: adminBase, Unit: "conn/s", Ratio: true, Limit: 0.95, Err: adminErr},
		{Section: sec, Name: fmt.Sprintf("new TCP connections per second, %d concurrent clients, to the unselected pod, with AdminNetworkPolicy and BaselineAdminNetworkPolicy on (applying to another pod)", npWorkers), Value: adminUnsel, Base: adminOffUnsel, BaseName: adminBase, Unit: "conn/s", Ratio: true, Limit: 0.95, Err: adminErr},
		{Section: sec, Name: "packets sent to the engine's queue by those runs with the admin policies on", Value: queued, Base: nan(), Unit: "packets", Max: true, Limit: 0, Err: adminErr},
		{Section: sec, Name: fmt.Sprintf("flock-policy RSS, empty (no policies, %d pods)", len(npPodSpecs(o.npPolicies))), Value: empty, Base: nan(), Unit: "MB", Limit: nan(), Err: errStr(r.emptyErr)},
		{Section: sec, Name: fmt.Sprintf("flock-policy RSS, loaded (%d policies, %d pods)", o.npPolicies, len(npPodSpecs(o.npPolicies))+o.npPods), Value: loaded, Base: empty, BaseName: "empty", Unit: "MB", Limit: nan(), Err: errStr(r.loadedErr)},
		{Section: sec, Name: fmt.Sprintf("flock-policy RSS, %d policies (%d pods)", npMany, len(npPodSpecs(o.npPolicies))+o.npPods), Value: many, Base: empty, BaseName: "empty", Unit: "MB", Limit: nan(), Err: manyErr},
	}
}

func netpolNote(o options) string {
	return fmt.Sprintf("NetworkPolicy: flock-policy (bin/flock-policy, `--kubeconfig` of the API-only lab, metrics on loopback, no admin or agent socket) runs in a node namespace of its own, so its table inet %s holds only in that namespace; five pod namespaces hang off it by veth, routed (IPv6, %s). They are Pod objects on the node (status.podIPs set through the status subresource) in a labelled Namespace; the servers are TCP listeners inside the pod namespaces. %d NetworkPolicies select one server (app=server), each allowing the client by its label plus a rule of its own (another peer label, the namespace's label, the port); the other server no policy selects. Timing starts once /readyz answers 200 and the policies are seen in effect: a pod no policy allows cannot connect (its SYN dropped) while the one only the last-created policy allows can. Latency: %d sequential connects from the client to each server, alternating, after a warm-up (each a full handshake, then closed with a reset so that no TIME_WAIT is left). Rate: %d clients connecting as fast as they can for %s per server, in halves ordered selected, unselected, unselected, selected. Distinct sources: %d addresses on the client's eth0, outside any pod's (the first policy also allows them by ipBlock), each connecting once to each server per run, %d at a time, runs ordered as above. UDP: the same %d clients, each request from a new socket (a new source port, a new flow as each DNS query is) answered by an echo server in the pod, for %s per server. Policy change: a policy letting the intruder in is created (then deleted), and the intruder tries a new connection with a 10 ms timeout after another until the change decides it, %d times each way; the time runs from the API's answer. Targets: the policies' verdicts are the kernel's (flock-policy compiles them into nftables), so a selected pod's rates are at least 0.95× an unselected pod's and they add at most 0.1 ms to a connect's p99. RSS is VmRSS, read %s after the engine is ready with no policies and %s after the timed runs with %d more Pod objects in the API (on ten nodes, a tenth on this one), and only while the process is verified alive; then policies are added up to %d (like the others, selecting the server) and a marker selecting the open server, whose drop of the intruder says the kernel holds them all, and the RSS is read again %s later. Admin policies: the added policies go; the connection rates are measured as above with both admin APIs off, then flock-policy stops, the AdminNetworkPolicy and BaselineAdminNetworkPolicy CRDs are installed with one policy of each applying to another Pod (on another node, in the API only), flock-policy starts again with both APIs on and the rates are measured twice (once ready, the NetworkPolicies in effect, and %s more for its start's work to end), then once more with them off after another restart: on against off, each the mean of its two runs, each run once the node's conntrack table holds fewer than 1,000 entries (the rates fall as it fills). Only the subjects' connections go to the engine's queue, so none of these runs' packets may (the queue's own count, from /proc/net/netfilter/nfnetlink_queue), and the other pods' rates hold (at least 0.95×; the runs are minutes apart, and the machine's drift between them shows in the ratio).",
		"flock-netpol", npNet, o.npPolicies, o.npConnects, npWorkers, o.npRateTime, npDistinct, npWorkers, npWorkers, o.npRateTime, npChanges, o.settle, o.settle, o.npPods, npMany, o.settle, o.settle)
}

// measureNetpol builds the section's namespaces and API objects, starts
// flock-policy and takes the figures; everything it started is stopped
// and removed when it returns (the API objects go with the lab).
func measureNetpol(ctx context.Context, a *apiLab, dir, binDir, prefix string, o options) (r netpolResult) {
	r = newNetpolResult()
	if o.npPolicies < 1 {
		r.failRest(fmt.Errorf("-netpol-policies %d: want at least 1", o.npPolicies))
		return r
	}
	dir = filepath.Join(dir, "netpol")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.failRest(err)
		return r
	}
	l, err := newNPLab(prefix, o.npPolicies)
	if err != nil {
		r.failRest(err)
		return r
	}
	defer l.Close()
	stopProxy, err := l.node.Proxy(a.addr(), a.addr())
	if err != nil {
		r.failRest(fmt.Errorf("apiserver proxy in %s: %w", l.node.Name, err))
		return r
	}
	defer stopProxy()
	if err := l.createObjects(ctx, a.cs); err != nil {
		r.failRest(err)
		return r
	}
	metrics, err := l.freeLoopbackPort()
	if err != nil {
		r.failRest(err)
		return r
	}
	logf("netpol: flock-policy in %s", l.node.Name)
	p, err := startPolicy(l.node, binDir, dir, a.kubeconfig(), metrics)
	if err != nil {
		r.failRest(err)
		return r
	}
	defer p.stop()
	if err := p.waitReady(l.httpClient(), "http://"+metrics+"/readyz", 60*time.Second); err != nil {
		r.failRest(err)
		return r
	}
	// No policy yet: every pod reaches both servers.
	for _, c := range [][2]string{{podIntruder, podServer}, {podClient, podServer}, {podClient, podOpen}} {
		if err := l.dial(c[0], c[1], 3*time.Second); err != nil {
			r.failRest(fmt.Errorf("before any policy, %s → %s: %w", c[0], c[1], err))
			return r
		}
	}
	logf("netpol: ready; RSS empty in %s", o.settle)
	r.rssEmpty, r.emptyErr = p.rss(o.settle)
	if r.emptyErr == nil {
		logf("netpol: flock-policy empty: %.1f MB", r.rssEmpty)
	}

	logf("netpol: %d more pods, %d NetworkPolicies", o.npPods, o.npPolicies)
	if err := createFillers(ctx, a.cs, o.npPods); err != nil {
		r.failRest(err)
		return r
	}
	for i := range o.npPolicies {
		if _, err := a.cs.NetworkingV1().NetworkPolicies(npNamespace).Create(ctx, npPolicy(i, l.distinctPrefix()), metav1.CreateOptions{}); err != nil {
			r.failRest(fmt.Errorf("create NetworkPolicy %d: %w", i, err))
			return r
		}
	}
	start := time.Now()
	if err := l.waitEnforced(p, 90*time.Second); err != nil {
		r.failRest(err)
		return r
	}
	logf("netpol: policies in effect after %s", time.Since(start).Round(time.Millisecond))

	logf("netpol: %d sequential connects to each server", o.npConnects)
	lat, err := connectLatency(l.pods[podClient].ns, []string{l.pods[podServer].addr(), l.pods[podOpen].addr()}, o.npConnects, 100)
	if err == nil {
		err = p.exited() // a dead engine's numbers prove nothing
	}
	if err != nil {
		r.latErr = err
	} else {
		r.sel, r.unsel = lat[0], lat[1]
		logf("netpol: connect p50 %.3f / %.3f ms, p99 %.3f / %.3f ms (selected / unselected)", pct(r.sel, .5), pct(r.unsel, .5), pct(r.sel, .99), pct(r.unsel, .99))
	}

	logf("netpol: connection rate, %d clients, %s per server", npWorkers, o.npRateTime)
	r.selRate, r.unselRate, r.rateErr = l.connRates(p, o.npRateTime)
	if r.rateErr == nil {
		logf("netpol: %.0f / %.0f connections/s (selected / unselected)", r.selRate, r.unselRate)
	}

	logf("netpol: %d distinct sources, each connecting once to each server", npDistinct)
	if srcs, err := l.distinctSources(); err != nil {
		r.distinctErr = err
	} else {
		r.distinctSel, r.distinctUnsel, r.distinctErr = l.distinctRates(p, srcs)
	}
	if r.distinctErr == nil {
		logf("netpol: %.0f / %.0f connections/s from distinct sources (selected / unselected)", r.distinctSel, r.distinctUnsel)
	}

	logf("netpol: UDP request/response, a new source port each, %d clients, %s per server", npWorkers, o.npRateTime)
	r.udpSel, r.udpUnsel, r.udpErr = l.udpRates(p, o.npRateTime)
	if r.udpErr == nil {
		logf("netpol: %.0f / %.0f UDP exchanges/s (selected / unselected)", r.udpSel, r.udpUnsel)
	}

	logf("netpol: %d policy changes each way", npChanges)
	r.changeAllow, r.changeDeny, r.changeErr = l.changeLatency(ctx, a.cs, p)
	if r.changeErr == nil {
		logf("netpol: a change holds after p50 %.1f / p99 %.1f ms (allow), p50 %.1f / p99 %.1f ms (take back)", pct(r.changeAllow, .5), pct(r.changeAllow, .99), pct(r.changeDeny, .5), pct(r.changeDeny, .99))
	}

	logf("netpol: RSS loaded in %s", o.settle)
	r.rssLoaded, r.loadedErr = p.rss(o.settle)
	if r.loadedErr == nil {
		logf("netpol: flock-policy loaded: %.1f MB", r.rssLoaded)
	}

	logf("netpol: %d policies; RSS in %s", npMany, o.settle)
	r.rssMany, r.manyErr = l.manyRSS(ctx, a.cs, p, o.npPolicies, o.settle)
	if r.manyErr == nil {
		logf("netpol: flock-policy with %d policies: %.1f MB", npMany, r.rssMany)
	}
	// Whatever was not measured by now failed with the process.
	r.failRest(p.exited())
	if r.adminErr != nil {
		return r
	}
	logf("netpol: admin policies off, on, on, off; connection rates, %d clients, %s per server each time", npWorkers, o.npRateTime)
	var on, off [2]float64
	on, off, r.adminQueued, r.adminErr = l.adminRates(ctx, a, p, binDir, dir, metrics, o.npRateTime, o.settle)
	r.adminSel, r.adminUnsel, r.adminOffSel, r.adminOffUnsel = on[0], on[1], off[0], off[1]
	return r
}
