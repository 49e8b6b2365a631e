package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// unnumberedLab is one node peering by interface only (its uplink) with a
// BIRD or FRR ToR that peers with the node's link-local address.
func unnumberedLab(t *testing.T, kind string) (*lab.BGPLab, *lab.LabNode, tor) {
	t.Helper()
	l := newLab(t, 1, func(n *lab.LabNode) string {
		return lab.NodeConfigYAML(n, fmt.Sprintf(`- interface: %s
  asn: %d
  timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
`, n.Uplink, lab.TorASN))
	})
	n := l.Nodes[0]
	ll, err := n.NS.LinkLocal(n.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	var tr tor
	if kind == "bird" {
		err, tr = l.StartBird(lab.BirdOptions{Unnumbered: map[int]netip.Addr{1: ll}}), birdTor{l}
	} else {
		err, tr = l.StartFRR(map[int]string{1: ll.String()}), frrTor{l}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ToR state:\n%s", tr.dump(t))
		}
	})
	return l, n, tr
}

// TestBGPUnnumbered: a link-local-only session (the node names only its
// uplink interface) carries both families, against BIRD and FRR.
func TestBGPUnnumbered(t *testing.T) {
	for _, k := range []string{"bird", "frr"} {
		t.Run(k, func(t *testing.T) {
			l, n, tr := unnumberedLab(t, k)
			waitEstablished(t, n)
			nb := neighbors(t, n.Agent)
			if len(nb) != 1 || nb[0].Peer != "interface "+n.Uplink {
				t.Fatalf("neighbors: %+v", nb)
			}
			torPaths(t, tr, n.Summary6, 1)
			torPaths(t, tr, n.Summary4, 1)
			_, ips := addPod(t, n, "unnum", "flock.fritzlab.net/cidr6", "2001:db8:100::100/120", "flock.fritzlab.net/cidr4", "198.51.100.0/29")
			for _, ip := range ips {
				torPaths(t, tr, host(ip), 1)
				ping(t, l.Tor, ip)
			}
		})
	}
}

// TestBGPMD5GracefulRestartBFD: TCP-MD5, graceful restart and BFD come up
// against BIRD and BFD stays up. Then the agent is SIGKILLed and restarted:
// thanks to graceful restart the ToR never withdraws the node's routes.
func TestBGPMD5GracefulRestartBFD(t *testing.T) {
	const password = "s3cret-md5"
	pwFile := filepath.Join(t.TempDir(), "bgp-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withAuth := func(bfd bool, grDisabled ...bool) func(n *lab.LabNode) string {
		return func(n *lab.LabNode) string {
			return lab.NodeConfigYAML(n, fmt.Sprintf(`- address: %s
  asn: %d
  localAddress: %s
  passwordFile: %s
  timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
  gracefulRestart: {restartTime: 120, disabled: %v}
  bfd: {enabled: %v, intervalMs: 300, multiplier: 3}
`, n.TorV6, lab.TorASN, n.V6, pwFile, len(grDisabled) > 0, bfd))
		}
	}
	t.Run("md5 gr bfd", func(t *testing.T) {
		l := newLab(t, 1, withAuth(true))
		if err := l.StartBird(lab.BirdOptions{MD5Password: password, GR: true, BFD: true}); err != nil {
			t.Fatal(err)
		}
		n := l.Nodes[0]
		waitEstablished(t, n)
		testutil.EventuallyWithin(t, 20*time.Second, "BFD up on both sides", func() (bool, string) {
			nb := neighbors(t, n.Agent)
			out, _ := l.Bird.Cmd("show bfd sessions")
			return len(nb) == 1 && nb[0].BFD == "up" && strings.Contains(out, "Up"), fmt.Sprintf("%+v\n%s", nb, out)
		})
		nb := neighbors(t, n.Agent)
		if !strings.HasPrefix(nb[0].GR, "negotiated") {
			t.Errorf("graceful restart not negotiated: %q", nb[0].GR)
		}
		since := birdSince(t, l, n.Name)
		time.Sleep(4 * time.Second) // several BFD detection times
		if nb := neighbors(t, n.Agent); nb[0].BFD != "up" || nb[0].State != "Established" {
			t.Errorf("after 4s: %+v", nb[0])
		}
		if s := birdSince(t, l, n.Name); !sameSince(s, since) {
			t.Errorf("session flapped: BIRD's since changed from %q to %q", since, s)
		}
		torPaths(t, birdTor{l}, n.Summary6, 1)
	})

	t.Run("graceful restart keeps routes", func(t *testing.T) {
		l := newLab(t, 1, withAuth(false))
		if err := l.StartBird(lab.BirdOptions{MD5Password: password, GR: true}); err != nil {
			t.Fatal(err)
		}
		n := l.Nodes[0]
		waitEstablished(t, n)
		_, ips := addPod(t, n, "gr-pod", "flock.fritzlab.net/cidr6", "2001:db8:100::100/120")
		watch := []netip.Prefix{n.Summary6, n.Summary4, host(ips[0])}
		tr := birdTor{l}
		for _, p := range watch {
			torPaths(t, tr, p, 1)
		}
		// Watch the ToR continuously while the agent dies and comes back.
		stop := make(chan struct{})
		lost := make(chan string, 1)
		go func() {
			for {
				select {
				case <-stop:
					close(lost)
					return
				default:
				}
				for _, p := range watch {
					if tr.paths(t, p) == 0 {
						lost <- p.String()
						return
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		if err := n.Agent.Kill(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := l.StartAgent(n); err != nil {
			t.Fatal(err)
		}
		waitEstablished(t, n)
		time.Sleep(2 * time.Second) // past the End-of-RIB
		close(stop)
		if p, ok := <-lost; ok {
			t.Fatalf("the ToR withdrew %s while the agent restarted", p)
		}
		for _, p := range watch {
			torPaths(t, tr, p, 1)
		}
		ping(t, l.Tor, ips[0])
	})

	// The control: the same kill without graceful restart does make the ToR
	// withdraw, so the test above can tell the difference.
	t.Run("without graceful restart the ToR withdraws", func(t *testing.T) {
		l := newLab(t, 1, withAuth(false, true))
		if err := l.StartBird(lab.BirdOptions{MD5Password: password, GR: true}); err != nil {
			t.Fatal(err)
		}
		n := l.Nodes[0]
		waitEstablished(t, n)
		if gr := neighbors(t, n.Agent)[0].GR; gr != "off" {
			t.Errorf("GR column %q, want off", gr)
		}
		tr := birdTor{l}
		torPaths(t, tr, n.Summary6, 1)
		if err := n.Agent.Kill(); err != nil {
			t.Fatal(err)
		}
		torPaths(t, tr, n.Summary6, 0)
	})
}

var birdSinceRe = regexp.MustCompile(`(?m)^\S+\s+BGP\s+\S+\s+\S+\s+(\S+ \S+|\S+)\s+Established`)

// sameSince compares two BIRD "since" stamps. BIRD renders its monotonic
// state-change time as wall time, so the same instant can print a
// millisecond apart; a flap moves it by far more.
func sameSince(a, b string) bool {
	ta, ea := time.Parse("15:04:05.000", a)
	tb, eb := time.Parse("15:04:05.000", b)
	if ea != nil || eb != nil {
		return a == b
	}
	d := ta.Sub(tb)
	return d < 50*time.Millisecond && d > -50*time.Millisecond
}

// birdSince is the "Since" column of a BIRD protocol: it changes on a flap.
func birdSince(t *testing.T, l *lab.BGPLab, proto string) string {
	t.Helper()
	out, err := l.Bird.Cmd("show protocols " + proto)
	if err != nil {
		t.Fatal(err)
	}
	m := birdSinceRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("protocol %s not Established:\n%s", proto, out)
	}
	return m[1]
}

// scrape reads the agent's /metrics from inside its namespace.
func scrape(t *testing.T, n *lab.LabNode) string { return httpGet(t, n, "/metrics") }

// httpGet fetches a path from the agent's metrics listener, dialling from
// inside the node's namespace.
func httpGet(t *testing.T, n *lab.LabNode, path string) string {
	t.Helper()
	return metricsGet(t, n.NS, path)
}

// metricsGet fetches path from the agent's metrics listener on the
// loopback of ns (nil: this process's own namespace, the host).
func metricsGet(t *testing.T, ns *lab.NS, path string) string {
	t.Helper()
	var conn net.Conn
	dial := func() error {
		var err error
		conn, err = net.DialTimeout("tcp", "127.0.0.1:9476", 2*time.Second)
		return err
	}
	var err error
	if ns == nil {
		err = dial()
	} else {
		err = ns.InNS(dial) // the socket stays in that namespace
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path)
	b, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBGPRFC5549Guard: against a BIRD without `extended next hop`, IPv4
// routes are not sent with an IPv6 next hop into the void: flockctl shows
// the warning, the metric says 1, the log says why, IPv6 still flows.
func TestBGPRFC5549Guard(t *testing.T) {
	l := newLab(t, 1, nil)
	if err := l.StartBird(lab.BirdOptions{NoExtendedNextHop: true}); err != nil {
		t.Fatal(err)
	}
	n := l.Nodes[0]
	waitEstablished(t, n)
	var nb []neighbor
	testutil.EventuallyWithin(t, 10*time.Second, "the RFC 5549 warning", func() (bool, string) {
		nb = neighbors(t, n.Agent)
		return len(nb) == 1 && len(nb[0].Warnings) == 1 && strings.Contains(nb[0].Warnings[0], "extended next hop"), fmt.Sprintf("%+v", nb)
	})
	for _, f := range nb[0].Families {
		if f.Family == "ipv4" && f.Advertised != 0 {
			t.Errorf("IPv4 advertised count %d, want 0 while withheld", f.Advertised)
		}
		if f.Family == "ipv6" && f.Advertised == 0 {
			t.Errorf("IPv6 not advertised: %+v", nb[0])
		}
	}
	out := flockctl(t, n.Agent, "bgp", "neighbors")
	if !strings.Contains(out, "RFC 5549 mismatch") {
		t.Errorf("flockctl bgp neighbors does not show the mismatch:\n%s", out)
	}
	if m := scrape(t, n); !strings.Contains(m, fmt.Sprintf(`flock_bgp_rfc5549_mismatch{peer="%s"} 1`, n.TorV6)) {
		t.Errorf("metric flock_bgp_rfc5549_mismatch not 1:\n%s", grepLines(m, "flock_bgp"))
	}
	if !strings.Contains(n.Agent.Log(), "RFC 5549 mismatch") {
		t.Error("no log line about the RFC 5549 mismatch")
	}
	tr := birdTor{l}
	torPaths(t, tr, n.Summary6, 1)
	if got := tr.paths(t, n.Summary4); got != 0 {
		t.Errorf("BIRD holds %s although IPv4 was withheld", n.Summary4)
	}

	// Turning extended next hop on at the ToR clears the warning and sends
	// IPv4 (BIRD restarts the session to renegotiate).
	if err := l.Bird.Reconfigure(l.BirdConfig(lab.BirdOptions{})); err != nil {
		t.Fatal(err)
	}
	torPaths(t, tr, n.Summary4, 1)
	testutil.EventuallyWithin(t, 10*time.Second, "the warning to clear", func() (bool, string) {
		nb := neighbors(t, n.Agent)
		return len(nb) == 1 && len(nb[0].Warnings) == 0, fmt.Sprintf("%+v", nb)
	})
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestBGPPeerRemoval: removing a peer from the node config (live reload)
// takes that session down without resetting the other; adding it back
// brings it up again.
func TestBGPPeerRemoval(t *testing.T) {
	twoPeers := func(n *lab.LabNode) string {
		return lab.NodeConfigYAML(n, fmt.Sprintf(`- address: %s
  asn: %d
  localAddress: %s
  timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
- address: %s
  asn: %d
  localAddress: %s
  timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
`, n.TorV6, lab.TorASN, n.V6, n.TorV4, lab.TorASN, n.V4))
	}
	l := newLab(t, 1, twoPeers)
	if err := l.StartBird(lab.BirdOptions{IPv4Sessions: true}); err != nil {
		t.Fatal(err)
	}
	n := l.Nodes[0]
	waitEstablished(t, n)
	if nb := neighbors(t, n.Agent); len(nb) != 2 {
		t.Fatalf("want 2 neighbors, got %+v", nb)
	}
	v6Since := birdSince(t, l, n.Name)
	birdSince(t, l, n.Name+"v4")

	if err := l.SetNodeConfig(n, lab.DefaultNodeConfig(n)); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 10*time.Second, "the IPv4 peer to be removed", func() (bool, string) {
		nb := neighbors(t, n.Agent)
		return len(nb) == 1 && nb[0].Peer == n.TorV6.String(), fmt.Sprintf("%+v", nb)
	})
	testutil.EventuallyWithin(t, 10*time.Second, "BIRD to see the IPv4 session gone", func() (bool, string) {
		out, _ := l.Bird.Cmd("show protocols " + n.Name + "v4")
		return !strings.Contains(out, "Established"), out
	})
	if s := birdSince(t, l, n.Name); !sameSince(s, v6Since) {
		t.Errorf("the IPv6 session was reset (since %q -> %q)", v6Since, s)
	}
	if nb := neighbors(t, n.Agent); nb[0].State != "Established" {
		t.Errorf("IPv6 session: %+v", nb[0])
	}
	if !strings.Contains(n.Agent.Log(), "reload: node config applied") {
		t.Error("no reload log line")
	}

	// And back.
	if err := l.SetNodeConfig(n, twoPeers(n)); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 20*time.Second, "the IPv4 peer to come back", func() (bool, string) {
		nb := neighbors(t, n.Agent)
		up := 0
		for _, x := range nb {
			if x.State == "Established" {
				up++
			}
		}
		return up == 2, fmt.Sprintf("%+v", nb)
	})
	if s := birdSince(t, l, n.Name); !sameSince(s, v6Since) {
		t.Errorf("the IPv6 session was reset when a peer was added (since %q -> %q)", v6Since, s)
	}
}
