package main

import (
	"os"
	"strconv"
	"testing"

	"github.com/google/nftables"
	networkingv1 "k8s.io/api/networking/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// modelInput is the model cluster at fraction f as flock-policy on model
// node 0 sees it: every pod (trimmed, as cached), namespace and policy, the anycast and
// `addresses` IPs as the pods' extra IPs.
func modelInput(f float64) verdicts.Input {
	e := full.scaled(f)
	m := newModel(1, e)
	in := verdicts.Input{Node: nodeName(0)}
	for i := range m.namespaces() {
		in.Namespaces = append(in.Namespaces, namespaceObj(i))
	}
	extra := map[*trim.Pod][]string{}
	holders := map[string][]string{}
	for _, w := range m.workloads {
		for k := w.first; k < w.first+w.size; k++ {
			v6, v4 := podIPs(k)
			whole := podObj(w, k)
			podStatus(whole, nodeIP(podNode(k)), v6, v4)
			p := trim.NewPod(whole) // as flock-policy caches it
			in.Pods = append(in.Pods, p)
			for _, key := range []string{flockAnycastKey, flockAddressesKey} {
				if ip, ok := whole.Annotations[key]; ok { // the tracker reads claims, not the cached pod
					extra[p] = append(extra[p], ip)
					holders[ip] = append(holders[ip], p.Namespace+"/"+p.Name)
				}
			}
		}
	}
	for i := range e.Nodes {
		for j := range full.HostPods {
			p := hostPodObj(i, j)
			podStatus(p, nodeIP(i))
			in.Pods = append(in.Pods, trim.NewPod(p))
		}
	}
	for p := range e.Policies {
		in.Policies = append(in.Policies, policyObj(m, p))
	}
	in.ExtraPodIPs = func(p *trim.Pod) []string { return extra[p] }
	in.PodsForIP = func(ip string) []string { return holders[ip] }
	return in
}

// BenchmarkCompileModel compiles flock-policy's program for the model
// cluster at FLOCK_SCALE_SIZE (default 0.1) of the envelope.
func BenchmarkCompileModel(b *testing.B) {
	f := 0.1
	if s := os.Getenv("FLOCK_SCALE_SIZE"); s != "" {
		var err error
		if f, err = strconv.ParseFloat(s, 64); err != nil {
			b.Fatalf("FLOCK_SCALE_SIZE=%q: %v", s, err)
		}
	}
	in := modelInput(f)
	var prog *verdicts.Program
	for b.Loop() {
		prog = verdicts.Compile(in)
	}
	b.ReportMetric(float64(len(prog.Groups)), "groups")
	b.ReportMetric(float64(len(prog.Selected)), "selected")
	_ = networkingv1.PolicyTypeIngress
}

// BenchmarkLoadModel loads that program into a network namespace's
// nftables (root).
func BenchmarkLoadModel(b *testing.B) {
	f := 0.1
	if s := os.Getenv("FLOCK_SCALE_SIZE"); s != "" {
		var err error
		if f, err = strconv.ParseFloat(s, 64); err != nil {
			b.Fatalf("FLOCK_SCALE_SIZE=%q: %v", s, err)
		}
	}
	l := probe.New(b)
	prog := verdicts.Compile(modelInput(f))
	conn, err := verdicts.NewConn(int(l.NS))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := verdicts.Load(conn, "x", verdicts.Hook{Num: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter}, prog); err != nil {
			b.Fatal(err)
		}
	}
}
