package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// torFailToR is a ToR of the failure tests, in the configuration
// deploy/tor ships.
type torFailToR struct {
	name    string
	start   func(l *lab.BGPLab) error
	crash   func(t *testing.T, l *lab.BGPLab) // SIGKILL every daemon
	restart func(t *testing.T, l *lab.BGPLab)
}

var torFailToRs = []torFailToR{
	{
		name:  "bird",
		start: func(l *lab.BGPLab) error { return l.StartBird(lab.BirdOptions{GR: true, BFDGraceful: true}) },
		crash: func(t *testing.T, l *lab.BGPLab) { l.Bird.Kill() },
		restart: func(t *testing.T, l *lab.BGPLab) {
			b, err := lab.StartBird(l.Tor, l.Bird.Dir, readFile(t, l.Bird.Conf))
			if err != nil {
				t.Fatal(err)
			}
			l.Bird = b
		},
	},
	{
		name: "frr",
		start: func(l *lab.BGPLab) error {
			return l.StartFRRWith(lab.FRROptions{GR: true, BFD: true, CheckCPFailure: true})
		},
		crash: func(t *testing.T, l *lab.BGPLab) { l.FRR.Kill() },
		restart: func(t *testing.T, l *lab.BGPLab) {
			if err := l.FRR.Restart(); err != nil {
				t.Fatal(err)
			}
		},
	},
}

// routesBackAfter waits for the ToR's session to the node, then for every
// prefix in its BGP table, sampling as fast as its CLI answers. It returns
// the time from its start to the session's re-establishment and from that
// to the last prefix's return, as sampled (the figures), and the least the
// latter can have been: a sample that saw a thing shows it happened before
// the sample ended, one that did not, that it happened after the sample
// began, and a loaded machine's samples are slow.
func routesBackAfter(t *testing.T, l *lab.BGPLab, tr tor, n *lab.LabNode, watch []netip.Prefix, within time.Duration) (est, back, atLeast time.Duration) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for !tr.sessionUp(t, n) {
		if time.Now().After(deadline) {
			t.Fatalf("the ToR's session did not come back within %v\n%s", within, tr.dump(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	up := time.Now()      // the session was up by then
	var missing time.Time // when the last sample that missed a prefix began
	for {
		began := time.Now()
		// The ToR's BGP table, not its FIB: a crashed BIRD or FRR leaves
		// its kernel routes behind, so the FIB would not tell.
		have := torRIB(t, l, tr)
		all := true
		for _, p := range watch {
			if !have[p] {
				all = false
				break
			}
		}
		if all {
			if !missing.IsZero() {
				atLeast = max(missing.Sub(up), 0)
			}
			return up.Sub(start), time.Since(up), atLeast
		}
		missing = began
		if time.Now().After(deadline) {
			t.Fatalf("routes not back in the ToR's BGP table within %v", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// routesBackWithin fails the test if the routes provably took longer than
// d after the session; the figure as sampled may be more on a loaded
// machine.
func routesBackWithin(t *testing.T, what string, back, atLeast, d time.Duration) {
	t.Helper()
	if atLeast > d {
		t.Errorf("%s: routes back at least %v after the session (sampled: %v), want ≤ %v", what, atLeast.Round(10*time.Millisecond), back.Round(10*time.Millisecond), d)
	}
}

// TestToRFailures: the ToR crashes (SIGKILL) and restarts, and the link to
// the node flaps, against BIRD and FRR in the shipped configurations (BFD
// 300 ms × 3, graceful restart). Every route must be back in the ToR's BGP
// table within 2 s of the session re-establishing (a failure must be
// proven by the sampling, which a loaded machine slows), and the node keeps
// its own forwarding state throughout (its kernel routes never change).
func TestToRFailures(t *testing.T) {
	for _, k := range torFailToRs {
		t.Run(k.name, func(t *testing.T) {
			l, n, tr, _, watch := faultLab(t, k.start, k.name, true)
			settle := func() { t.Helper(); settled(t, l, tr, n, true, watch) }
			nodeRoutes := kernelHostRoutes(t, n.NS)

			// The ToR crashes and comes back 1 s later.
			settle()
			k.crash(t, l)
			time.Sleep(time.Second)
			k.restart(t, l)
			est, back, atLeast := routesBackAfter(t, l, tr, n, watch, 60*time.Second)
			routesBackWithin(t, "ToR restart", back, atLeast, 2*time.Second)
			if got := kernelHostRoutes(t, n.NS); fmt.Sprint(got) != fmt.Sprint(nodeRoutes) {
				t.Errorf("the node's kernel routes changed while the ToR restarted:\nbefore %v\nafter  %v", nodeRoutes, got)
			}
			record(t, reliabilityRow{Section: "ToR failures", Fault: "ToR crash (every daemon SIGKILLed), restarted 1 s later", ToR: k.name + " (deploy/tor config)",
				Done: "the node's BFD and BGP with it; a pod route, two anycast routes and both summaries watched in the ToR's BGP table", Times: 1,
				Survived: fmt.Sprintf("all %d routes back; the node's kernel routes untouched (flock keeps forwarding while its peer restarts)", len(watch)),
				Figures: map[string]string{"session re-established after the restart": est.Round(10 * time.Millisecond).String(),
					"routes back in the ToR's BGP table after the session": back.Round(10 * time.Millisecond).String()}})

			// The link flaps: the ToR's port down for 2 s.
			settle()
			link := func(state string) {
				t.Helper()
				if out, err := exec.Command("ip", "-n", l.Tor.Name, "link", "set", n.TorIf, state).CombinedOutput(); err != nil {
					t.Fatalf("link %s: %v: %s", state, err, out)
				}
			}
			// A switch keeps its port's configured addresses across a link
			// flap; Linux drops a downed interface's IPv6 addresses unless
			// told to keep them.
			if err := l.Tor.Sysctl("net.ipv6.conf."+n.TorIf+".keep_addr_on_down", "1"); err != nil {
				t.Fatal(err)
			}
			link("down")
			var bfdDown bool
			testutil.EventuallyWithin(t, 10*time.Second, "the node's BFD to notice the link down", func() (bool, string) {
				b, _ := nodeBFD(t, n)
				bfdDown = b != "up"
				return bfdDown, b
			})
			time.Sleep(2 * time.Second)
			link("up")
			est, back, atLeast = routesBackAfter(t, l, tr, n, watch, 60*time.Second)
			routesBackWithin(t, "link flap", back, atLeast, 2*time.Second)
			if got := kernelHostRoutes(t, n.NS); fmt.Sprint(got) != fmt.Sprint(nodeRoutes) {
				t.Errorf("the node's kernel routes changed with the link flap:\nbefore %v\nafter  %v", nodeRoutes, got)
			}
			record(t, reliabilityRow{Section: "ToR failures", Fault: "link flap (the ToR's port down 2 s)", ToR: k.name + " (deploy/tor config)",
				Done: "ip link set down, 2 s, up; BFD 300 ms × 3", Times: 1,
				Survived: fmt.Sprintf("BFD saw the link go; all %d routes back; the node's kernel routes untouched", len(watch)),
				Figures: map[string]string{"session re-established after link up": est.Round(10 * time.Millisecond).String(),
					"routes back in the ToR's BGP table after the session": back.Round(10 * time.Millisecond).String()}})
		})
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestUnnumberedToRReplaced: the node peers by interface only; the ToR on
// that port is replaced (new MAC, so a new link-local address). flock must
// notice, resolve the link again and peer with the new ToR (GoBGP alone
// keeps dialling the old address for ever).
func TestUnnumberedToRReplaced(t *testing.T) {
	for _, k := range []string{"bird", "frr"} {
		t.Run(k, func(t *testing.T) {
			l, n, tr := unnumberedLab(t, k)
			waitEstablished(t, n)
			_, ips := addPod(t, n, "unnum", "flock.fritzlab.net/cidr6", "2001:db8:100::100/120")
			torPaths(t, tr, host(ips[0]), 1)
			old, err := l.Tor.LinkLocal(n.TorIf)
			if err != nil {
				t.Fatal(err)
			}

			// The replacement: the port goes dark, comes back with another
			// MAC, and the kernel derives a new link-local address from it.
			ip := func(args ...string) {
				t.Helper()
				if out, err := exec.Command("ip", append([]string{"-n", l.Tor.Name}, args...)...).CombinedOutput(); err != nil {
					t.Fatalf("ip %v: %v: %s", args, err, out)
				}
			}
			// The old ToR's port goes dark; 2 s later the new one is cabled
			// (a replacement takes longer: both ToRs see the port down, as
			// they would). The figures count from its port up.
			ip("link", "set", n.TorIf, "down")
			ip("link", "set", n.TorIf, "address", "02:00:5e:00:53:77")
			time.Sleep(2 * time.Second)
			ip("link", "set", n.TorIf, "up")
			replaced := time.Now()
			// The new ToR has the old one's configuration: its global
			// address on the port (the node's default route points at it;
			// Linux flushed it with the link).
			if err := l.Tor.AddrAdd(n.TorIf, netip.PrefixFrom(n.TorV6, 64)); err != nil {
				t.Fatal(err)
			}
			var now netip.Addr
			testutil.EventuallyWithin(t, 10*time.Second, "the new ToR's link-local address", func() (bool, string) {
				now, err = l.Tor.LinkLocal(n.TorIf)
				return err == nil && now != old, fmt.Sprint(now, err)
			})
			testutil.EventuallyWithin(t, 60*time.Second, "peered with the new ToR", func() (bool, string) {
				nb := neighbors(t, n.Agent)
				return len(nb) == 1 && nb[0].State == "Established" && tr.sessionUp(t, n), fmt.Sprintf("%+v", nb)
			})
			took := time.Since(replaced)
			torPaths(t, tr, host(ips[0]), 1)
			back := time.Since(replaced)
			ping(t, l.Tor, ips[0])
			record(t, reliabilityRow{Section: "ToR failures", Fault: "unnumbered ToR replaced (new MAC, new link-local address)", ToR: k,
				Done: fmt.Sprintf("the ToR's port down, new MAC, up 2 s later: its link-local address went from %s to %s; the node peers by interface only (hold time 9 s)", old, now), Times: 1,
				Survived: "flock saw the link lose its carrier and get it back (fast external failover), resolved the link again and peered with the new ToR; routes back, pod reachable",
				Figures: map[string]string{"peered with the new ToR after its port came up": took.Round(100 * time.Millisecond).String(),
					"the pod's route in the new ToR's table after its port came up": back.Round(100 * time.Millisecond).String()}})
		})
	}
}

// torRIB is every prefix in the ToR's BGP table, read in one call per
// family (one call per prefix would make the sampling the measurement).
func torRIB(t *testing.T, l *lab.BGPLab, tr tor) map[netip.Prefix]bool {
	t.Helper()
	out := map[netip.Prefix]bool{}
	if _, ok := tr.(birdTor); ok {
		for p := range birdTable(t, l) {
			out[p] = true
		}
		return out
	}
	for _, fam := range []string{"ipv6", "ipv4"} {
		js, err := l.FRR.Vtysh("show bgp " + fam + " unicast json")
		if err != nil {
			continue // bgpd not answering yet
		}
		var v struct {
			Routes map[string]json.RawMessage `json:"routes"`
		}
		if json.Unmarshal([]byte(js), &v) != nil {
			continue
		}
		for k := range v.Routes {
			if p, err := netip.ParsePrefix(k); err == nil {
				out[p] = true
			}
		}
	}
	return out
}
