package e2e

import (
	"context"
	"errors"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// A second real node: its own network namespace behind the lab's ToR, its
// own mount namespace, containerd and kubelet (k8slab.AddNode), flock's
// DaemonSet pod on it like on any node. Pod to pod between the nodes goes
// through the routed fabric (each node's summaries learnt by the ToR over
// BGP), and NetworkPolicy holds across them.

const node2 = "vm2"

var (
	node2V6, torNode2V6 = netip.MustParseAddr("fd00:0:98::1"), netip.MustParseAddr("fd00:0:98::2")
	node2V4, torNode2V4 = netip.MustParseAddr("192.0.2.105"), netip.MustParseAddr("192.0.2.106")
	node2Summary6       = netip.MustParsePrefix("fd00:10:98::/64")
	node2Summary4       = netip.MustParsePrefix("198.51.100.160/27")
)

const node2Config = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: {name: vm2}
spec:
  asn: 64514
  routerID: 192.0.2.105
  defaults: {ipv4: true}
  pools:
  - cidr: fd00:10:98::/64
  - cidr: 198.51.100.160/27
  bgp:
    listenPort: -1
    peers:
    - address: fd00:0:98::2
      asn: 64513
      localAddress: fd00:0:98::1
      timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
`

// k8sBirdTwo is the ToR with both nodes as neighbours.
const k8sBirdTwo = k8sBird + `protocol bgp vm2 {
  local fd00:0:98::2 as 64513;
  neighbor fd00:0:98::1 as 64514;
  hold time 9; keepalive time 3; connect retry time 1;
  ipv6 { import all; export none; };
  ipv4 { import all; export none; extended next hop on; };
}
`

// checkPool lets flockctl check give its probe pods `addresses` and
// anycast IPs (the host routes 2001:db8:c::/64 through the ToR).
const checkPool = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: flock-check}
spec:
  cidrs: [2001:db8:c::/120]
  use: [addresses, anycast]
  namespaceSelector: {matchLabels: {flock.fritzlab.net/check: "true"}}
`

// route is a static route a lab adds.
type route struct {
	ns  *lab.NS
	dst netip.Prefix
	via netip.Addr
}

// hostNS is the host's network namespace: node vm's.
var hostNS = &lab.NS{Name: "host", Path: "/proc/self/ns/net"}

// wireTwoNodes wires a two-node lab's fabric: the host (node vm) and vm2's
// namespace each linked to the ToR, forwarding on; vm2 sends everything to
// its ToR, as a node in a rack does; the host (whose default route is the
// machine's own uplink) routes only vm2's link and pools through it; plus
// extra routes.
func wireTwoNodes(t *testing.T, e *k8sEnv, tor, vm2 *lab.NS, extra ...route) {
	t.Helper()
	e.tor = tor
	wireLink(t, hostNS, hostTorIf, tor, "to-host", []netip.Prefix{netip.PrefixFrom(hostV6, 64), netip.PrefixFrom(hostV4, 30)},
		[]netip.Prefix{netip.PrefixFrom(torV6, 64), netip.PrefixFrom(torV4, 30)})
	wireLink(t, vm2, "to-tor", tor, "to-vm2", []netip.Prefix{netip.PrefixFrom(node2V6, 64), netip.PrefixFrom(node2V4, 30)},
		[]netip.Prefix{netip.PrefixFrom(torNode2V6, 64), netip.PrefixFrom(torNode2V4, 30)})
	forwarding(t, tor, vm2)
	routes := append([]route{{vm2, netip.MustParsePrefix("::/0"), torNode2V6}, {vm2, netip.MustParsePrefix("0.0.0.0/0"), torNode2V4},
		{hostNS, netip.MustParsePrefix("fd00:0:98::/64"), torV6}, {hostNS, netip.MustParsePrefix("192.0.2.104/30"), torV4},
		{hostNS, node2Summary6, torV6}, {hostNS, node2Summary4, torV4}}, extra...)
	for _, r := range routes {
		if err := r.ns.RouteAdd(r.dst, r.via); err != nil {
			t.Fatalf("route %s via %s in %s: %v", r.dst, r.via, r.ns.Name, err)
		}
	}
}

// tnPod is a pod pinned to a node.
func tnPod(name, node, role string, server bool, addresses string) string {
	y := npPod(name, role, "", addresses, server)
	return strings.Replace(y, "spec:\n", "spec:\n  nodeName: "+node+"\n", 1)
}

func TestKubernetesTwoNodes(t *testing.T) {
	ctx := context.Background()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prepareK8sHost(t)
	imageTar := buildFlockImage(t, root, dir)
	// The namespaces first: their cleanup runs after the cluster's.
	tor := newNS(t, "k8stor-")
	vm2 := newNS(t, "k8svm2-")
	c, err := k8slab.Up(ctx, k8slab.Options{Dir: filepath.Join(dir, "k8s"), NodeName: k8sNode,
		NodeIP: hostV6.String() + ",192.0.2.2", CNIBinDir: cniBinDir, CNIConfDir: cniConfDir, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	e := &k8sEnv{t: t, c: c}
	var n2 *k8slab.Node
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.Kubectl(context.Background(), "get", "pods", "-A", "-o", "wide")
			t.Logf("pods:\n%s", out)
			if n2 != nil {
				t.Logf("vm2 kubelet:\n%s", n2.LogTail(k8slab.Kubelet, 30))
			}
		}
		dctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, _ = c.Kubectl(dctx, "delete", "networkpolicy,pod", "--all", "-n", "default", "--wait=true", "--timeout=90s")
		_, _ = c.Kubectl(dctx, "delete", "-k", filepath.Join(root, "deploy"), "--wait=true", "--timeout=60s")
		if n2 != nil {
			if err := n2.Down(); err != nil {
				t.Errorf("node vm2 teardown: %v", err)
			}
		}
		if err := c.Down(); err != nil {
			t.Errorf("cluster teardown: %v", err)
		}
	})
	if err := c.ImportImage(ctx, imageTar); err != nil {
		t.Fatal(err)
	}

	// The fabric; the host also routes the test's `addresses` IP there.
	wireTwoNodes(t, e, tor, vm2, route{hostNS, netip.MustParsePrefix("2001:db8:b::/64"), torV6}, route{hostNS, netip.MustParsePrefix("2001:db8:c::/64"), torV6})
	// The host's routes through the ToR go with its link (flktor0).
	e.startBird(dir, k8sBirdTwo)

	t.Log("adding node vm2 (its own netns, mounts, containerd, kubelet)")
	n2, err = c.AddNode(ctx, k8slab.NodeOptions{Name: node2, Netns: vm2.Path, NodeIP: node2V6.String() + "," + node2V4.String()})
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.ImportImage(ctx, imageTar); err != nil {
		t.Fatal(err)
	}

	e.kubectl("apply", "-k", filepath.Join(root, "deploy"))
	e.apply(k8sNodeConfig)
	e.apply(node2Config)
	e.apply(k8sAddressesPool)
	e.waitPods("flock on both nodes", "-n", "flock-system", "-l", agentSelector)
	if n := strings.Fields(e.kubectl("-n", "flock-system", "get", "pods", "-l", agentSelector, "-o", "jsonpath={.items[*].spec.nodeName}")); len(n) != 2 {
		t.Fatalf("flock pods on nodes %v, want vm and vm2", n)
	}
	if err := c.WaitNodeReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n2.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("each node's summaries at the ToR over BGP", func(t *testing.T) {
		e.t = t
		for _, p := range []netip.Prefix{k8sSummary6, k8sSummary4, node2Summary6, node2Summary4} {
			e.waitBird(p, 1)
		}
	})

	e.apply(tnPod("srv2", node2, "tn-server", true, "2001:db8:b::30"))
	e.apply(tnPod("other2", node2, "tn-other", true, ""))
	e.apply(tnPod("cli", k8sNode, "tn-client", false, ""))
	e.apply(tnPod("stranger", k8sNode, "tn-stranger", false, ""))
	e.waitPods("the two-node pods", "srv2", "other2", "cli", "stranger")
	srv, other := e.podIPs("default", "srv2"), e.podIPs("default", "other2")
	cli := e.podIPs("default", "cli")
	srvAddr := netip.MustParseAddr("2001:db8:b::30")

	t.Run("pod to pod across the nodes, both families", func(t *testing.T) {
		e.t = t
		if !node2Summary6.Contains(ipOf(srv, true)) || !node2Summary4.Contains(ipOf(srv, false)) {
			t.Fatalf("srv2 on vm2 got %v, want addresses from vm2's pools", srv)
		}
		for _, ip := range cli {
			if out, err := c.Kubectl(ctx, "exec", "srv2", "--", "ping", "-c", "1", "-W", "3", ip.String()); err != nil {
				t.Errorf("vm2 → vm: ping %s: %v\n%s", ip, err, out)
			}
		}
		e.expect(t, "cli", allowed, append(append([]netip.Addr{}, srv...), srvAddr)...)
	})

	t.Run("NetworkPolicy across the nodes", func(t *testing.T) {
		e.t = t
		// Ingress, enforced on vm2 for clients on vm.
		e.apply(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: tn-ingress, namespace: default}
spec:
  podSelector: {matchLabels: {role: tn-server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: tn-client}}}]
    ports: [{port: 8080, protocol: TCP}]
`)
		e.expect(t, "stranger", blocked, append(append([]netip.Addr{}, srv...), srvAddr)...)
		e.expect(t, "cli", allowed, append(append([]netip.Addr{}, srv...), srvAddr)...)
		// Egress, enforced on vm for servers on vm2: the remote pod's
		// `addresses` IP is known from its AddressClaim.
		e.apply(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: tn-egress, namespace: default}
spec:
  podSelector: {matchLabels: {role: tn-client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {role: tn-server}}}]
    ports: [{port: 8080, protocol: TCP}]
`)
		e.expect(t, "cli", allowed, append(append([]netip.Addr{}, srv...), srvAddr)...)
		e.expect(t, "cli", blocked, other...)
	})

	t.Run("flockctl policy on vm2", func(t *testing.T) {
		e.t = t
		pod := strings.TrimSpace(e.kubectl("-n", "flock-system", "get", "pods", "-l", agentSelector, "--field-selector", "spec.nodeName="+node2, "-o", "jsonpath={.items[0].metadata.name}"))
		out := e.kubectl("-n", "flock-system", "exec", pod, "-c", "agent", "--", "flockctl", "policy", "default/srv2")
		if !strings.Contains(out, "tn-ingress") || !strings.Contains(out, srvAddr.String()) {
			t.Errorf("flockctl policy on vm2 does not show tn-ingress and %s:\n%s", srvAddr, out)
		}
	})

	t.Run("flockctl check passes, and cleans up after a check cut short", func(t *testing.T) {
		e.t = t
		e.apply(checkPool)
		// A namespace a check cut short left behind.
		e.kubectl("create", "namespace", "flock-check-cutshort")
		e.kubectl("label", "namespace", "flock-check-cutshort", "flock.fritzlab.net/check=true")
		rs := flockctlCheck(t, c, "two nodes")
		want := map[string]bool{"earlier check cleaned up": false, "pod → pod across nodes (vm → vm2, IPv6)": false, "pod → pod across nodes (vm → vm2, IPv4)": false,
			"NetworkPolicy: another pod is blocked (IPv6)": false, "BGP sessions and routes: vm2": false,
			"pod → addresses IP": false, "pod → anycast IP": false}
		for _, r := range rs {
			key := r.Check
			for _, kind := range []string{"pod → addresses IP", "pod → anycast IP"} {
				if strings.HasPrefix(key, kind) {
					key = kind
				}
			}
			if _, ok := want[key]; ok && r.Result == "pass" {
				want[key] = true
			}
		}
		for k, ok := range want {
			if !ok {
				t.Errorf("flockctl check: %q did not pass: %+v", k, rs)
			}
		}
		if out := e.kubectl("get", "namespaces", "-l", "flock.fritzlab.net/check", "-o", "name"); strings.TrimSpace(out) != "" {
			t.Errorf("flockctl check left namespaces: %s", out)
		}
		// Without the rights: it says which, makes nothing, exits 1.
		e.kubectl("create", "serviceaccount", "nobody")
		token := strings.TrimSpace(e.kubectl("create", "token", "nobody", "--duration=1h"))
		kubeconfig := filepath.Join(t.TempDir(), "nobody.kubeconfig")
		if err := c.WriteTokenKubeconfig(kubeconfig, token); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(buildFlockctl(t), "check", "--kubeconfig", kubeconfig, "--image", k8sImage)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "lacks rights: create namespaces") || !strings.Contains(string(out), "create pods in namespace flock-check-") {
			t.Errorf("flockctl check without rights: %v\n%s", err, out)
		}
		if out := e.kubectl("get", "namespaces", "-l", "flock.fritzlab.net/check", "-o", "name"); strings.TrimSpace(out) != "" {
			t.Errorf("flockctl check without rights made namespaces: %s", out)
		}
	})
	t.Run("LoadBalancer addresses survive their leader", func(t *testing.T) {
		testLoadBalancerLeader(t, e, [2]string{k8sNode, node2})
	})
	t.Run("Service next hops: Local only where endpoints are, Cluster everywhere, a node drained", func(t *testing.T) {
		testServiceNextHops(t, e, [2]string{k8sNode, node2})
	})
}
