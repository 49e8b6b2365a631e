package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// nctTemplate peers every node of the lab's rack with its ToR: the AS from
// the node's rack label, the router ID its IPv4 InternalIP, the pools its
// spec.podCIDRs, the ToR's address an annotation, the session's source its
// IPv6 InternalIP.
const nctTemplate = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfigTemplate
metadata: {name: lab-rack}
spec:
  nodeSelector: {matchLabels: {flock.fritzlab.net/rack: lab}}
  asnFrom: {label: flock.fritzlab.net/asn}
  routerIDFrom: {nodeAddress: InternalIPv4}
  poolsFrom: {podCIDRs: true}
  template:
    defaults: {ipv4: true}
    bgp:
      peers:
      - addressFrom: {annotation: flock.fritzlab.net/tor-address}
        localAddressFrom: {nodeAddress: InternalIPv6}
        asn: 64513
        timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
`

// TestNodeConfigTemplate: a rack peered from one NodeConfigTemplate, no
// NodeConfig written by hand. An API server (the lab's, API only) holds
// the Nodes node1..node3 with their rack label, pod CIDRs, addresses and
// the ToR's address; agents in Kubernetes mode with the flock
// ServiceAccount's token (the shipped RBAC) render their own NodeConfigs
// and peer with a BIRD ToR: both sessions Established there, each node's
// pod CIDRs its summaries at the ToR. A NodeConfig taken over by hand for
// node2 overrides the template (its pool at the ToR, the template's
// gone); deleted, the template's comes back. Bad input: node3 lacks the
// AS label — no NodeConfig, its agent's readiness (and status, log,
// Event) names the label; labelled, it comes up. A running node whose
// label goes bad keeps its NodeConfig and says why in its status.
func TestNodeConfigTemplate(t *testing.T) {
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := apiOnlyLab(t)
	k := nctAPI{t: t, c: c}
	deploy := func(p string) string { return filepath.Join(root, "deploy", p) }
	k.kubectl("", "apply", "-f", deploy("namespace.yaml"))
	k.kubectl("", "apply", "-f", deploy("crd"))
	k.kubectl("", "apply", "-f", deploy("rbac.yaml"))
	k.kubectl(nctTemplate, "apply", "-f", "-")
	token := strings.TrimSpace(k.kubectl("", "-n", "flock-system", "create", "token", "flock", "--duration=1h"))
	kubeconfig := filepath.Join(t.TempDir(), "flock.kubeconfig")
	if err := c.WriteTokenKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}

	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: randName("fn") + "-", Dir: t.TempDir(), BinDir: binDir, Nodes: 3,
		Kubeconfig: kubeconfig, AgentArgs: []string{"--metrics-address=", "--leak-gc-grace=5s"},
		// node3 is the bad input: its agent is started below.
		SkipAgent: func(n *lab.LabNode) bool { return n.Index == 3 },
		// No NodeConfig is applied: the Node, then the API proxy.
		Setup: func(n *lab.LabNode) error {
			labels := "flock.fritzlab.net/rack: lab"
			if n.Index != 3 { // node3 lacks the AS label
				labels += fmt.Sprintf(`, flock.fritzlab.net/asn: "%d"`, lab.NodeASN)
			}
			node := fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %s
  labels: {%s}
  annotations: {flock.fritzlab.net/tor-address: "%s"}
spec:
  podCIDRs: ["%s", "%s"]
`, n.Name, labels, n.TorV6, n.Summary6, n.Summary4)
			if out, err := c.KubectlStdin(ctx, node, "apply", "-f", "-"); err != nil {
				return fmt.Errorf("Node %s: %v: %s", n.Name, err, out)
			}
			addrs := fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":"%s"},{"type":"InternalIP","address":"%s"},{"type":"Hostname","address":"%s"}]}}`, n.V6, n.V4, n.Name)
			if out, err := c.Kubectl(ctx, "patch", "node", n.Name, "--subresource=status", "--type=merge", "-p", addrs); err != nil {
				return fmt.Errorf("Node %s status: %v: %s", n.Name, err, out)
			}
			return apiProxy(t, n.NS)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range l.Nodes {
				if n.Agent != nil {
					t.Logf("%s agent log:\n%s", n.Name, tail(n.Agent.Log(), 40))
				}
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
	n1, n2, n3 := l.Nodes[0], l.Nodes[1], l.Nodes[2]

	// Rendered: labelled, owned by the template, the Node's values.
	for _, n := range []*lab.LabNode{n1, n2} {
		nc := k.nodeConfig(n.Name)
		if nc == nil {
			t.Fatalf("no NodeConfig %s", n.Name)
		}
		if nc.Metadata.Labels["flock.fritzlab.net/template"] != "lab-rack" || len(nc.Metadata.OwnerReferences) != 1 ||
			nc.Metadata.OwnerReferences[0].Kind != "NodeConfigTemplate" || nc.Metadata.OwnerReferences[0].Name != "lab-rack" {
			t.Errorf("NodeConfig %s: labels %v owners %+v, want rendered from lab-rack", n.Name, nc.Metadata.Labels, nc.Metadata.OwnerReferences)
		}
		s := nc.Spec
		if s.ASN != lab.NodeASN || s.RouterID != n.V4.String() || len(s.Pools) != 2 || s.Pools[0].CIDR != n.Summary6.String() || s.Pools[1].CIDR != n.Summary4.String() ||
			len(s.BGP.Peers) != 1 || s.BGP.Peers[0].Address != n.TorV6.String() || s.BGP.Peers[0].LocalAddress != n.V6.String() {
			t.Errorf("NodeConfig %s: spec %+v", n.Name, s)
		}
	}
	for _, n := range []*lab.LabNode{n1, n2} {
		waitEstablished(t, n)
		birdEstablished(t, l, n.Name)
		torPaths(t, tr, n.Summary6, 1)
		torPaths(t, tr, n.Summary4, 1)
	}
	testutil.EventuallyWithin(t, 30*time.Second, "kubectl get nct to count 2 nodes", func() (bool, string) {
		out, _ := c.Kubectl(ctx, "get", "nct", "lab-rack", "-o", "jsonpath={.status.nodes}")
		return strings.TrimSpace(out) == "2", out
	})
	if out := k.kubectl("", "get", "nct"); !strings.Contains(out, "NODES") || !strings.Contains(out, "lab-rack") {
		t.Errorf("kubectl get nct:\n%s", out)
	}

	t.Run("hand-made NodeConfig overrides", func(t *testing.T) {
		k := nctAPI{t: t, c: c} // this t: Fatal from the subtest's goroutine
		// Taken over: the template's label and owner removed, its own
		// pools, in one patch (the agent never sees it half done).
		own6, own4 := netip.MustParsePrefix("fd00:10:22::/64"), netip.MustParsePrefix("10.10.22.0/24")
		k.kubectl("", "patch", "nodeconfig", n2.Name, "--type=json", "-p", fmt.Sprintf(`[
{"op":"remove","path":"/metadata/labels/flock.fritzlab.net~1template"},
{"op":"remove","path":"/metadata/ownerReferences"},
{"op":"replace","path":"/spec/pools","value":[{"cidr":"%s"},{"cidr":"%s"}]}]`, own6, own4))
		// Pools take effect at the agent's restart.
		restartAgent(t, l, n2)
		torPaths(t, tr, own6, 1)
		torPaths(t, tr, own4, 1)
		torPaths(t, tr, n2.Summary6, 0)
		torPaths(t, tr, n2.Summary4, 0)
		// Untouched by the agent: still hand-made, its pools.
		testutil.Consistently(t, "the hand-made NodeConfig to stay", 3*time.Second, func() (bool, string) {
			nc := k.nodeConfig(n2.Name)
			ok := nc != nil && nc.Metadata.Labels["flock.fritzlab.net/template"] == "" && len(nc.Spec.Pools) == 2 && nc.Spec.Pools[0].CIDR == own6.String()
			return ok, fmt.Sprintf("%+v", nc)
		})
		// Deleted: the template renders node2's again.
		k.kubectl("", "delete", "nodeconfig", n2.Name)
		testutil.EventuallyWithin(t, 30*time.Second, "node2's NodeConfig rendered again", func() (bool, string) {
			nc := k.nodeConfig(n2.Name)
			return nc != nil && nc.Metadata.Labels["flock.fritzlab.net/template"] == "lab-rack" && len(nc.Spec.Pools) == 2 &&
				nc.Spec.Pools[0].CIDR == n2.Summary6.String(), fmt.Sprintf("%+v", nc)
		})
		restartAgent(t, l, n2)
		torPaths(t, tr, n2.Summary6, 1)
		torPaths(t, tr, n2.Summary4, 1)
		torPaths(t, tr, own6, 0)
		torPaths(t, tr, own4, 0)
	})

	t.Run("bad label on a running node", func(t *testing.T) {
		k := nctAPI{t: t, c: c} // this t: Fatal from the subtest's goroutine
		before := k.nodeConfig(n1.Name)
		k.kubectl("", "label", "node", n1.Name, "--overwrite", "flock.fritzlab.net/asn=rack-a")
		want := `NodeConfigTemplate lab-rack: spec.asnFrom.label: node node1: label flock.fritzlab.net/asn="rack-a" is not an AS number (1..4294967294)`
		testutil.EventuallyWithin(t, 30*time.Second, "node1's status to name the bad label", func() (bool, string) {
			var st struct {
				ConfigError string   `json:"configError"`
				Problems    []string `json:"problems"`
			}
			flockctlJSON(t, n1.Agent, &st, "status")
			return strings.Contains(st.ConfigError, want), st.ConfigError
		})
		testutil.EventuallyWithin(t, 30*time.Second, "NodeConfig node1's Ready condition to name it", func() (bool, string) {
			out, _ := c.Kubectl(ctx, "get", "nodeconfig", n1.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)
			return strings.Contains(out, "spec.asnFrom.label"), out
		})
		if after := k.nodeConfig(n1.Name); before == nil || after == nil || after.Metadata.Generation != before.Metadata.Generation ||
			after.Spec.ASN != lab.NodeASN || after.Metadata.Labels["flock.fritzlab.net/template"] != "lab-rack" {
			t.Errorf("a render error changed node1's NodeConfig: before %+v, after %+v", before, after)
		}
		k.kubectl("", "label", "node", n1.Name, "--overwrite", fmt.Sprintf("flock.fritzlab.net/asn=%d", lab.NodeASN))
		testutil.EventuallyWithin(t, 30*time.Second, "node1's error to clear", func() (bool, string) {
			var st struct {
				ConfigError string `json:"configError"`
			}
			flockctlJSON(t, n1.Agent, &st, "status")
			return !strings.Contains(st.ConfigError, "NodeConfigTemplate"), st.ConfigError
		})
		torPaths(t, tr, n1.Summary6, 1)
	})

	t.Run("node missing the AS label", func(t *testing.T) {
		k := nctAPI{t: t, c: c} // this t: Fatal from the subtest's goroutine
		a, err := lab.NewAgent(n3.NS, filepath.Join(l.Opts.Dir, n3.Name), "# Kubernetes mode: unused\n")
		if err != nil {
			t.Fatal(err)
		}
		a.Kubeconfig, a.NodeName = kubeconfig, n3.Name
		// /readyz on the node's own loopback.
		a.Args = []string{"--metrics-address=127.0.0.1:9476", "--leak-gc-grace=5s", "--nodeconfig-wait=5m"}
		n3.Agent = a // the lab stops it
		err = a.Start(filepath.Join(binDir, "flock-agent"), 2*time.Second)
		if err == nil {
			t.Fatal("node3's agent is ready without a NodeConfig")
		}
		if strings.Contains(err.Error(), "exited") {
			t.Fatal(err)
		}
		want := "NodeConfigTemplate lab-rack: spec.asnFrom.label: node node3 has no label flock.fritzlab.net/asn"
		testutil.EventuallyWithin(t, 30*time.Second, "node3's /readyz to name the missing label", func() (bool, string) {
			body, err := readyzIn(n3.NS)
			return err == nil && strings.Contains(body, "503") && strings.Contains(body, want), fmt.Sprint(body, err)
		})
		var st struct {
			Ready    bool     `json:"ready"`
			Problems []string `json:"problems"`
		}
		flockctlJSON(t, a, &st, "status")
		if st.Ready || !strings.Contains(strings.Join(st.Problems, "; "), want) {
			t.Errorf("flockctl status %+v, want not ready naming %q", st, want)
		}
		if nc := k.nodeConfig(n3.Name); nc != nil {
			t.Errorf("node3 got a NodeConfig: %+v", nc)
		}
		if !strings.Contains(a.Log(), want) {
			t.Errorf("node3's log does not name the label:\n%s", tail(a.Log(), 20))
		}
		testutil.EventuallyWithin(t, 30*time.Second, "a Warning Event on Node node3", func() (bool, string) {
			out, _ := c.Kubectl(ctx, "get", "events", "-A", "--field-selector", "involvedObject.kind=Node,involvedObject.name=node3,type=Warning",
				"-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
			return strings.Contains(out, "NodeConfigTemplateError: "+want), out
		})

		// Labelled: rendered, and the agent comes up.
		k.kubectl("", "label", "node", n3.Name, fmt.Sprintf("flock.fritzlab.net/asn=%d", lab.NodeASN))
		if err := a.WaitReady(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		if nc := k.nodeConfig(n3.Name); nc == nil || nc.Metadata.Labels["flock.fritzlab.net/template"] != "lab-rack" {
			t.Errorf("node3's NodeConfig %+v, want rendered from lab-rack", nc)
		}
		birdEstablished(t, l, n3.Name)
		torPaths(t, tr, n3.Summary6, 1)
		testutil.EventuallyWithin(t, 30*time.Second, "kubectl get nct to count 3 nodes", func() (bool, string) {
			out, _ := c.Kubectl(ctx, "get", "nct", "lab-rack", "-o", "jsonpath={.status.nodes}")
			return strings.TrimSpace(out) == "3", out
		})
	})

	// Last: while it is applied, the agents' (unbound) tokens may write
	// no NodeConfig.
	t.Run("admission policy confines the agents", func(t *testing.T) {
		testNodeConfigPolicy(t, k, kubeconfig, deploy("nodeconfig-policy/policy.yaml"))
	})
}

// testNodeConfigPolicy: with deploy/nodeconfig-policy applied, the flock
// ServiceAccount writes only its own node's rendered NodeConfig: a token
// bound to a pod on node1 may update node1's, not node2's, not one made
// hand-made, and delete none but its own; a token bound to no pod (no
// node) may write none.
func testNodeConfigPolicy(t *testing.T, k nctAPI, unbound, policy string) {
	k.t = t
	ctx := context.Background()
	k.kubectl("", "apply", "-f", policy)
	t.Cleanup(func() { _, _ = k.c.Kubectl(ctx, "delete", "-f", policy, "--ignore-not-found") })
	// The agent's pod on node1; a token bound to it carries the node.
	k.kubectl(`apiVersion: v1
kind: Pod
metadata: {name: flock-node1, namespace: flock-system}
spec:
  nodeName: node1
  serviceAccountName: flock
  containers: [{name: agent, image: docker.io/local/busybox:1.35}]
`, "apply", "-f", "-")
	t.Cleanup(func() {
		_, _ = k.c.Kubectl(ctx, "-n", "flock-system", "delete", "pod", "flock-node1", "--force", "--grace-period=0", "--ignore-not-found")
	})
	token := strings.TrimSpace(k.kubectl("", "-n", "flock-system", "create", "token", "flock", "--duration=1h",
		"--bound-object-kind=Pod", "--bound-object-name=flock-node1"))
	node1 := filepath.Join(t.TempDir(), "node1.kubeconfig")
	if err := k.c.WriteTokenKubeconfig(node1, token); err != nil {
		t.Fatal(err)
	}
	// replace writes a NodeConfig back as read (an update; RBAC allows it)
	// as the kubeconfig's user, after edit.
	replace := func(kubeconfig, name string, edit func(map[string]any)) error {
		var obj map[string]any
		if err := json.Unmarshal([]byte(k.kubectl("", "get", "nodeconfig", name, "-o", "json")), &obj); err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(obj)
		}
		b, _ := json.Marshal(obj)
		_, err := k.c.KubectlStdin(ctx, string(b), "--kubeconfig", kubeconfig, "replace", "-f", "-")
		return err
	}
	denied := func(err error, why string) bool {
		return err != nil && strings.Contains(err.Error(), "flock-agent-nodeconfigs") && strings.Contains(err.Error(), why)
	}
	// The policy takes a moment to be enforced.
	testutil.EventuallyWithin(t, 30*time.Second, "a token without a node to be denied", func() (bool, string) {
		err := replace(unbound, "node1", nil)
		return denied(err, "names no node"), fmt.Sprint(err)
	})
	if err := replace(node1, "node1", nil); err != nil {
		t.Errorf("node1's agent may not update node1's rendered NodeConfig: %v", err)
	}
	if err := replace(node1, "node2", nil); !denied(err, "node2 is not node node1") {
		t.Errorf("node1's agent updating node2's NodeConfig: %v, want denied", err)
	}
	unlabel := func(obj map[string]any) {
		delete(obj["metadata"].(map[string]any)["labels"].(map[string]any), "flock.fritzlab.net/template")
	}
	if err := replace(node1, "node1", unlabel); !denied(err, "node1 is hand-made") {
		t.Errorf("node1's agent making its NodeConfig hand-made: %v, want denied", err)
	}
	if _, err := k.c.Kubectl(ctx, "--kubeconfig", node1, "delete", "nodeconfig", "node2", "--wait=false"); !denied(err, "is not node node1") {
		t.Errorf("node1's agent deleting node2's NodeConfig: %v, want denied", err)
	}
	if nc := k.nodeConfig("node2"); nc == nil || nc.Metadata.Labels["flock.fritzlab.net/template"] != "lab-rack" {
		t.Errorf("node2's NodeConfig after the denied writes: %+v", nc)
	}
}

// nctAPI is kubectl against the test's API server.
type nctAPI struct {
	t *testing.T
	c *k8slab.Cluster
}

// kubectl: see kubectlRetry.
func (k nctAPI) kubectl(stdin string, args ...string) string {
	k.t.Helper()
	return kubectlRetry(k.t, k.c, stdin, args...)
}

// nctNodeConfig is what the test reads of a NodeConfig.
type nctNodeConfig struct {
	Metadata struct {
		Generation      int64             `json:"generation"`
		Labels          map[string]string `json:"labels"`
		OwnerReferences []struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		ASN      uint32 `json:"asn"`
		RouterID string `json:"routerID"`
		Pools    []struct {
			CIDR string `json:"cidr"`
		} `json:"pools"`
		BGP struct {
			Peers []struct {
				Address      string `json:"address"`
				LocalAddress string `json:"localAddress"`
			} `json:"peers"`
		} `json:"bgp"`
	} `json:"spec"`
}

// nodeConfig reads a NodeConfig (nil: there is none).
func (k nctAPI) nodeConfig(name string) *nctNodeConfig {
	k.t.Helper()
	out, err := k.c.Kubectl(context.Background(), "get", "nodeconfig", name, "--ignore-not-found", "-o", "json")
	if err != nil {
		k.t.Fatalf("kubectl get nodeconfig %s: %v: %s", name, err, out)
	}
	if strings.TrimSpace(out) == "" {
		return nil
	}
	var nc nctNodeConfig
	if err := json.Unmarshal([]byte(out), &nc); err != nil {
		k.t.Fatalf("NodeConfig %s: %v\n%s", name, err, out)
	}
	return &nc
}

// restartAgent stops and starts a node's agent (pools take effect at a
// restart) and waits for its session.
func restartAgent(t *testing.T, l *lab.BGPLab, n *lab.LabNode) {
	t.Helper()
	if err := n.Agent.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := l.StartAgent(n); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, n)
}

// birdEstablished waits until the ToR's session with the node is up.
func birdEstablished(t *testing.T, l *lab.BGPLab, node string) {
	t.Helper()
	testutil.EventuallyWithin(t, 30*time.Second, "the ToR's session with "+node+" Established", func() (bool, string) {
		out, err := l.Bird.Cmd("show protocols " + node)
		return err == nil && strings.Contains(out, "Established"), out
	})
}

// readyzIn fetches /readyz from the agent's metrics listener on the
// loopback of ns; an error while nothing listens yet.
func readyzIn(ns *lab.NS) (string, error) {
	var conn net.Conn
	if err := ns.InNS(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", "127.0.0.1:9476", 2*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET /readyz HTTP/1.0\r\nHost: x\r\n\r\n")
	b, err := io.ReadAll(conn)
	return string(b), err
}
