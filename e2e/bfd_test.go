package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// bfdNodeConfig peers with the ToR with BFD at 300 ms × 3.
func bfdNodeConfig(n *lab.LabNode) string {
	return lab.NodeConfigYAML(n, fmt.Sprintf(`- address: %s
  asn: %d
  localAddress: %s
  timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
  bfd: {enabled: true, intervalMs: 300, multiplier: 3}
`, n.TorV6, lab.TorASN, n.V6))
}

// bfdToR is a ToR flavour as the BFD tests use it.
type bfdToR struct {
	name  string
	start func(l *lab.BGPLab) error
	view  func(l *lab.BGPLab) tor
	// state is the ToR's BFD session state to node n ("up", "down", …;
	// "" when it has none) and the session's local discriminator.
	state func(t *testing.T, l *lab.BGPLab, n *lab.LabNode) (string, string)
	// recreate makes the ToR drop and re-create its BFD session (new
	// discriminator); what says how.
	recreate func(t *testing.T, l *lab.BGPLab)
	what     string
}

var bfdToRs = []bfdToR{
	{
		name:  "bird",
		start: func(l *lab.BGPLab) error { return l.StartBird(lab.BirdOptions{BFDGraceful: true, GR: true}) },
		view:  func(l *lab.BGPLab) tor { return birdTor{l} },
		state: birdBFDState,
		recreate: func(t *testing.T, l *lab.BGPLab) {
			if out, err := l.Bird.Cmd("restart bfd1"); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		},
		what: "birdc restart bfd1 (BIRD re-creates its BFD sessions)",
	},
	{
		name:  "frr",
		start: func(l *lab.BGPLab) error { return l.StartFRRWith(lab.FRROptions{BFD: true, GR: true}) },
		view:  func(l *lab.BGPLab) tor { return frrTor{l} },
		state: frrBFDState,
		recreate: func(t *testing.T, l *lab.BGPLab) {
			if err := l.FRR.KillDaemon("bfdd"); err != nil {
				t.Fatal(err)
			}
		},
		what: "bfdd SIGKILLed and restarted (new discriminators)",
	},
	{
		name:  "frr-dynamic",
		start: func(l *lab.BGPLab) error { return l.StartFRRWith(lab.FRROptions{BFD: true, GR: true, Dynamic: true}) },
		view:  func(l *lab.BGPLab) tor { return frrTor{l} },
		state: frrBFDState,
		recreate: func(t *testing.T, l *lab.BGPLab) {
			// A dynamic neighbour's BGP reset deletes it, and with it its
			// BFD session: the next one has a new discriminator (the case
			// GoBGP v4.8.0's BFD never recovered from).
			if out, err := l.FRR.Vtysh("clear bgp *"); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		},
		what: "clear bgp * (FRR deletes the dynamic neighbour and its BFD session)",
	},
}

func birdBFDState(t *testing.T, l *lab.BGPLab, n *lab.LabNode) (string, string) {
	out, err := l.Bird.Cmd("show bfd sessions")
	if err != nil {
		return "", ""
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == n.V6.String() {
			return strings.ToLower(f[2]), ""
		}
	}
	return "", ""
}

func frrBFDState(t *testing.T, l *lab.BGPLab, n *lab.LabNode) (string, string) {
	out, err := l.FRR.Vtysh("show bfd peers json")
	if err != nil {
		return "", ""
	}
	var peers []struct {
		Peer   string `json:"peer"`
		Status string `json:"status"`
		ID     uint32 `json:"id"`
	}
	if json.Unmarshal([]byte(out), &peers) != nil {
		return "", ""
	}
	for _, p := range peers {
		if p.Peer == n.V6.String() {
			return p.Status, fmt.Sprint(p.ID)
		}
	}
	return "", ""
}

// nodeBFD is the node's view: BFD state and the BGP session's state.
func nodeBFD(t *testing.T, n *lab.LabNode) (bfd, bgp string) {
	nb := neighbors(t, n.Agent)
	if len(nb) != 1 {
		t.Fatalf("neighbors: %+v", nb)
	}
	return nb[0].BFD, nb[0].State
}

// watchFlaps samples both sides every 50 ms for d and counts every moment
// BFD or BGP was not up on either side.
func watchFlaps(t *testing.T, l *lab.BGPLab, k bfdToR, n *lab.LabNode, d time.Duration) (samples, bad int, first string) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		b, s := nodeBFD(t, n)
		tb, _ := k.state(t, l, n)
		up := k.view(l).sessionUp(t, n)
		samples++
		if b != "up" || s != "Established" || tb != "up" || !up {
			bad++
			if first == "" {
				first = fmt.Sprintf("node bfd=%s bgp=%s, ToR bfd=%s bgp established=%v", b, s, tb, up)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return samples, bad, first
}

// bfdSince is when the node's BFD session last changed state.
func bfdSince(t *testing.T, n *lab.LabNode) time.Time {
	nb := neighbors(t, n.Agent)
	if len(nb) != 1 || nb[0].BFDDetail == nil {
		t.Fatalf("neighbors: %+v", nb)
	}
	return nb[0].BFDDetail.Since
}

func waitBFDUp(t *testing.T, l *lab.BGPLab, k bfdToR, n *lab.LabNode, within time.Duration) {
	t.Helper()
	testutil.EventuallyWithin(t, within, "BFD up on both sides", func() (bool, string) {
		b, s := nodeBFD(t, n)
		tb, _ := k.state(t, l, n)
		return b == "up" && tb == "up" && s == "Established", fmt.Sprintf("node bfd=%s bgp=%s, ToR bfd=%q", b, s, tb)
	})
}

// soakDuration is the BFD soak of the CI run; FLOCK_BFD_SOAK (a Go
// duration) lengthens it (`make soak` runs 10 minutes).
func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("FLOCK_BFD_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FLOCK_BFD_SOAK=%q: %v", v, err)
		}
		return d
	}
	return 10 * time.Second
}

// TestBFD: flock's BFD against BIRD, FRR with explicit neighbours and FRR
// with dynamic ones (listen range + peer group): Up within 2 s of the BGP
// session, a soak with zero flaps on either side, recovery after the ToR
// re-creates its session (and no flap loop after), recovery after the agent
// restarts, and a dead link detected within the detection time.
func TestBFD(t *testing.T) {
	for _, k := range bfdToRs {
		t.Run(k.name, func(t *testing.T) {
			l := newLab(t, 1, bfdNodeConfig)
			if err := k.start(l); err != nil {
				t.Fatal(err)
			}
			n := l.Nodes[0]
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("ToR:\n%s", k.view(l).dump(t))
				}
			})

			// Up: from the BGP session's establishment (BFD starts with it
			// at a dynamic-neighbour ToR) to BFD Up, both as the agent
			// stamped them (no sampling delay in it, however slow the
			// looks): after, and within a few of the slow rate's 1 s
			// packets the handshake takes.
			waitEstablished(t, n)
			waitBFDUp(t, l, k, n, 20*time.Second)
			nb := neighbors(t, n.Agent)
			if len(nb) != 1 || nb[0].BFDDetail == nil || nb[0].State != "Established" {
				t.Fatalf("neighbors: %+v", nb)
			}
			upAfter := nb[0].BFDDetail.Since.Sub(nb[0].Since)
			if upAfter < 0 || upAfter > 3*time.Second {
				t.Errorf("BFD came up %v after BGP, want within 0–3 s", upAfter.Round(time.Millisecond))
			}

			// Soak.
			soak := soakDuration(t)
			since0 := bfdSince(t, n)
			samples, bad, first := watchFlaps(t, l, k, n, soak)
			if bad != 0 {
				t.Errorf("soak: %d of %d samples not up (first: %s)", bad, samples, first)
			}
			// A flap shorter than the sampling would still have moved the
			// node's BFD session (and counted a failure).
			flaps := 0
			if nb := neighbors(t, n.Agent); len(nb) != 1 || nb[0].BFDDetail == nil || !nb[0].BFDDetail.Since.Equal(since0) || nb[0].BFDDetail.Failures != 0 {
				flaps = 1
				t.Errorf("soak: the node's BFD session changed state: %+v", nb)
			}
			record(t, reliabilityRow{Section: "BFD", Fault: "none (soak)", ToR: k.name, Done: fmt.Sprintf("BFD 300 ms × 3 watched on both sides every 50 ms for %v", soak), Times: 1,
				Survived: fmt.Sprintf("%d of %d samples with BFD and BGP up on both sides", samples-bad, samples),
				Figures:  map[string]string{"BFD up after BGP established": upAfter.Round(time.Millisecond).String(), "BFD or BGP flaps": fmt.Sprint(flaps)}})

			// The ToR re-creates its session: back up, then stable. Up
			// again means after the node's session moved (the states read
			// up for a moment after the command, before anyone noticed).
			_, id0 := k.state(t, l, n)
			since0 = bfdSince(t, n)
			t0 := time.Now()
			k.recreate(t, l)
			testutil.EventuallyWithin(t, 10*time.Second, "the node's BFD session to notice", func() (bool, string) {
				s := bfdSince(t, n)
				return !s.Equal(since0), s.String()
			})
			waitBFDUp(t, l, k, n, 20*time.Second)
			back := time.Since(t0)
			if _, id1 := k.state(t, l, n); id0 != "" && id0 == id1 {
				t.Errorf("the ToR's session kept discriminator %s: the test did not re-create it", id0)
			}
			samples, bad, first = watchFlaps(t, l, k, n, 5*time.Second)
			if bad != 0 {
				t.Errorf("after re-creation: %d of %d samples not up (first: %s) — a flap loop", bad, samples, first)
			}
			record(t, reliabilityRow{Section: "BFD", Fault: "ToR re-creates its BFD session", ToR: k.name, Done: k.what, Times: 1,
				Survived: fmt.Sprintf("BFD and BGP up again; then %d of %d samples up over 5 s (no flap loop)", samples-bad, samples),
				Figures:  map[string]string{"BFD and BGP up again after": back.Round(time.Millisecond).String()}})

			// The node re-creates its session (agent restart).
			if err := n.Agent.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := l.StartAgent(n); err != nil {
				t.Fatal(err)
			}
			waitEstablished(t, n)
			waitBFDUp(t, l, k, n, 20*time.Second)

			// A dead link: the ToR stops sending on it (everything it sends
			// to the node dropped), the node detects within 3 × 300 ms. The
			// ToR goes to the fast rate as soon as its session is up (RFC
			// 5880 §6.8.3 lets a faster rate apply at once); a second past
			// the node's Up stamp, it is in force.
			if wait := time.Until(bfdSince(t, n).Add(time.Second)); wait > 0 {
				time.Sleep(wait)
			}
			ip6tables := func(op string) {
				t.Helper()
				if out, err := exec.Command("ip", "netns", "exec", l.Tor.Name, "ip6tables", op, "OUTPUT", "-o", n.TorIf, "-j", "DROP").CombinedOutput(); err != nil {
					t.Fatalf("ip6tables %s: %v: %s", op, err, out)
				}
			}
			cutStart := time.Now()
			ip6tables("-I")
			cutEnd := time.Now() // the cut took effect in between
			// The agent stamps the transition: no sampling delay in it.
			var down struct {
				Since time.Time
				Diag  string
			}
			testutil.EventuallyWithin(t, 10*time.Second, "the node's BFD down", func() (bool, string) {
				nb := neighbors(t, n.Agent)
				if len(nb) != 1 || nb[0].BFDDetail == nil {
					t.Fatalf("neighbors: %+v", nb)
				}
				d := nb[0].BFDDetail
				down.Since, down.Diag = d.Since, d.Diag
				return d.State != "up", d.State
			})
			ip6tables("-D")
			detected := down.Since.Sub(cutStart)
			// The last packet came at most one interval (300 ms) before
			// the cut: Down 600–925 ms after it (900 ms, plus the 25 ms
			// check), after cutStart + 600 ms and before cutEnd + 925 ms.
			// The bounds leave room for a late ToR packet (100 ms) and a
			// loaded agent (500 ms); a detection by the multiplier alone
			// (300 ms) or by anything slower (the BGP hold time) fails.
			if down.Diag != "detection time expired" {
				t.Errorf("BFD down with diag %q, want detection time expired", down.Diag)
			}
			if detected < 500*time.Millisecond || down.Since.Sub(cutEnd) > 1425*time.Millisecond {
				t.Errorf("dead link detected %v after the cut began (%v after it was in place), want 600–925 ms (300 ms × 3)",
					detected.Round(time.Millisecond), down.Since.Sub(cutEnd).Round(time.Millisecond))
			}
			waitEstablished(t, n)
			waitBFDUp(t, l, k, n, 30*time.Second)
			record(t, reliabilityRow{Section: "BFD", Fault: "dead ToR link (all traffic ToR → node lost)", ToR: k.name, Done: "ip6tables DROP on the ToR's port, removed after detection", Times: 1,
				Survived: "the node reset the BGP session at once; BFD and BGP up again after the link healed",
				Figures:  map[string]string{"detection (300 ms × 3)": detected.Round(time.Millisecond).String()}})
		})
	}
}
