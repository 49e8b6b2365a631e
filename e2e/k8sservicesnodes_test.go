package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// nextHopWorkload is one pod per node (anti-affinity), each serving for
// 10 s after it is deleted (preStop), behind a LoadBalancer Service with
// each externalTrafficPolicy.
const nextHopWorkload = `apiVersion: apps/v1
kind: Deployment
metadata: {name: hops, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: hops}}
  template:
    metadata: {labels: {app: hops}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 30
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {labelSelector: {matchLabels: {app: hops}}, topologyKey: kubernetes.io/hostname}
      containers:
      - name: bb
        image: docker.io/local/busybox:1.35
        imagePullPolicy: Never
        command: ["sleep", "3600"]
        ports: [{containerPort: 8080, name: http}]
        lifecycle:
          preStop: {exec: {command: ["sleep", "10"]}}
---
apiVersion: v1
kind: Service
metadata: {name: hops-local, namespace: default}
spec:
  type: LoadBalancer
  loadBalancerClass: flock.fritzlab.net/bgp
  externalTrafficPolicy: Local
  selector: {app: hops}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: hops-cluster, namespace: default}
spec:
  type: LoadBalancer
  loadBalancerClass: flock.fritzlab.net/bgp
  externalTrafficPolicy: Cluster
  selector: {app: hops}
  ports: [{name: http, port: 80, targetPort: http}]
`

var birdProto = regexp.MustCompile(`\[(\w+) [0-9:.]+\]`)

// torHops are the BGP sessions (the nodes) the ToR holds a path for p
// from, each with whether that path carries GRACEFUL_SHUTDOWN. An error
// is no reading (birdc failed, or said something else), not "no path".
func torHops(e *k8sEnv, p netip.Prefix) (map[string]bool, error) {
	out, err := e.bird.Cmd("show route " + p.String() + " all")
	hops := map[string]bool{}
	if strings.Contains(out, "Network not found") { // birdc exits 1 for it
		return hops, nil
	}
	if err != nil {
		return nil, err
	}
	// Each path's block starts with its protocol in brackets.
	idx := birdProto.FindAllStringSubmatchIndex(out, -1)
	if len(idx) == 0 {
		return nil, fmt.Errorf("birdc show route %s: neither a path nor \"Network not found\":\n%s", p, out)
	}
	for i, m := range idx {
		end := len(out)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		hops[out[m[2]:m[3]]] = strings.Contains(out[m[0]:end], "(65535,0)")
	}
	return hops, nil
}

// Which nodes the ToR sends a Service address to: with
// externalTrafficPolicy Local only the nodes with a ready endpoint, with
// Cluster every node. Draining a node (kubectl drain) first drains its
// Local path (GRACEFUL_SHUTDOWN while the evicted pod still serves), then
// withdraws it; the other node's path stays throughout.
func testServiceNextHops(t *testing.T, e *k8sEnv, nodes [2]string) {
	e.t = t
	e.apply(k8sServicePools)
	e.apply(nextHopWorkload)
	t.Cleanup(func() {
		_, _ = e.c.Kubectl(context.Background(), "uncordon", nodes[1])
		_, _ = e.c.Kubectl(context.Background(), "delete", "deployment/hops", "service/hops-local", "service/hops-cluster", "--wait=true", "--timeout=60s")
		_, _ = e.c.Kubectl(context.Background(), "delete", "pods", "-l", "app=hops", "--wait=true", "--timeout=60s")
	})
	e.waitPods("hops on both nodes", "-l", "app=hops")
	addr := map[string]netip.Prefix{}
	for _, svc := range []string{"hops-local", "hops-cluster"} {
		testutil.EventuallyWithin(t, 60*time.Second, svc+"'s address assigned", func() (bool, string) {
			out, _ := e.c.Kubectl(t.Context(), "get", "service", svc, "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
			a, err := netip.ParseAddr(out)
			addr[svc] = netip.PrefixFrom(a, a.BitLen())
			return err == nil, out
		})
	}
	local, cluster := addr["hops-local"], addr["hops-cluster"]
	hopsAre := func(what string, p netip.Prefix, want ...string) {
		t.Helper()
		testutil.EventuallyWithin(t, 30*time.Second, what, func() (bool, string) {
			h, err := torHops(e, p)
			if err != nil {
				return false, err.Error()
			}
			if len(h) != len(want) {
				return false, fmt.Sprint(h)
			}
			for _, w := range want {
				if _, ok := h[w]; !ok {
					return false, fmt.Sprint(h)
				}
			}
			return true, ""
		})
	}
	hopsAre("Local: both nodes (a ready endpoint on each)", local, nodes[0], nodes[1])
	hopsAre("Cluster: both nodes", cluster, nodes[0], nodes[1])

	// Drain the second node while the ToR is watched every 100 ms.
	type sample struct {
		local, cluster map[string]bool
		err            error
	}
	stop, done := make(chan struct{}), make(chan []sample, 1)
	go func() {
		var s []sample
		for {
			l, errL := torHops(e, local)
			c, errC := torHops(e, cluster)
			s = append(s, sample{l, c, errors.Join(errL, errC)})
			select {
			case <-stop:
				done <- s
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	// Only this workload's pods: the lab's other tests left bare pods
	// there, which drain refuses to evict.
	e.kubectl("drain", nodes[1], "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=app=hops", "--timeout=90s")
	// Local: the evicted pod's node withdraws once it is gone.
	hopsAre("Local: only the node with a ready endpoint left", local, nodes[0])
	// Cluster: every node still delivers (the other node's endpoint).
	hopsAre("Cluster: still both nodes", cluster, nodes[0], nodes[1])
	close(stop)
	samples := <-done
	drained, unread := false, 0
	for i, s := range samples {
		if s.err != nil {
			// No reading is no evidence either way; say so, and judge
			// the samples that read.
			t.Logf("sample %d: %v", i, s.err)
			unread++
			continue
		}
		if _, ok := s.local[nodes[0]]; !ok {
			t.Errorf("sample %d: the ToR lost %s's path to %s (Local) during the drain: %v", i, nodes[0], local, s.local)
		}
		if len(s.cluster) != 2 {
			t.Errorf("sample %d: %s (Cluster) not through both nodes during the drain: %v", i, cluster, s.cluster)
		}
		if s.local[nodes[1]] {
			drained = true
		}
		if s.local[nodes[0]] {
			t.Errorf("sample %d: %s's path to %s drains, but its endpoint is ready", i, nodes[0], local)
		}
	}
	if unread*2 > len(samples) {
		t.Errorf("%d of %d samples could not read the ToR", unread, len(samples))
	}
	if !drained {
		t.Errorf("in %d samples the drained node's path to %s never carried GRACEFUL_SHUTDOWN before it went", len(samples), local)
	}
	e.kubectl("uncordon", nodes[1])
}
