package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// newLab builds a BGP lab whose namespaces and processes go away with the
// test.
func newLab(t *testing.T, nodes int, render func(n *lab.LabNode) string) *lab.BGPLab {
	t.Helper()
	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: randName("fl") + "-", Dir: t.TempDir(), BinDir: binDir, Nodes: nodes, NodeConfig: render})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range l.Nodes {
				if n.Agent != nil {
					t.Logf("%s agent log:\n%s", n.Name, tail(n.Agent.Log(), 60))
				}
			}
			if l.Bird != nil {
				out, _ := l.Bird.Cmd("show protocols all")
				t.Logf("bird:\n%s\n%s", out, l.Bird.Log())
			}
			if l.FRR != nil {
				out, _ := l.FRR.Vtysh("show bgp summary")
				t.Logf("frr:\n%s\n%s", out, l.FRR.Log())
			}
		}
		for _, n := range l.Nodes {
			if n.Agent != nil && strings.Contains(n.Agent.Log(), "DATA RACE") {
				t.Errorf("%s: the race detector caught a data race in flock-agent", n.Name)
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("lab teardown: %v", err)
		}
	})
	return l
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

type neighbor struct {
	Peer  string `json:"peer"`
	State string `json:"state"`
	// Since: the session's last state change, stamped by the agent.
	Since    time.Time `json:"since"`
	Uptime   string    `json:"uptime"` // "1h2m3s"
	BFD      string    `json:"bfd"`
	GR       string    `json:"gracefulRestart"`
	Warnings []string  `json:"warnings"`
	// BFDDetail: Since moves on every transition of the node's session.
	BFDDetail *struct {
		State        string    `json:"state"`
		Since        time.Time `json:"since"`
		Diag         string    `json:"diag"`
		Failures     int       `json:"failures"`
		PlannedDowns int       `json:"plannedDowns"`
	} `json:"bfdDetail"`
	Families []struct {
		Family     string `json:"family"`
		Advertised uint64 `json:"advertised"`
	} `json:"families"`
}

func neighbors(t *testing.T, a *lab.Agent) []neighbor {
	t.Helper()
	var out []neighbor
	if err := json.Unmarshal([]byte(flockctl(t, a, "-o", "json", "bgp", "neighbors")), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// birdRoute returns birdc's view of one prefix ("" when BIRD has none).
func birdRoute(t *testing.T, l *lab.BGPLab, p netip.Prefix) string {
	t.Helper()
	out, err := l.Bird.Cmd("show route for " + p.String() + " all")
	if strings.Contains(out, "Network not found") {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// birdHas waits until BIRD's table holds (or, with want false, no longer
// holds) p, learnt from the given number of nodes (0: any).
func birdHas(t *testing.T, l *lab.BGPLab, p netip.Prefix, want bool, paths int) {
	t.Helper()
	testutil.EventuallyWithin(t, 20*time.Second, fmt.Sprintf("BIRD to have %s=%v (%d paths)", p, want, paths), func() (bool, string) {
		out := birdRoute(t, l, p)
		if !want {
			return out == "", out
		}
		if out == "" {
			return false, "not found"
		}
		if paths > 0 && strings.Count(out, "BGP.as_path") != paths {
			return false, out
		}
		return true, out
	})
}

func waitEstablished(t *testing.T, n *lab.LabNode) {
	t.Helper()
	testutil.EventuallyWithin(t, 30*time.Second, n.Name+" sessions Established", func() (bool, string) {
		ns := neighbors(t, n.Agent)
		if len(ns) == 0 {
			return false, "no neighbors"
		}
		for _, x := range ns {
			if x.State != "Established" {
				return false, fmt.Sprintf("%+v", ns)
			}
		}
		return true, ""
	})
}

type torKind struct {
	name  string
	start func(l *lab.BGPLab) error
	view  func(l *lab.BGPLab) tor
}

var tors = []torKind{
	{"bird", func(l *lab.BGPLab) error { return l.StartBird(lab.BirdOptions{}) }, func(l *lab.BGPLab) tor { return birdTor{l} }},
	{"frr", func(l *lab.BGPLab) error { return l.StartFRR(nil) }, func(l *lab.BGPLab) tor { return frrTor{l} }},
}

// addPod creates a pod on a lab node through libcni; it is deleted (CNI
// DEL) when the test ends unless the test deleted it.
func addPod(t *testing.T, n *lab.LabNode, name string, extra ...string) (lab.Pod, []netip.Addr) {
	t.Helper()
	p := lab.Pod{ContainerID: name, NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", name, extra...)}
	ctx := ctxT(t)
	res, err := n.CNI.Add(ctx, p)
	if err != nil {
		t.Fatalf("ADD %s on %s: %v", name, n.Name, err)
	}
	t.Cleanup(func() { _ = n.CNI.Del(ctx, p) })
	return p, podIPs(t, res)
}

func host(ip netip.Addr) netip.Prefix { return netip.PrefixFrom(ip, ip.BitLen()) }

// torPaths waits until the ToR holds want paths for p.
func torPaths(t *testing.T, tr tor, p netip.Prefix, want int) {
	t.Helper()
	testutil.EventuallyWithin(t, 20*time.Second, fmt.Sprintf("the ToR to hold %d path(s) for %s", want, p), func() (bool, string) {
		got := tr.paths(t, p)
		return got == want, fmt.Sprintf("%d paths, next hops %v", got, tr.nexthops(t, p))
	})
}

func ping(t *testing.T, from *lab.NS, to netip.Addr) {
	t.Helper()
	if err := lab.Ping(from, to, 5*time.Second); err != nil {
		t.Error(err)
	}
}

// TestBGPToR runs the core scenarios against a BIRD and an FRR ToR: two
// nodes, sessions Established, summaries and out-of-summary host routes at
// the ToR, pings ToR → pod and pod → pod across nodes in both families,
// anycast ECMP across nodes and one route for two replicas on one node.
func TestBGPToR(t *testing.T) {
	for _, k := range tors {
		t.Run(k.name, func(t *testing.T) {
			l := newLab(t, 2, nil)
			if err := k.start(l); err != nil {
				t.Fatal(err)
			}
			tr := k.view(l)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("ToR state:\n%s", tr.dump(t))
				}
			})
			n1, n2 := l.Nodes[0], l.Nodes[1]
			for _, n := range l.Nodes {
				waitEstablished(t, n)
				testutil.EventuallyWithin(t, 20*time.Second, "the ToR to see "+n.Name+" Established", func() (bool, string) { return tr.sessionUp(t, n), "" })
			}

			t.Run("summaries and pod routes", func(t *testing.T) {
				for _, n := range l.Nodes {
					torPaths(t, tr, n.Summary6, 1)
					torPaths(t, tr, n.Summary4, 1)
				}
				a, ipsA := addPod(t, n1, "sum-a")
				b, ipsB := addPod(t, n2, "sum-b")
				a2, ipsA2 := addPod(t, n1, "shared-a", "flock.fritzlab.net/cidr6", "2001:db8:100::100/120", "flock.fritzlab.net/cidr4", "198.51.100.0/29")
				b2, ipsB2 := addPod(t, n2, "shared-b", "flock.fritzlab.net/cidr6", "2001:db8:100::200/120", "flock.fritzlab.net/cidr4", "198.51.100.8/29")
				for _, ip := range append(ipsA2, ipsB2...) {
					torPaths(t, tr, host(ip), 1)
				}
				// Inside a summary: covered by the aggregate, no host route.
				for _, ip := range append(ipsA, ipsB...) {
					if got := tr.paths(t, host(ip)); got != 0 {
						t.Errorf("ToR holds a host route for %s inside a summary (%d paths)", ip, got)
					}
				}
				for _, ip := range append(append(append(ipsA, ipsB...), ipsA2...), ipsB2...) {
					ping(t, l.Tor, ip)
				}
				for _, pair := range []struct {
					from lab.Pod
					to   []netip.Addr
				}{{a, ipsB}, {b, ipsA}, {a2, ipsB2}, {b2, ipsA2}} {
					for _, ip := range pair.to {
						ping(t, pair.from.NS, ip)
					}
				}
				// Deleting the shared-pool pods withdraws their host routes.
				for _, p := range []struct {
					n   *lab.LabNode
					pod lab.Pod
				}{{n1, a2}, {n2, b2}} {
					if err := p.n.CNI.Del(ctxT(t), p.pod); err != nil {
						t.Fatal(err)
					}
				}
				for _, ip := range append(ipsA2, ipsB2...) {
					torPaths(t, tr, host(ip), 0)
				}
			})

			t.Run("anycast ECMP across nodes", func(t *testing.T) {
				any6, any4 := netip.MustParsePrefix("2001:db8:a::1/128"), netip.MustParsePrefix("203.0.113.1/32")
				ann := []string{"flock.fritzlab.net/anycast", "2001:db8:a::1,203.0.113.1"}
				p1, _ := addPod(t, n1, "any-1", ann...)
				addPod(t, n2, "any-2", ann...)
				for _, p := range []netip.Prefix{any6, any4} {
					torPaths(t, tr, p, 2)
					testutil.EventuallyWithin(t, 10*time.Second, "an ECMP kernel route at the ToR for "+p.String(), func() (bool, string) {
						n := torKernelNexthops(t, l, p)
						return n == 2, fmt.Sprintf("%d next hops", n)
					})
				}
				ping(t, l.Tor, any6.Addr())
				ping(t, l.Tor, any4.Addr())
				if err := n1.CNI.Del(ctxT(t), p1); err != nil {
					t.Fatal(err)
				}
				for _, p := range []netip.Prefix{any6, any4} {
					torPaths(t, tr, p, 1)
					if nh := tr.nexthops(t, p); len(nh) != 1 || !strings.Contains(strings.Join(nh, " "), n2.V6.String()) {
						t.Errorf("after node1's replica left, %s should be via node2 (%s) only: %v", p, n2.V6, nh)
					}
				}
				ping(t, l.Tor, any6.Addr())
				ping(t, l.Tor, any4.Addr())
			})

			// The agent's metrics do not depend on the ToR: checked once.
			metrics := func(t *testing.T) {
				if h := httpGet(t, n1, "/readyz"); !strings.Contains(h, "200 OK") {
					t.Errorf("/readyz: %s", h)
				}
				if h := httpGet(t, n1, "/healthz"); !strings.Contains(h, "200 OK") {
					t.Errorf("/healthz: %s", h)
				}
				m := scrape(t, n1)
				for _, want := range []string{
					`flock_cni_requests_total{op="ADD",result="success"}`,
					`flock_cni_requests_total{op="DEL",result="success"}`,
					`flock_cni_request_duration_seconds_bucket{op="ADD",result="success"`,
					`flock_ipam_addresses{pool="fd00:10:1::/64",state="used"}`,
					`flock_bgp_advertised_routes{kind="summary"} 2`,
					fmt.Sprintf(`flock_bgp_session_established{peer="%s"} 1`, n1.TorV6),
					fmt.Sprintf(`flock_bgp_rfc5549_mismatch{peer="%s"} 0`, n1.TorV6),
					`flock_reconcile_duration_seconds_count{full="false",target="bgp"}`,
					`flock_reconcile_duration_seconds_count{full="true",target="kernel"}`,
					`flock_reconcile_errors_total{target="kernel"} 0`,
					`flock_allocations_reaped_total{reason="netns-gone"} 0`,
					`bgp_peer_uptime`, // GoBGP's own collector
				} {
					if !strings.Contains(m, want) {
						t.Errorf("/metrics lacks %s", want)
					}
				}
				if t.Failed() {
					t.Logf("metrics:\n%s", grepLines(m, "flock_"))
				}
			}
			if k.name == "bird" {
				t.Run("metrics and health", metrics)
			}

			t.Run("two replicas on one node", func(t *testing.T) {
				p := netip.MustParsePrefix("2001:db8:a::2/128")
				addPod(t, n1, "rep-1", "flock.fritzlab.net/anycast", p.Addr().String())
				addPod(t, n1, "rep-2", "flock.fritzlab.net/anycast", p.Addr().String())
				torPaths(t, tr, p, 1)
				var routes []struct {
					Prefix   string   `json:"prefix"`
					Nexthops []string `json:"nexthops"`
				}
				if err := json.Unmarshal([]byte(flockctl(t, n1.Agent, "-o", "json", "routes")), &routes); err != nil {
					t.Fatal(err)
				}
				found := false
				for _, r := range routes {
					if r.Prefix == p.String() {
						found = true
						if len(r.Nexthops) != 2 {
							t.Errorf("node1's host route for %s has next hops %v, want one per replica", p, r.Nexthops)
						}
					}
				}
				if !found {
					t.Errorf("node1 has no host route for %s: %+v", p, routes)
				}
				ping(t, l.Tor, p.Addr())
			})
		})
	}
}
