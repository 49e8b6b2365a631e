package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// restartToR is one ToR configuration of the restart matrix.
type restartToR struct {
	name  string // as the table shows it
	kind  string // bird or frr
	bfd   bool   // BFD on the node's peer (and the ToR's)
	start func(l *lab.BGPLab) error
	// recommended: the configuration deploy/tor ships; a restart, planned
	// or not, must cost nothing there.
	recommended bool
}

var restartToRs = []restartToR{
	{name: "BIRD, graceful restart, no BFD", kind: "bird", recommended: true,
		start: func(l *lab.BGPLab) error { return l.StartBird(lab.BirdOptions{GR: true}) }},
	{name: "BIRD, GR + `bfd on`", kind: "bird", bfd: true,
		start: func(l *lab.BGPLab) error { return l.StartBird(lab.BirdOptions{GR: true, BFD: true}) }},
	{name: "BIRD, GR + `bfd graceful`", kind: "bird", bfd: true, recommended: true,
		start: func(l *lab.BGPLab) error { return l.StartBird(lab.BirdOptions{GR: true, BFDGraceful: true}) }},
	{name: "FRR, graceful restart, no BFD", kind: "frr", recommended: true,
		start: func(l *lab.BGPLab) error { return l.StartFRRWith(lab.FRROptions{GR: true}) }},
	{name: "FRR, GR + `bfd`", kind: "frr", bfd: true,
		start: func(l *lab.BGPLab) error { return l.StartFRRWith(lab.FRROptions{GR: true, BFD: true}) }},
	{name: "FRR, GR + `bfd` + `bfd check-control-plane-failure`", kind: "frr", bfd: true, recommended: true,
		start: func(l *lab.BGPLab) error {
			return l.StartFRRWith(lab.FRROptions{GR: true, BFD: true, CheckCPFailure: true})
		}},
}

func restartNodeConfig(bfd bool) func(n *lab.LabNode) string {
	return func(n *lab.LabNode) string {
		return lab.NodeConfigYAML(n, fmt.Sprintf(`- address: %s
  asn: %d
  localAddress: %s
  timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
  gracefulRestart: {restartTime: 120}
  bfd: {enabled: %v, intervalMs: 300, multiplier: 3}
`, n.TorV6, lab.TorASN, n.V6, bfd))
	}
}

// faultLab is the fault tests' lab: one node peering with the ToR start
// runs (BFD on the node's peer when bfd), a pod with an IPv6 host route
// and the anycast pair any6/any4, and the prefixes the ToR must hold.
func faultLab(t *testing.T, start func(l *lab.BGPLab) error, kind string, bfd bool) (*lab.BGPLab, *lab.LabNode, tor, netip.Addr, []netip.Prefix) {
	t.Helper()
	l := newLab(t, 1, restartNodeConfig(bfd))
	if err := start(l); err != nil {
		t.Fatal(err)
	}
	var tr tor = birdTor{l}
	if kind == "frr" {
		tr = frrTor{l}
	}
	n := l.Nodes[0]
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ToR:\n%s", tr.dump(t))
		}
	})
	waitEstablished(t, n)
	_, ips := addPod(t, n, "web", "flock.fritzlab.net/cidr6", "2001:db8:100::100/120",
		"flock.fritzlab.net/anycast", faultAny6+","+faultAny4)
	watch := []netip.Prefix{n.Summary6, n.Summary4, host(ips[0]), host(mustAddr(faultAny6)), host(mustAddr(faultAny4))}
	return l, n, tr, ips[0], watch
}

// The fault tests' anycast pair.
const faultAny6, faultAny4 = "2001:db8:a::1", "203.0.113.1"

// settled waits for the session (and BFD) up on both sides and every
// watched prefix in the ToR's FIB.
func settled(t *testing.T, l *lab.BGPLab, tr tor, n *lab.LabNode, bfd bool, watch []netip.Prefix) {
	t.Helper()
	testutil.EventuallyWithin(t, 30*time.Second, "settled", func() (bool, string) {
		nb := neighbors(t, n.Agent)
		if len(nb) != 1 || nb[0].State != "Established" || (bfd && nb[0].BFD != "up") || !tr.sessionUp(t, n) {
			return false, fmt.Sprintf("%+v", nb)
		}
		for _, p := range watch {
			if torKernelNexthops(t, l, p) == 0 {
				return false, p.String() + " not in the ToR's FIB"
			}
		}
		return true, ""
	})
}

// fibWatch samples the ToR's kernel table every 20 ms: which of the
// watched prefixes went missing, and for how long at most.
type fibWatch struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	missing map[netip.Prefix]time.Duration // longest absence
}

func watchFIB(t *testing.T, l *lab.BGPLab, watch []netip.Prefix) *fibWatch {
	w := &fibWatch{stop: make(chan struct{}), done: make(chan struct{}), missing: map[netip.Prefix]time.Duration{}}
	gone := map[netip.Prefix]time.Time{}
	go func() {
		defer close(w.done)
		for {
			now := time.Now()
			present := map[netip.Prefix]bool{}
			err := l.Tor.Do(func(h *netlink.Handle) error {
				for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
					rs, err := h.RouteList(nil, fam)
					if err != nil {
						return err
					}
					for _, r := range rs {
						if r.Dst != nil {
							present[prefixOf(r.Dst)] = true
						}
					}
				}
				return nil
			})
			if err == nil {
				w.mu.Lock()
				for _, p := range watch {
					if !present[p] {
						if _, ok := gone[p]; !ok {
							gone[p] = now
						}
						w.missing[p] = max(w.missing[p], now.Sub(gone[p])+20*time.Millisecond)
					} else {
						delete(gone, p)
					}
				}
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *fibWatch) Stop() (withdrawn []string, longest time.Duration) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, d := range w.missing {
		withdrawn = append(withdrawn, p.String())
		longest = max(longest, d)
	}
	slices.Sort(withdrawn)
	return withdrawn, longest
}

// TestAgentRestartUnderTraffic restarts the agent by SIGTERM (a planned
// stop, e.g. a DaemonSet rollout) and by SIGKILL (a crash) while the ToR
// pings a pod and an anycast address every 20 ms and its FIB is sampled
// every 20 ms, against BIRD and FRR, with and without BFD, with the ToRs'
// default BFD handling and with the configuration deploy/tor ships. The
// figures go into RELIABILITY.md; the shipped configurations must lose
// nothing.
func TestAgentRestartUnderTraffic(t *testing.T) {
	for _, k := range restartToRs {
		t.Run(k.name, func(t *testing.T) {
			l, n, tr, podIP, watch := faultLab(t, k.start, k.kind, k.bfd)
			targets := []netip.Addr{podIP, mustAddr(faultAny6), mustAddr(faultAny4)}

			for _, sig := range []string{"SIGTERM", "SIGKILL"} {
				// Settled, and the pod reachable.
				settled(t, l, tr, n, k.bfd, watch)
				for _, a := range targets {
					if err := lab.Ping(l.Tor, a, 5*time.Second); err != nil {
						t.Fatal(err)
					}
				}

				fib := watchFIB(t, l, watch)
				var pingers []*lab.Pinger
				for _, a := range targets {
					p, err := lab.StartPinger(l.Tor, a, 20*time.Millisecond)
					if err != nil {
						t.Fatal(err)
					}
					pingers = append(pingers, p)
				}
				time.Sleep(300 * time.Millisecond)
				t0 := time.Now()
				var err error
				if sig == "SIGTERM" {
					err = n.Agent.Stop()
				} else {
					err = n.Agent.Kill()
				}
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Second) // a rollout's gap between the old and the new pod
				if err := l.StartAgent(n); err != nil {
					t.Fatal(err)
				}
				// Back: the ToR's session re-established. A ToR that took
				// BFD's Down for a failure may hold off reconnecting (BIRD's
				// error wait, 60 s by default): noted, then cut short.
				back, waited := time.Duration(0), ""
				deadline := time.Now().Add(15 * time.Second)
				for !tr.sessionUp(t, n) && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
				if tr.sessionUp(t, n) {
					back = time.Since(t0)
				} else {
					waited = "session not back within 15 s"
					if k.kind == "bird" {
						out, _ := l.Bird.Cmd("show protocols all " + n.Name)
						if strings.Contains(out, "BFD session down") {
							waited = "BIRD waits out its error wait time (60 s) after `BFD session down`"
						}
						if out, err := l.Bird.Cmd("restart " + n.Name); err != nil {
							t.Fatalf("%v: %s", err, out)
						}
					}
					testutil.EventuallyWithin(t, 30*time.Second, "the ToR's session back", func() (bool, string) { return tr.sessionUp(t, n), "" })
				}
				// Past the End-of-RIB: stale routes replaced or dropped.
				time.Sleep(3 * time.Second)
				withdrawn, gap := fib.Stop()
				var lost []string
				sentAll, lostAll := 0, 0
				for _, p := range pingers {
					sent, l, longest := p.Stop()
					sentAll += sent
					lostAll += l
					if l > 0 {
						lost = append(lost, fmt.Sprintf("%s: %d of %d (%v)", p.Dst, l, sent, longest.Round(10*time.Millisecond)))
					}
				}
				survived := "every route stayed in the ToR's FIB, no ping lost"
				if len(withdrawn) > 0 || lostAll > 0 {
					survived = fmt.Sprintf("%d of %d prefixes withdrawn from the ToR's FIB (longest %v); pings lost: %s",
						len(withdrawn), len(watch), gap.Round(10*time.Millisecond), strings.Join(lost, ", "))
				}
				figures := map[string]string{
					"prefixes withdrawn at the ToR": fmt.Sprintf("%d of %d", len(withdrawn), len(watch)),
					"pings lost (pod, anycast ×2)":  fmt.Sprintf("%d of %d", lostAll, sentAll),
				}
				if back > 0 {
					figures["ToR session back after"] = back.Round(10 * time.Millisecond).String()
				} else {
					figures["ToR session back after"] = waited
				}
				bfdNote := "without BFD"
				if k.bfd {
					bfdNote = "BFD 300 ms × 3"
				}
				record(t, reliabilityRow{Section: "Agent restarts under traffic", Fault: "agent " + sig + ", restarted 1 s later", ToR: k.name,
					Done: fmt.Sprintf("%s; the ToR pings the pod and both anycast addresses every 20 ms; its FIB sampled every 20 ms", bfdNote), Times: 1,
					Survived: survived, Figures: figures})
				if k.recommended && (len(withdrawn) > 0 || lostAll > 0) {
					t.Errorf("%s with the shipped ToR config: %s", sig, survived)
				}
			}
		})
	}
}
