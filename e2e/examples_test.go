package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// The shipped examples peer as shipped: deploy/examples (NodeConfig,
// AddressPools) applied unchanged to a real API server, an agent in
// Kubernetes mode as node-a with the shipped RBAC, and the ToR running
// deploy/tor's BIRD and FRR configs unchanged, on the addresses the files
// name. Asserted: the session comes up with TCP-MD5, GTSM and BFD as
// configured on both sides, the ToR accepts the node's summaries and the
// pod, anycast and addresses IPs the example pools hand out, and the ToR
// reaches each of them. GTSM is enforced, not merely configured: with
// the ToR's side taken out the session stays down, put back it returns.
func TestShippedExamples(t *testing.T) {
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := apiOnlyLab(t)
	kubectl := func(stdin string, args ...string) string {
		t.Helper()
		return kubectlRetry(t, c, stdin, args...)
	}
	deploy := func(p string) string { return filepath.Join(root, "deploy", p) }
	kubectl("", "apply", "-f", deploy("namespace.yaml"))
	kubectl("", "apply", "-f", deploy("crd"))
	kubectl("", "apply", "-f", deploy("rbac.yaml"))
	kubectl(`apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: prod}
---
apiVersion: v1
kind: Namespace
metadata: {name: edge, labels: {tier: edge}}
`, "apply", "-f", "-")
	// No controller-manager: the ServiceAccounts pods need, by hand.
	for _, ns := range []string{"default", "prod", "kube-system", "edge"} {
		kubectl("", "-n", ns, "create", "serviceaccount", "default")
	}
	// The examples, unchanged.
	kubectl("", "apply", "-f", deploy("examples/addresspools.yaml"))
	kubectl("", "apply", "-f", deploy("examples/nodeconfig.yaml"))
	// The node's side of the password the shipped ToR configs carry.
	birdConf := readFile(t, deploy("tor/bird.conf"))
	frrConf := readFile(t, deploy("tor/frr.conf"))
	pw := regexp.MustCompile(`(?m)^\s*password "([^"]+)";`).FindStringSubmatch(birdConf)
	if pw == nil || !strings.Contains(frrConf, "neighbor NODES password "+pw[1]+"\n") {
		t.Fatalf("deploy/tor: the BIRD and FRR configs do not carry the same password")
	}
	kubectl("", "-n", "flock-system", "create", "secret", "generic", "flock-bgp-passwords", "--from-literal=tor="+pw[1])
	token := strings.TrimSpace(kubectl("", "-n", "flock-system", "create", "token", "flock", "--duration=1h"))
	kubeconfig := filepath.Join(t.TempDir(), "flock.kubeconfig")
	if err := c.WriteTokenKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}

	// The pods, one per kind of address the example pools give.
	pods := []struct{ ns, name, annotations string }{
		{"default", "plain", ""},
		{"prod", "api", `{flock.fritzlab.net/cidr6: "2001:db8:100:8000::/120", flock.fritzlab.net/cidr4: "198.51.100.128/26", flock.fritzlab.net/ip-algo: random}`},
		{"kube-system", "dns", `{flock.fritzlab.net/anycast: "2001:db8:100:8053::53,203.0.113.1"}`},
		{"edge", "lb", `{flock.fritzlab.net/addresses: "2001:db8:100:8200::10,203.0.113.70"}`},
	}
	var docs []string
	for _, p := range pods {
		a := p.annotations
		if a == "" {
			a = "{}"
		}
		docs = append(docs, fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: %s, annotations: %s}\nspec:\n  nodeName: node-a\n  containers: [{name: c, image: docker.io/local/busybox:1.35}]\n", p.name, p.ns, a))
	}
	kubectl(strings.Join(docs, "---\n"), "apply", "-f", "-")
	// No kubelet here: the pods are made Ready by hand (anycast and
	// addresses IPs are advertised only while their pod is Ready).
	for _, p := range pods {
		kubectl("", "-n", p.ns, "patch", "pod", p.name, "--subresource=status", "--type=merge",
			"-p", `{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)
	}

	torName := map[string]string{}
	for _, kind := range []string{"bird", "frr"} {
		t.Run(kind, func(t *testing.T) {
			torNS := newNS(t, "flkxt-")
			nodeNS := newNS(t, "flkxn-")
			// The first server port of the shipped configs; IPv4 on it only
			// for the pings' way back (the session is IPv6).
			wireLink(t, nodeNS, "uplink", torNS, "to-node-a",
				[]netip.Prefix{netip.MustParsePrefix("2001:db8:0:1::1/64"), netip.MustParsePrefix("192.0.2.9/30")},
				[]netip.Prefix{netip.MustParsePrefix("2001:db8:0:1::2/64"), netip.MustParsePrefix("192.0.2.10/30")})
			forwarding(t, torNS)
			for _, r := range []struct{ dst, via string }{{"::/0", "2001:db8:0:1::2"}, {"0.0.0.0/0", "192.0.2.10"}} {
				if err := nodeNS.RouteAdd(netip.MustParsePrefix(r.dst), netip.MustParseAddr(r.via)); err != nil {
					t.Fatal(err)
				}
			}
			l := &lab.BGPLab{Tor: torNS}
			var tr tor
			var gtsm func(on bool)
			var gtsmExplicit func()
			switch kind {
			case "bird":
				dir := t.TempDir()
				b, err := lab.StartBird(torNS, dir, birdConf)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Bird.Stop() })
				l.Bird, tr = b, birdTor{l}
				// BIRD restarted with the config: a reconfigure leaves its
				// listening socket as it was.
				gtsm = func(on bool) {
					conf := birdConf
					if !on {
						conf = strings.Replace(conf, "ttl security on;", "", 1)
					}
					l.Bird.Stop()
					b, err := lab.StartBird(torNS, dir, conf)
					if err != nil {
						t.Fatal(err)
					}
					l.Bird = b
				}
			case "frr":
				f := startShippedFRR(t, torNS, frrConf)
				t.Cleanup(func() { l.FRR.Stop() })
				l.FRR, tr = f, frrTor{l}
				gtsmExplicit = func() {
					conf := strings.Replace(frrConf, " ! neighbor 2001:db8:0:1::1 peer-group NODES\n", " neighbor 2001:db8:0:1::1 peer-group NODES\n", 1)
					conf = strings.Replace(conf, " ! neighbor 2001:db8:0:1::1 update-source 2001:db8:0:1::2\n", " neighbor 2001:db8:0:1::1 update-source 2001:db8:0:1::2\n", 1)
					if conf == frrConf {
						t.Fatal("deploy/tor/frr.conf: no commented explicit neighbour lines")
					}
					l.FRR.Stop()
					l.FRR = startShippedFRR(t, torNS, conf)
				}
			}
			torName[kind] = torNS.Name

			if err := apiProxy(t, nodeNS); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			a, err := lab.NewAgent(nodeNS, filepath.Join(dir, "agent"), "")
			if err != nil {
				t.Fatal(err)
			}
			a.Kubeconfig, a.NodeName = kubeconfig, "node-a"
			a.Args = []string{"--metrics-address=", "--namespace=flock-system"}
			if err := a.Start(filepath.Join(binDir, "flock-agent"), 60*time.Second); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("agent log:\n%s\nToR:\n%s", tail(a.Log(), 60), tr.dump(t))
				}
				if err := a.Stop(); err != nil {
					t.Errorf("stop agent: %v", err)
				}
			})
			cni, err := lab.NewCNI(binDir, filepath.Join(dir, "cni-cache"), a.CNISocket, "1.1.0")
			if err != nil {
				t.Fatal(err)
			}

			established := func(within time.Duration) {
				t.Helper()
				testutil.EventuallyWithin(t, within, "the session to the ToR Established, BFD Up", func() (bool, string) {
					ns := neighbors(t, a)
					if len(ns) != 1 {
						return false, fmt.Sprintf("%+v", ns)
					}
					n := ns[0]
					return n.State == "Established" && n.BFD == "up", fmt.Sprintf("%+v BFD %+v", n, n.BFDDetail)
				})
			}
			// mustStayDown: with GTSM on one side only the session may still
			// reach Established for a moment (the side that accepted sets
			// its minimum TTL on the new socket only after the handshake, so
			// the first OPEN can slip in), but the next packets are dropped
			// and the hold timer (9 s) ends it: it never stays up longer.
			mustStayDown := func(what string) {
				t.Helper()
				testutil.EventuallyWithin(t, 30*time.Second, "the session down with "+what, func() (bool, string) {
					ns := neighbors(t, a)
					return len(ns) == 1 && ns[0].State != "Established", fmt.Sprintf("%+v", ns)
				})
				const window, longest = 40 * time.Second, 15 * time.Second
				var upSince time.Time
				ups := 0
				for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
					ns := neighbors(t, a)
					if len(ns) != 1 || ns[0].State != "Established" {
						upSince = time.Time{}
						continue
					}
					if upSince.IsZero() {
						upSince = time.Now()
						ups++
					}
					if time.Since(upSince) > longest {
						t.Fatalf("the session stayed up %s with %s: %+v", longest, what, ns[0])
					}
				}
				t.Logf("%s: the session reached Established %d times in %s, never for %s", what, ups, window, longest)
			}
			established(60 * time.Second)

			var want []netip.Addr
			for _, p := range pods {
				pod := lab.Pod{ContainerID: kind + "-" + p.name, NS: newNS(t, "flkxp-"), Args: lab.PodArgs(p.ns, p.name)}
				res, err := cni.Add(ctx, pod)
				if err != nil {
					t.Fatalf("ADD %s/%s: %v", p.ns, p.name, err)
				}
				t.Cleanup(func() { _ = cni.Del(context.Background(), pod) })
				ips := podIPs(t, res)
				for _, ip := range ips {
					// The pod's default addresses: from the node's summary
					// unless the pod names a range.
					switch {
					case p.name == "plain" && !netip.MustParsePrefix("2001:db8:100:1::/64").Contains(ip) && !netip.MustParsePrefix("198.51.100.0/28").Contains(ip):
						t.Errorf("%s/%s got %s outside the node's summaries", p.ns, p.name, ip)
					case p.name == "api" && !netip.MustParsePrefix("2001:db8:100:8000::/120").Contains(ip) && !netip.MustParsePrefix("198.51.100.128/26").Contains(ip):
						t.Errorf("%s/%s got %s outside its annotation's ranges", p.ns, p.name, ip)
					}
				}
				if p.name == "api" {
					for _, ip := range ips {
						torPaths(t, tr, host(ip), 1) // claimed pod addresses: a host route each
					}
				}
				want = append(want, ips...)
			}
			for _, s := range []string{"2001:db8:100:1::/64", "198.51.100.0/28"} {
				torPaths(t, tr, netip.MustParsePrefix(s), 1)
			}
			extra := []netip.Addr{mustAddr("2001:db8:100:8053::53"), mustAddr("203.0.113.1"), mustAddr("2001:db8:100:8200::10"), mustAddr("203.0.113.70")}
			for _, ip := range extra {
				torPaths(t, tr, host(ip), 1)
			}
			want = append(want, extra...)
			for _, ip := range want {
				testutil.EventuallyWithin(t, 20*time.Second, "the ToR to reach "+ip.String(), func() (bool, string) {
					err := lab.Ping(torNS, ip, time.Second)
					return err == nil, fmt.Sprint(err)
				})
			}

			// And the other way: GTSM on the ToR's side only (the node's
			// NodeConfig without ttlSecurityMin sends with TTL 1).
			nodeConfig := readFile(t, deploy("examples/nodeconfig.yaml"))
			noGTSM := regexp.MustCompile(`(?m)^\s*ttlSecurityMin: 255.*\n`).ReplaceAllString(nodeConfig, "")
			if noGTSM == nodeConfig {
				t.Fatal("deploy/examples/nodeconfig.yaml: no ttlSecurityMin: 255 line")
			}
			if kind == "frr" {
				// FRR 8.4 does not enforce ttl-security on neighbours accepted
				// through `bgp listen range` (observed: a node without GTSM
				// stays Established); frr.conf says so and shows explicit
				// neighbours, which it does enforce it on: checked with the
				// shipped explicit-neighbour lines switched on.
				gtsmExplicit()
				established(60 * time.Second)
			}
			kubectl(noGTSM, "apply", "-f", "-")
			mustStayDown("GTSM on the ToR's side only")
			kubectl("", "apply", "-f", deploy("examples/nodeconfig.yaml"))
			established(60 * time.Second)
			// GTSM only on the node's side: the ToR sends with TTL 1 (eBGP
			// default) and the node drops it. Last, as no way back is needed:
			// in one run of three the agent's session then sat in
			// OpenConfirm past the hold time after BIRD got GTSM back (not
			// understood yet; the closing note of this change says so). Not
			// with FRR: observed, FRR 8.4 without ttl-security keeps a
			// session with a node that requires TTL 255 (what it sends on
			// connections accepted on its listen range passes the node's
			// check), so only the direction above tells anything there.
			if kind == "bird" {
				gtsm(false)
				mustStayDown("GTSM on the node's side only")
			}
		})
	}
	if t.Failed() {
		return
	}
	// The test left no namespace behind.
	for kind, name := range torName {
		if _, err := os.Stat(filepath.Join("/run/netns", name)); err == nil {
			t.Errorf("%s ToR namespace %s left behind", kind, name)
		}
	}
}

// startShippedFRR runs zebra, bfdd and bgpd in ns with empty configs and
// then loads conf, an integrated frr.conf, through vtysh as an operator
// does (`vtysh -f`), unchanged.
func startShippedFRR(t *testing.T, ns *lab.NS, conf string) *lab.FRR {
	t.Helper()
	ps := randName("flkx")
	f, err := lab.StartFRR(ns, "", ps, "hostname tor\n", "hostname tor\n", "hostname tor\n")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(f.Dir, "frr.conf")
	if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("vtysh", "-N", ps, "-f", p).CombinedOutput()
	if err != nil {
		t.Fatalf("vtysh -f %s: %v\n%s", p, err, out)
	}
	return f
}
