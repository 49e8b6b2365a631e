package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// Issue 21: the address a LoadBalancer Service is assigned (by the
// flock-policy holding the Lease) and which Service addresses the node
// advertises to the ToR (BIRD), from the Services, EndpointSlices and
// AddressClaims the API holds.
const k8sServicePools = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: k8s-loadbalancers}
spec:
  cidrs: [2001:db8:1b::/64, 198.51.100.240/28]
  use: [loadBalancer]
  namespaces: [default]
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: k8s-external-ips}
spec:
  cidrs: [2001:db8:e5::/64, 198.51.100.224/28]
  use: [externalIP]
  namespaces: [default]
`

// Two replicas Ready only while /tmp/ready exists; on delete a pod keeps
// serving for 20 s (preStop), as a rolling update's old pods do.
const k8sServiceWorkload = `apiVersion: apps/v1
kind: Deployment
metadata: {name: svcweb, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: svcweb}}
  template:
    metadata: {labels: {app: svcweb}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 30
      containers:
      - name: bb
        image: docker.io/local/busybox:1.35
        imagePullPolicy: Never
        command: ["sleep", "3600"]
        ports: [{containerPort: 8080, name: http}]
        readinessProbe:
          exec: {command: ["test", "-f", "/tmp/ready"]}
          periodSeconds: 1
          failureThreshold: 1
        lifecycle:
          preStop: {exec: {command: ["sleep", "20"]}}
---
apiVersion: v1
kind: Service
metadata: {name: svcweb-ext, namespace: default}
spec:
  selector: {app: svcweb}
  ipFamilyPolicy: PreferDualStack
  ports: [{name: http, port: 80, targetPort: http}]
  externalIPs: ["2001:db8:e5::5", "198.51.100.225", "2001:db8:99::5"]
---
apiVersion: v1
kind: Service
metadata:
  name: svcweb-lb
  namespace: default
  annotations: {flock.fritzlab.net/allow-shared-ip: svcweb}
spec:
  type: LoadBalancer
  loadBalancerClass: flock.fritzlab.net/bgp
  externalTrafficPolicy: Local
  selector: {app: svcweb}
  ipFamilyPolicy: PreferDualStack
  ports: [{name: http, port: 80, targetPort: http}]
`

// A second Service asking to share svcweb-lb's address (MetalLB's rules:
// the same key, traffic policy and selector, another port).
const k8sServiceSharer = `apiVersion: v1
kind: Service
metadata:
  name: svcweb-lb2
  namespace: default
  annotations:
    flock.fritzlab.net/allow-shared-ip: svcweb
    flock.fritzlab.net/loadBalancerIPs: 198.51.100.240
spec:
  type: LoadBalancer
  loadBalancerClass: flock.fritzlab.net/bgp
  externalTrafficPolicy: Local
  selector: {app: svcweb}
  ipFamilyPolicy: PreferDualStack
  ports: [{name: alt, port: 8443, targetPort: http}]
`

func testServices(t *testing.T, e *k8sEnv) {
	e.t = t
	ext6, ext4 := netip.MustParsePrefix("2001:db8:e5::5/128"), netip.MustParsePrefix("198.51.100.225/32")
	denied := netip.MustParsePrefix("2001:db8:99::5/128")
	// This lab's Services are IPv4-only (no IPv6 Service range without
	// kube-proxy): no kube-proxy serves an IPv6 external IP of theirs, so
	// it is never advertised.
	e.apply(k8sServicePools)
	e.apply(k8sServiceWorkload)
	t.Cleanup(func() {
		_, _ = e.c.Kubectl(context.Background(), "delete", "deployment/svcweb", "service/svcweb-ext", "service/svcweb-lb", "--wait=false")
	})
	// The flock-policy holding the Lease assigns the LoadBalancer's
	// address: the first of the IPv4 pool (the Service is IPv4-only here),
	// claimed for the Service, written with ipMode VIP.
	lb4 := netip.MustParsePrefix("198.51.100.240/32")
	testutil.EventuallyWithin(t, 60*time.Second, "the LoadBalancer's address assigned", func() (bool, string) {
		out, _ := e.c.Kubectl(t.Context(), "get", "service", "svcweb-lb", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip} {.status.loadBalancer.ingress[*].ipMode}")
		return out == "198.51.100.240 VIP", out
	})
	if out := e.kubectl("get", "addressclaim", "ipv4-198.51.100.240", "-o", "jsonpath={.spec.use} {.spec.service.namespace}/{.spec.service.name} {.spec.pool}"); out != "loadBalancer default/svcweb-lb k8s-loadbalancers" {
		t.Errorf("the address's claim: %q", out)
	}
	// Issue 30: a second Service shares the address; both hold its one
	// claim, and neither moves (the claim's update starts a full pass,
	// where the first Service's address used to move once the second's
	// refusal had reserved it).
	e.apply(k8sServiceSharer)
	t.Cleanup(func() {
		_, _ = e.c.Kubectl(context.Background(), "delete", "service/svcweb-lb2", "--wait=false")
	})
	testutil.EventuallyWithin(t, 60*time.Second, "the second Service given the shared address", func() (bool, string) {
		out, _ := e.c.Kubectl(t.Context(), "get", "service", "svcweb-lb2", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}")
		return out == "198.51.100.240", out
	})
	sharedClaim := func() string {
		out, _ := e.c.Kubectl(t.Context(), "get", "addressclaim", "ipv4-198.51.100.240", "-o", "jsonpath={.spec.sharingKey} {.spec.service.name} {.spec.sharers[*].name}")
		return strings.TrimSpace(out)
	}
	if out := sharedClaim(); out != "svcweb svcweb-lb svcweb-lb2" {
		t.Errorf("the shared address's claim (key, service, sharers): %q, want both Services under key svcweb", out)
	}
	// The agents may update claims (a shared address's holders), so the
	// API server keeps the rest: a claim's IP never changes, a pod's
	// claim not at all.
	e.apply(`apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressClaim
metadata: {name: ipv6-2001-0db8-0099-0000-0000-0000-0000-0077}
spec: {ip: "2001:db8:99::77", use: addresses, pod: {namespace: default, name: ghost}, node: vm, containerID: c0ffee}
`)
	for _, tc := range []struct{ claim, patch, want string }{
		{"ipv6-2001-0db8-0099-0000-0000-0000-0000-0077", `{"spec":{"node":"elsewhere"}}`, "a pod's claim never changes"},
		{"ipv4-198.51.100.240", `{"spec":{"ip":"198.51.100.241"}}`, "spec.ip and spec.use never change"},
	} {
		out, err := e.c.Kubectl(t.Context(), "patch", "addressclaim", tc.claim, "--type=merge", "-p", tc.patch)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("patch %s %s: %v %q, want refused with %q", tc.claim, tc.patch, err, out, tc.want)
		}
	}
	e.kubectl("delete", "addressclaim", "ipv6-2001-0db8-0099-0000-0000-0000-0000-0077")
	testutil.Consistently(t, "neither Service moves off the shared address", 3*time.Second, func() (bool, string) {
		out, _ := e.c.Kubectl(t.Context(), "get", "service", "svcweb-lb", "svcweb-lb2", "-o", "jsonpath={.items[*].status.loadBalancer.ingress[*].ip}")
		return out == "198.51.100.240 198.51.100.240", out
	})
	if out := e.kubectl("get", "lease", "-n", "flock-system", "flock-loadbalancers", "-o", "jsonpath={.spec.holderIdentity}"); out != k8sNode {
		t.Errorf("Lease holder %q, want the node %s", out, k8sNode)
	}
	testutil.EventuallyWithin(t, 30*time.Second, "a Warning Event for the external IP no pool allows", func() (bool, string) {
		out, _ := e.c.Kubectl(t.Context(), "get", "events", "--field-selector", "involvedObject.name=svcweb-ext,reason=ExternalIPNotAllowed", "-o", "jsonpath={.items[*].message}")
		return strings.Contains(out, `spec.externalIPs "2001:db8:99::5" is not advertised`), out
	})
	pods := func() []string {
		var names []string
		testutil.EventuallyWithin(t, 90*time.Second, "two svcweb pods Running", func() (bool, string) {
			out, _ := e.c.Kubectl(t.Context(), "get", "pods", "-l", "app=svcweb", "--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
			names = strings.Fields(out)
			return len(names) == 2, out
		})
		return names
	}()
	// flockctl services -o json, as IP → "state: reason" (svcweb-lb2's
	// rows, of the address it shares, as "svcweb-lb2 IP").
	services := func() map[string]string {
		out := e.kubectl("-n", "flock-system", "exec", "ds/flock", "-c", "agent", "--", "flockctl", "-o", "json", "services")
		var rows []struct{ Service, IP, Raw, State, Reason string }
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("flockctl -o json services: %v\n%s", err, out)
		}
		m := map[string]string{}
		for _, r := range rows {
			k := r.IP
			if r.Service == "default/svcweb-lb2" {
				k = "svcweb-lb2 " + k
			}
			m[k] = r.State + ": " + r.Reason
		}
		return m
	}
	ready := func(pod string, on bool) {
		cmd := []string{"exec", pod, "--", "rm", "-f", "/tmp/ready"}
		if on {
			cmd = []string{"exec", pod, "--", "touch", "/tmp/ready"}
		}
		e.kubectl(cmd...)
	}

	// waitBird, saying what the agent and the API think when it fails.
	wait := func(p netip.Prefix, n int) {
		t.Helper()
		testutil.EventuallyWithin(t, 30*time.Second, fmt.Sprintf("the ToR to hold %d path(s) for %s", n, p), func() (bool, string) {
			got := e.birdPaths(p)
			if got == n {
				return true, ""
			}
			eps, _ := e.c.Kubectl(context.Background(), "get", "endpointslices", "-l", "kubernetes.io/service-name in (svcweb-ext,svcweb-lb)", "-o", "yaml")
			return false, fmt.Sprintf("%d paths; flockctl services: %v\nbgp routes:\n%s\nEndpointSlices:\n%s", got, services(),
				e.kubectl("-n", "flock-system", "exec", "ds/flock", "-c", "agent", "--", "flockctl", "bgp", "routes"), tail(eps, 60))
		})
	}

	// Nothing ready: nothing advertised, and flockctl says why.
	testutil.EventuallyWithin(t, 30*time.Second, "flockctl services to list the addresses, none advertised", func() (bool, string) {
		m := services()
		return m["198.51.100.225"] == "not advertised: no usable endpoint in the cluster" &&
			m["198.51.100.240"] == "not advertised: no usable endpoint in the cluster" &&
			strings.HasPrefix(m["2001:db8:99::5"], "not advertised: address not authorized"), fmt.Sprint(m)
	})
	for _, p := range []netip.Prefix{ext6, ext4, lb4, denied} {
		if n := e.birdPaths(p); n != 0 {
			t.Errorf("%s at the ToR with no ready endpoint (%d paths)", p, n)
		}
	}

	// One replica ready: the IPv4 external IP (Cluster) and the
	// LoadBalancer address (Local: the endpoint is on this node) go out;
	// the IPv6 one (no IPv6 endpoints) and the one no pool allows never
	// do, and flockctl says why.
	ready(pods[0], true)
	wait(ext4, 1)
	wait(lb4, 1)
	if m := services(); m["198.51.100.225"] != "advertised: ready endpoint in the cluster" || m["198.51.100.240"] != "advertised: local ready endpoint" ||
		m["svcweb-lb2 198.51.100.240"] != "advertised: local ready endpoint" ||
		!strings.HasPrefix(m["2001:db8:e5::5"], "not advertised: no kube-proxy of this family serves the Service") ||
		!strings.Contains(m["2001:db8:99::5"], "no AddressPool allows namespace default to use 2001:db8:99::5 as externalIP") {
		t.Errorf("flockctl services: %v", m)
	}
	for _, p := range []netip.Prefix{denied, ext6} {
		if n := e.birdPaths(p); n != 0 {
			t.Errorf("%s reached the ToR (%d paths)", p, n)
		}
	}
	if routes, _ := e.bird.Cmd("show route " + lb4.String() + " all"); strings.Contains(routes, "(65535,0)") {
		t.Errorf("a ready address carries GRACEFUL_SHUTDOWN:\n%s", routes)
	}

	// Readiness lost everywhere: withdrawn.
	ready(pods[0], false)
	wait(ext4, 0)
	wait(lb4, 0)

	// Both ready, then one deleted: it keeps serving while terminating,
	// the other still ready: advertised as before (no drain while a
	// ready endpoint is local). Then the last ready one is deleted too:
	// drain (GRACEFUL_SHUTDOWN and the AS prepended) while it serves,
	// withdrawn when it is gone.
	ready(pods[0], true)
	ready(pods[1], true)
	wait(lb4, 1)
	e.kubectl("scale", "deployment/svcweb", "--replicas=0")
	testutil.EventuallyWithin(t, 30*time.Second, "the LoadBalancer address to drain at the ToR", func() (bool, string) {
		out, _ := e.bird.Cmd("show route " + lb4.String() + " all")
		// LOCAL_PREF 0: the shipped ToR config's policy (flock_drain).
		return strings.Contains(out, "(65535,0)") && strings.Contains(out, "64512 64512 64512 64512") && strings.Contains(out, "BGP.local_pref: 0"), out
	})
	if m := services(); m["198.51.100.240"] != "draining: local endpoints terminating" {
		t.Errorf("flockctl services does not show the drain: %v", m)
	}
	wait(ext4, 1) // Cluster: the terminating endpoints still serve
	testutil.EventuallyWithin(t, 60*time.Second, "the addresses withdrawn once nothing serves", func() (bool, string) {
		n := e.birdPaths(lb4) + e.birdPaths(ext4)
		return n == 0, fmt.Sprintf("%d paths", n)
	})

	// Switched to ClusterIP: its hold on the address given up, the claim
	// stays with the Service still sharing it; with that one gone too,
	// the address released (its claim deleted) and never advertised
	// again.
	e.kubectl("patch", "service", "svcweb-lb", "--type=merge", "-p", `{"spec":{"type":"ClusterIP"}}`)
	testutil.EventuallyWithin(t, 30*time.Second, "the claim held by the remaining sharer alone", func() (bool, string) {
		out := sharedClaim()
		return out == "svcweb svcweb-lb2", out
	})
	if out, _ := e.c.Kubectl(t.Context(), "get", "service", "svcweb-lb2", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}"); out != "198.51.100.240" {
		t.Errorf("svcweb-lb2 moved off the address when svcweb-lb left it: %q", out)
	}
	e.kubectl("delete", "service", "svcweb-lb2")
	testutil.EventuallyWithin(t, 30*time.Second, "the claim of the released address gone", func() (bool, string) {
		out, err := e.c.Kubectl(t.Context(), "get", "addressclaim", "ipv4-198.51.100.240", "-o", "name")
		return err != nil && strings.Contains(out, "NotFound"), out
	})
}
