package main

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/procfs"
)

// svcResult is the Services section: how long an EndpointSlice change
// takes to reach the ToR as an UPDATE (an endpoint turning ready: the
// external IP announced; not ready: withdrawn), and the agent's RSS
// before and after the API holds many Services with their endpoints.
type svcResult struct {
	announce, withdraw  []time.Duration
	rssEmpty, rssLoaded float64
	services, endpoints int
	err, rssErr         error
}

const svcExternalIP = "198.51.100.225"

// measureServices runs a Kubernetes-mode agent against the API lab with a
// BIRD ToR, and times flips of one endpoint's readiness from the
// EndpointSlice write to the UPDATE captured on the ToR's port.
func measureServices(ctx context.Context, a *apiLab, dir, binDir, prefix string, flips, nsvc, neps int, settle time.Duration) (r svcResult) {
	r.services, r.endpoints = nsvc, neps
	l, closeLab, err := a.nodeLab(ctx, prefix, filepath.Join(dir, "services"), binDir, func(n *lab.LabNode) string {
		// The lab's NodeConfig (its peering with the ToR), without the
		// standalone AddressPools that follow it.
		nc, _, _ := strings.Cut(lab.DefaultNodeConfig(n), "\n---")
		return nc + `
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: bench-external-ips}
spec: {cidrs: ["198.51.100.224/27"], use: [externalIP], namespaces: [default]}
`
	})
	if err != nil {
		r.err = err
		return r
	}
	defer closeLab()
	node := l.Nodes[0]
	capture, err := lab.CaptureBGP(l.Tor, node.TorIf)
	if err != nil {
		r.err = err
		return r
	}
	defer capture.Close()
	if err := l.StartBird(lab.BirdOptions{GR: true}); err != nil {
		r.err = err
		return r
	}
	for deadline := time.Now().Add(60 * time.Second); capture.Since(0).EoRs < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			r.err = fmt.Errorf("no End-of-RIB from the node; agent log:\n%s", tail(node.Agent.Log(), 30))
			return r
		}
	}
	p, err := procfs.Watch("flock-agent", node.Agent.Pid())
	if err != nil {
		r.err = err
		return r
	}
	cs := a.cs
	// One selectorless Service with the external IP, its endpoints in an
	// EndpointSlice written here (as a controller would).
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "flip", Namespace: "default"},
		Spec: corev1.ServiceSpec{ExternalIPs: []string{svcExternalIP}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if _, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		r.err = err
		return r
	}
	slice := endpointSlice("flip", "flip-1", node.Name, 1, false)
	es, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		r.err = err
		return r
	}
	pfx := netip.MustParsePrefix(svcExternalIP + "/32")
	ready := false
	for i := range flips {
		ready = !ready
		es.Endpoints[0].Conditions.Ready = ptr.To(ready)
		m := capture.Mark()
		start := time.Now()
		if es, err = cs.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			r.err = fmt.Errorf("flip %d: %w", i, err)
			return r
		}
		at, err := capture.WaitFor(m, pfx, !ready, 10*time.Second)
		if err != nil {
			r.err = fmt.Errorf("flip %d (ready %v): %w; agent log:\n%s", i, ready, err, tail(node.Agent.Log(), 20))
			return r
		}
		if ready {
			r.announce = append(r.announce, at.Sub(start))
		} else {
			r.withdraw = append(r.withdraw, at.Sub(start))
		}
	}
	logf("services: %d flips: announce p50 %.1f ms p99 %.1f ms, withdraw p50 %.1f ms p99 %.1f ms",
		flips, pct(r.announce, .5), pct(r.announce, .99), pct(r.withdraw, .5), pct(r.withdraw, .99))

	// Memory: the agent caches every Service and EndpointSlice.
	time.Sleep(settle)
	if r.rssEmpty, r.rssErr = p.RSS(); r.rssErr != nil {
		return r
	}
	for i := range nsvc {
		name := fmt.Sprintf("load-%d", i)
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		if _, err := cs.CoreV1().Services("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			r.rssErr = fmt.Errorf("Service %d: %w", i, err)
			return r
		}
		if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, endpointSlice(name, name+"-1", node.Name, neps, true), metav1.CreateOptions{}); err != nil {
			r.rssErr = fmt.Errorf("EndpointSlice %d: %w", i, err)
			return r
		}
	}
	time.Sleep(settle)
	r.rssLoaded, r.rssErr = p.RSS()
	logf("services: agent RSS %.1f MB, %.1f MB with %d Services × %d endpoints", r.rssEmpty, r.rssLoaded, nsvc, neps)
	return r
}

// endpointSlice is a Service's IPv4 slice of n endpoints on node, managed
// by the bench (so the EndpointSlice controller's publishNotReadyAddresses
// rule does not apply).
func endpointSlice(svc, name, node string, n int, ready bool) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{
			discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "flock-bench"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for i := range n {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.9.%d.%d", i/250, i%250+1)},
			NodeName:   ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
		})
	}
	return es
}

// svcFigures are the Services section's rows.
func svcFigures(r svcResult) []figure {
	const sec = "Services: an EndpointSlice change to the UPDATE on the ToR's wire (Kubernetes mode, real kube-apiserver, BIRD ToR)"
	errOf := func(err error) string {
		if err == nil {
			return ""
		}
		return firstLine(err.Error())
	}
	all := append(append([]time.Duration{}, r.announce...), r.withdraw...)
	val := func(d []time.Duration, q float64) float64 {
		if r.err != nil || len(d) == 0 {
			return nan()
		}
		return pct(d, q)
	}
	e := errOf(r.err)
	figs := []figure{
		{Section: sec, Name: "endpoint ready → external IP announced, p50", Value: val(r.announce, .5), Base: nan(), Unit: "ms", Limit: nan(), Err: e},
		{Section: sec, Name: "endpoint not ready → withdrawn, p50", Value: val(r.withdraw, .5), Base: nan(), Unit: "ms", Limit: nan(), Err: e},
		{Section: sec, Name: fmt.Sprintf("either, p99 (%d flips)", len(all)), Value: val(all, .99), Base: nan(), Unit: "ms", Max: true, Limit: 50, Err: e},
	}
	re := errOf(r.rssErr)
	if r.err != nil {
		re = e
	}
	rss := r.rssLoaded
	if re != "" || math.IsNaN(rss) {
		rss = nan()
	}
	figs = append(figs, figure{Section: sec, Name: fmt.Sprintf("agent RSS with %d Services × %d endpoints", r.services, r.endpoints),
		Value: rss, Base: r.rssEmpty, BaseName: "the same agent before", Unit: "MB", Limit: nan(), Err: re})
	return figs
}
