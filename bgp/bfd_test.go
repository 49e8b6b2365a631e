package bgp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/bgp/bfd"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

func udpPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// lenientMult is both sides' BFD multiplier: 3 s at 300 ms, so that a
// loaded machine's stalls (the race detector, other tests) do not flap
// the sessions, and still a third of the BGP hold time (9 s), so that a
// reset by BFD cannot be mistaken for one by the hold timer.
const lenientMult = 10

// torBFD is the ToR's BFD: a bfd.Manager on its own port, with its events.
type torBFD struct {
	m      *bfd.Manager
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	events []bfd.Event
}

func startToRBFD(t *testing.T, port, peerPort int) *torBFD {
	t.Helper()
	b := &torBFD{done: make(chan struct{})}
	b.m = &bfd.Manager{Port: port, PeerPort: peerPort, Log: testLogger(t).With("component", "tor-bfd"), OnChange: func(e bfd.Event) {
		b.mu.Lock()
		b.events = append(b.events, e)
		b.mu.Unlock()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.m.Set([]bfd.Peer{{Key: "node", Remote: netip.MustParseAddr("::1"), Config: bfd.Config{DetectMult: lenientMult}}})
	go func() {
		defer close(b.done)
		_ = b.m.Run(ctx)
	}()
	t.Cleanup(b.kill)
	return b
}

// kill stops the ToR's BFD without a word (a crash).
func (b *torBFD) kill() {
	b.cancel()
	<-b.done
}

func (b *torBFD) state() bfd.State {
	st, _ := b.m.Status("node")
	return st.State
}

func bfdDetail(t *testing.T, sp *Speaker, key string) BFDDetail {
	t.Helper()
	n, ok := neighbor(sp, key)
	if !ok || n.BFDDetail == nil {
		t.Fatalf("no BFD detail for %s: %+v", key, n)
	}
	return *n.BFDDetail
}

// TestSpeakerBFD: flock's BFD against a ToR's (a second bfd.Manager): up
// with the session, timing changes without a BGP reset, a planned stop
// (AdminDown) leaves BGP alone, a failure resets BGP at once, and the
// speaker's own planned stop tells the ToR.
func TestSpeakerBFD(t *testing.T) {
	pNode, pToR := udpPort(t), udpPort(t)
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t, func(c *Config) { c.BFDPort, c.BFDPeerPort = pNode, pToR })
	tb := startToRBFD(t, pToR, pNode)
	peer := torPeer(r)
	peer.BFD.Enabled, peer.BFD.Multiplier = true, lenientMult
	if err := sp.ApplyPeers([]v1alpha1.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, sp, r, "::1")
	testutil.EventuallyWithin(t, waitFor, "BFD up on both sides", func() (bool, string) {
		d := bfdDetail(t, sp, "::1")
		return d.State == "up" && tb.state() == bfd.Up, fmt.Sprintf("node %+v, ToR %v", d, tb.state())
	})
	if st, _ := tb.m.Status("node"); st.RemoteControlPlaneIndependent {
		t.Error("flock's BFD claims to be control-plane independent (C bit); it shares fate with the agent")
	}
	up0 := r.uptime(t)

	// Timing changes apply without touching the BGP session, nor the BFD
	// session (a Poll Sequence: a ToR that takes any Down for a failure
	// would otherwise drop BGP). A window for nothing to happen: with
	// lenientMult a stall cannot fail it, a reset by the change shows in it.
	tb.mu.Lock()
	torEvents := len(tb.events)
	tb.mu.Unlock()
	since := bfdDetail(t, sp, "::1").Since
	peer.BFD.IntervalMs = 200
	if err := sp.ApplyPeers([]v1alpha1.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	testutil.Consistently(t, "BFD up through the timing change", 2*time.Second, func() (bool, string) {
		d := bfdDetail(t, sp, "::1")
		tb.mu.Lock()
		n := len(tb.events)
		tb.mu.Unlock()
		return d.State == "up" && d.Since.Equal(since) && n == torEvents && tb.state() == bfd.Up, fmt.Sprintf("%+v, ToR %v", d, tb.state())
	})
	if !r.established(t) || !r.uptime(t).Equal(up0) {
		t.Fatal("a BFD timing change reset the BGP session")
	}

	// The ToR stops BFD on purpose: BFD down, BGP left alone.
	tb.m.Shutdown(30 * time.Millisecond)
	testutil.EventuallyWithin(t, waitFor, "the planned stop seen", func() (bool, string) {
		d := bfdDetail(t, sp, "::1")
		return d.State == "down" && d.PlannedDowns == 1, fmt.Sprintf("%+v", d)
	})
	testutil.Consistently(t, "BGP untouched by AdminDown", 2*time.Second, func() (bool, string) {
		d := bfdDetail(t, sp, "::1")
		return r.established(t) && r.uptime(t).Equal(up0) && d.Failures == 0, fmt.Sprintf("%+v", d)
	})
	tb.kill()

	// The ToR's BFD comes back (new discriminator): up again, no reset.
	tb = startToRBFD(t, pToR, pNode)
	testutil.EventuallyWithin(t, waitFor, "BFD up with the ToR's new session", func() (bool, string) {
		d := bfdDetail(t, sp, "::1")
		return d.State == "up" && tb.state() == bfd.Up, fmt.Sprintf("%+v", d)
	})
	if !r.uptime(t).Equal(up0) {
		t.Fatal("the BGP session was reset when BFD came up")
	}

	// The ToR's BFD dies: detection, and the BGP session is reset at once
	// (not after the 9 s hold time; the ToR's BGP is alive, so nothing but
	// BFD may reset it). The session is read before the BFD detail: a
	// session seen down with no BFD failure after it went down first.
	killed := time.Now()
	tb.kill()
	testutil.EventuallyWithin(t, waitFor, "BFD failure resets BGP", func() (bool, string) {
		established := r.established(t)
		d := bfdDetail(t, sp, "::1")
		if !established && d.Failures == 0 {
			t.Fatalf("the BGP session went down before BFD saw a failure: %+v", d)
		}
		return d.Failures == 1 && d.Diag == "detection time expired" && !established, fmt.Sprintf("%+v", d)
	})
	if took := time.Since(killed); took > 9*time.Second {
		t.Errorf("BGP reset %v after the ToR's BFD died, later than the hold time would have", took)
	}
	testutil.EventuallyWithin(t, waitFor, "BGP re-established", func() (bool, string) {
		return r.established(t) && !r.uptime(t).Equal(up0), ""
	})
	waitEstablished(t, sp, r, "::1")

	// The speaker's planned stop: the ToR's BFD hears AdminDown.
	tb = startToRBFD(t, pToR, pNode)
	testutil.EventuallyWithin(t, waitFor, "BFD up", func() (bool, string) { return tb.state() == bfd.Up, tb.state().String() })
	sp.ShutdownBFD(30 * time.Millisecond)
	testutil.EventuallyWithin(t, waitFor, "the ToR sees AdminDown", func() (bool, string) {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		for _, e := range tb.events {
			if e.To == bfd.Down && e.RemoteDiag == bfd.DiagAdminDown {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", tb.events)
	})
}
