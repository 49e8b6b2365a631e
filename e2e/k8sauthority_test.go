package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// k8sAddressPools: the anycast IPs of the workloads; the `addresses` pool
// is applied later, so that a pod that needs it first waits.
const k8sAnycastPool = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: k8s-anycast}
spec:
  cidrs: [2001:db8:a::/64, 203.0.113.0/24]
  use: [anycast]
  namespaces: [default]
`

const k8sAddressesPool = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: k8s-addresses}
spec:
  cidrs: [2001:db8:b::/64]
  use: [addresses]
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: default}}
`

// testPodWaitsForAddressPool: a pod asking for an `addresses` IP no
// AddressPool allows stays in ContainerCreating with flock's message in
// its events; once a pool allows it, kubelet's retry starts it.
func testPodWaitsForAddressPool(t *testing.T, e *k8sEnv) {
	e.t = t
	ctx := context.Background()
	testutil.EventuallyWithin(t, 90*time.Second, "pod solo to report flock's refusal", func() (bool, string) {
		out, _ := e.c.Kubectl(ctx, "describe", "pod", "solo")
		return strings.Contains(out, "no AddressPool allows namespace default to use 2001:db8:b::10 as addresses") &&
			strings.Contains(out, "flock.fritzlab.net/addresses"), tail(out, 15)
	})
	if out := e.kubectl("get", "pod", "solo", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason}"); out != "ContainerCreating" {
		t.Errorf("solo is %q, want ContainerCreating", out)
	}
	if p := hostPods(t); len(p) != 0 {
		for _, x := range p {
			if x.Name == "solo" {
				t.Errorf("the refused pod holds an allocation: %+v", x)
			}
		}
	}
	e.apply(k8sAddressesPool)
	e.waitPods("solo after its AddressPool exists", "solo")
	testutil.EventuallyWithin(t, 30*time.Second, "kubectl get addresspools to count solo's claim", func() (bool, string) {
		out, _ := e.c.Kubectl(ctx, "get", "addresspools", "k8s-addresses")
		f := strings.Fields(out)
		return len(f) > 0 && slicesContains(f, "1") && strings.Contains(out, "2001:db8:b::/64") && strings.Contains(out, "addresses"), out
	})
	out := e.kubectl("get", "addressclaims", "-o", "wide")
	if !strings.Contains(out, "2001:db8:b::10") || !strings.Contains(out, "solo") || !strings.Contains(out, k8sNode) {
		t.Errorf("kubectl get addressclaims:\n%s", out)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// testTwoNodesClaim: two more agents in Kubernetes mode, as nodes node1
// and node2 in their own network namespaces behind a BIRD ToR, talking to
// the lab's API server with the flock ServiceAccount's token (its RBAC for
// real). Pods are created in the API with spec.nodeName set and ADDed
// through libcni. They race to give 50 pods each an address from one
// cluster-wide pool: 100 distinct IPs, never one advertised twice. An
// `addresses` IP claimed on node1 is refused on node2 with the holder
// named, and deleting the pod frees it for node2.
func testTwoNodesClaim(t *testing.T, e *k8sEnv) {
	e.t = t
	ctx := context.Background()
	token := strings.TrimSpace(e.kubectl("-n", "flock-system", "create", "token", "flock", "--duration=2h"))
	kubeconfig := filepath.Join(t.TempDir(), "flock-sa.kubeconfig")
	if err := e.c.WriteTokenKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}
	e.apply(`apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: two-node-pods}
spec:
  cidrs: [2001:db8:100::/112]
  use: [pod]
  namespaces: [default]
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: two-node-addresses}
spec:
  cidrs: [2001:db8:ab::/64]
  use: [addresses]
  namespaces: [default]
`)
	var nodes []string
	for i := 1; i <= 2; i++ {
		nodes = append(nodes, fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata: {name: node%d}\n", i))
	}
	e.apply(strings.Join(nodes, "---\n"))
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, _ = e.c.Kubectl(dctx, "delete", "pods", "-l", "flock-test=two-nodes", "--force", "--grace-period=0", "--wait=false")
		_, _ = e.c.Kubectl(dctx, "delete", "nodeconfigs", "node1", "node2", "--ignore-not-found")
		_, _ = e.c.Kubectl(dctx, "delete", "nodes", "node1", "node2", "--ignore-not-found")
		_, _ = e.c.Kubectl(dctx, "delete", "addresspools", "two-node-pods", "two-node-addresses", "--ignore-not-found")
	})
	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: randName("fk") + "-", Dir: t.TempDir(), BinDir: binDir, Nodes: 2,
		Kubeconfig: kubeconfig, AgentArgs: []string{"--metrics-address=", "--leak-gc-grace=5s"},
		Setup: func(n *lab.LabNode) error {
			// The lab's NodeConfig, without its standalone AddressPools.
			nc := strings.SplitN(lab.DefaultNodeConfig(n), "\n---\n", 2)[0]
			if out, err := e.c.KubectlStdin(ctx, nc, "apply", "-f", "-"); err != nil {
				return fmt.Errorf("NodeConfig %s: %v: %s", n.Name, err, out)
			}
			return apiProxy(t, n.NS)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range l.Nodes {
				t.Logf("%s agent log:\n%s", n.Name, tail(n.Agent.Log(), 40))
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("lab teardown: %v", err)
		}
	})
	if err := l.StartBird(lab.BirdOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := birdTor{l}
	for _, n := range l.Nodes {
		waitEstablished(t, n)
	}

	// 100 pods in the API, 50 per node, all from one cluster-wide range.
	const perNode = 50
	rng := netip.MustParsePrefix("2001:db8:100::/121") // 126 usable: collisions are likely
	var docs []string
	for _, n := range l.Nodes {
		for i := range perNode {
			docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s-%02d
  namespace: default
  labels: {flock-test: two-nodes}
  annotations: {flock.fritzlab.net/cidr6: "%s", flock.fritzlab.net/ipv4: "false"}
spec:
  nodeName: %s
  containers: [{name: c, image: docker.io/local/busybox:1.35}]
`, n.Name, i, rng, n.Name))
		}
	}
	e.apply(strings.Join(docs, "---\n"))

	// No prefix of the range is ever advertised by both nodes.
	stopWatch := make(chan struct{})
	watched := make(chan string, 1)
	go func() {
		var bad string
		defer func() { watched <- bad }()
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(100 * time.Millisecond):
			}
			out, err := l.Bird.Cmd("show route")
			if err != nil {
				continue
			}
			for p, paths := range parseBird(out) {
				if rng.Contains(p.Addr()) && paths > 1 && bad == "" {
					bad = fmt.Sprintf("%s advertised by %d nodes", p, paths)
				}
			}
		}
	}()
	type got struct {
		pod string
		ip  netip.Addr
	}
	results := make(chan got, 2*perNode)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, n := range l.Nodes {
		for i := range perNode {
			wg.Add(1)
			name := fmt.Sprintf("%s-%02d", n.Name, i)
			p := lab.Pod{ContainerID: "c" + name, NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", name)}
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				res, err := n.CNI.Add(ctx, p)
				if err != nil {
					t.Errorf("ADD %s on %s: %v", name, n.Name, err)
					return
				}
				t.Cleanup(func() { _ = n.CNI.Del(context.Background(), p) })
				results <- got{name, ipOf(podIPs(t, res), true)}
			}()
		}
	}
	wg.Wait()
	close(results)
	seen := map[netip.Addr]string{}
	for r := range results {
		if o, dup := seen[r.ip]; dup {
			t.Errorf("%s and %s both got %s", o, r.pod, r.ip)
		}
		if !rng.Contains(r.ip) {
			t.Errorf("%s got %s outside %s", r.pod, r.ip, rng)
		}
		seen[r.ip] = r.pod
	}
	if len(seen) != 2*perNode {
		t.Fatalf("%d distinct addresses, want %d", len(seen), 2*perNode)
	}
	for ip := range seen {
		torPaths(t, tr, host(ip), 1)
	}
	close(stopWatch)
	if bad := <-watched; bad != "" {
		t.Errorf("the ToR saw a duplicate: %s", bad)
	}
	claims := strings.Fields(e.kubectl("get", "addressclaims", "-o", "jsonpath={.items[*].spec.ip}"))
	inRange := 0
	for _, c := range claims {
		if a, err := netip.ParseAddr(c); err == nil && rng.Contains(a) {
			inRange++
		}
	}
	if inRange != 2*perNode {
		t.Errorf("%d AddressClaims in %s, want %d", inRange, rng, 2*perNode)
	}
	t.Logf("two nodes: %d pods, %d distinct addresses, %d claims", 2*perNode, len(seen), inRange)

	// One `addresses` IP: node1 holds it, node2 is refused naming the
	// holder, and gets it once node1's pod is gone.
	e.apply(`apiVersion: v1
kind: Pod
metadata: {name: pub-1, namespace: default, labels: {flock-test: two-nodes}, annotations: {flock.fritzlab.net/addresses: "2001:db8:ab::1"}}
spec: {nodeName: node1, containers: [{name: c, image: docker.io/local/busybox:1.35}]}
---
apiVersion: v1
kind: Pod
metadata: {name: pub-2, namespace: default, labels: {flock-test: two-nodes}, annotations: {flock.fritzlab.net/addresses: "2001:db8:ab::1"}}
spec: {nodeName: node2, containers: [{name: c, image: docker.io/local/busybox:1.35}]}
`)
	n1, n2 := l.Nodes[0], l.Nodes[1]
	p1 := lab.Pod{ContainerID: "cpub-1", NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", "pub-1")}
	p2 := lab.Pod{ContainerID: "cpub-2", NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", "pub-2")}
	if _, err := n1.CNI.Add(ctx, p1); err != nil {
		t.Fatal(err)
	}
	_, err = n2.CNI.Add(ctx, p2)
	if err == nil {
		t.Fatal("node2 took an addresses IP node1 holds")
	}
	for _, w := range []string{"2001:db8:ab::1", "pod default/pub-1", "node node1", "flock.fritzlab.net/addresses"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q does not name %q", err, w)
		}
	}
	if v := flockVeths(t, n2.NS); len(v) != perNode {
		t.Errorf("node2 has %d veths after the refused ADD, want %d", len(v), perNode)
	}
	if err := n1.CNI.Del(ctx, p1); err != nil {
		t.Fatal(err)
	}
	e.kubectl("delete", "pod", "pub-1", "--force", "--grace-period=0")
	if _, err := n2.CNI.Add(ctx, p2); err != nil {
		t.Fatalf("node2 after node1's pod left: %v", err)
	}
	t.Cleanup(func() { _ = n2.CNI.Del(context.Background(), p2) })
	if out := e.kubectl("get", "addressclaims", "-o", "wide"); !strings.Contains(out, "pub-2") || strings.Contains(out, "pub-1") {
		t.Errorf("claims after the handover:\n%s", out)
	}

	// A NodeConfig whose summary overlaps node1's: node1 stops advertising
	// its summary and says why in its NodeConfig status, until the other
	// one goes.
	torPaths(t, tr, n1.Summary6, 1)
	e.apply(fmt.Sprintf(`apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: {name: node9}
spec:
  asn: 64512
  routerID: 192.0.2.9
  pools: [{cidr: "%s"}]
`, netip.PrefixFrom(n1.Summary6.Addr(), 56).Masked()))
	torPaths(t, tr, n1.Summary6, 0)
	torPaths(t, tr, l.Nodes[1].Summary6, 1)
	testutil.EventuallyWithin(t, 30*time.Second, "node1's NodeConfig status to report the overlap", func() (bool, string) {
		out, _ := e.c.Kubectl(ctx, "get", "nodeconfig", "node1", "-o", "jsonpath={.status.lastError}")
		return strings.Contains(out, "overlaps node node9's summary"), out
	})
	e.kubectl("delete", "nodeconfig", "node9")
	torPaths(t, tr, n1.Summary6, 1)
}

func net127(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// parseBird counts the paths per prefix in `birdc show route`, learnt
// from the nodes.
func parseBird(out string) map[netip.Prefix]int {
	got := map[netip.Prefix]int{}
	var cur netip.Prefix
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if p, err := netip.ParsePrefix(f[0]); err == nil {
			cur = p
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == "unicast" && strings.HasPrefix(f[1], "[node") && cur.IsValid() {
			got[cur]++
		}
	}
	return got
}
