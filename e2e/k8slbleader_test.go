package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// lbService is a LoadBalancer Service of flock's class with no endpoints
// (assignment does not wait for them).
func lbService(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: default}
spec:
  type: LoadBalancer
  loadBalancerClass: flock.fritzlab.net/bgp
  selector: {app: %s}
  ports: [{name: http, port: 80}]
`, name, name)
}

// nodePID is the process of binary in node's flock pod.
func nodePID(t *testing.T, binary, node string) int {
	t.Helper()
	return findPID(t, binary, node)
}

func policyPIDOn(t *testing.T, node string) int {
	return nodePID(t, "/usr/local/bin/flock-policy", node)
}

// The LoadBalancer assigner runs in every node's flock-policy; the one
// holding the Lease flock-system/flock-loadbalancers writes. Its leader
// stopped (SIGSTOP: hung, or cut off from the API server), the other
// node's takes the Lease once it expires and assigns the next Service; the
// old one woken holds nothing; a leader killed (SIGKILL) is followed the
// same way. No address in use ever changes.
func testLoadBalancerLeader(t *testing.T, e *k8sEnv, nodes [2]string) {
	e.t = t
	e.apply(k8sServicePools)
	lease := func() string {
		return e.kubectl("get", "lease", "-n", "flock-system", "flock-loadbalancers", "-o", "jsonpath={.spec.holderIdentity}")
	}
	ingress := func(svc string) string {
		out, _ := e.c.Kubectl(t.Context(), "get", "service", svc, "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}")
		return out
	}
	assigned := func(svc string, within time.Duration) string {
		var ip string
		testutil.EventuallyWithin(t, within, svc+"'s address assigned", func() (bool, string) {
			ip = ingress(svc)
			return ip != "", "holder " + lease()
		})
		return ip
	}
	claimOf := func(ip string) string {
		out, _ := e.c.Kubectl(t.Context(), "get", "addressclaim", "ipv4-"+ip, "-o", "jsonpath={.spec.service.name}")
		return out
	}
	names := []string{"lb-a", "lb-b", "lb-c"}
	t.Cleanup(func() {
		for _, n := range names {
			_, _ = e.c.Kubectl(t.Context(), "delete", "service", n, "--wait=false")
		}
	})
	other := func(n string) string {
		if n == nodes[0] {
			return nodes[1]
		}
		return nodes[0]
	}

	e.apply(lbService("lb-a"))
	a := assigned("lb-a", 60*time.Second)
	first := lease()
	if first != nodes[0] && first != nodes[1] {
		t.Fatalf("Lease holder %q, want one of %v", first, nodes)
	}

	// The leader hung: the other takes over after the Lease expires
	// (15 s) and assigns a new Service; lb-a keeps its address.
	pid := policyPIDOn(t, first)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	e.apply(lbService("lb-b"))
	b := assigned("lb-b", 45*time.Second)
	if h := lease(); h != other(first) {
		t.Errorf("Lease holder %q while %s's flock-policy is stopped, want %s", h, first, other(first))
	}
	resume()
	// Woken, the old leader finds the Lease renewed by another and writes
	// nothing: the addresses stand, each claimed by its Service.
	time.Sleep(5 * time.Second)
	if h := lease(); h != other(first) {
		t.Errorf("Lease holder %q after %s's flock-policy woke, want %s still", h, first, other(first))
	}

	// The new leader killed: kubelet restarts it; whoever holds the Lease
	// next assigns the third Service.
	second := lease()
	if err := syscall.Kill(policyPIDOn(t, second), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.apply(lbService("lb-c"))
	assigned("lb-c", 60*time.Second)

	got := map[string]string{"lb-a": ingress("lb-a"), "lb-b": ingress("lb-b"), "lb-c": ingress("lb-c")}
	if got["lb-a"] != a || got["lb-b"] != b {
		t.Errorf("addresses changed across the leaders: lb-a %s → %s, lb-b %s → %s", a, got["lb-a"], b, got["lb-b"])
	}
	seen := map[string]string{}
	for svc, ip := range got {
		if prev, dup := seen[ip]; dup {
			t.Errorf("%s and %s both have %s", prev, svc, ip)
		}
		seen[ip] = svc
		if h := claimOf(ip); h != svc {
			t.Errorf("%s's address %s claimed by %q", svc, ip, h)
		}
	}
	t.Logf("leaders: %s, then %s (stopped the first), then %s (killed the second); addresses %v", first, second, lease(), got)
}
