package bfd

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Two Managers talking over a fake network in a synctest bubble: the
// protocol's timing (rates, detection times, stability over many of them)
// is asserted exactly, where over loopback sockets a loaded machine could
// starve a session past its detection time. manager_test.go covers the
// sockets themselves.

// fakeNet carries packets to the Manager on their destination port, at
// once; a packet to a port with no Manager (a dead node) is lost.
type fakeNet struct {
	mu   sync.Mutex
	at   map[int]*Manager
	sent map[int][]sentPacket // by destination port
}

func newFakeNet() *fakeNet {
	return &fakeNet{at: map[int]*Manager{}, sent: map[int][]sentPacket{}}
}

// to returns the packets delivered to port, from the i-th on.
func (n *fakeNet) to(port, i int) []sentPacket {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]sentPacket(nil), n.sent[port][min(i, len(n.sent[port])):]...)
}

func (n *fakeNet) count(port int) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.sent[port])
}

// netConn is a session's socket on the fake network.
type netConn struct {
	t *testing.T
	n *fakeNet
}

func (c netConn) WriteToUDP(b []byte, to *net.UDPAddr) (int, error) {
	p, err := Unmarshal(b)
	if err != nil {
		c.t.Errorf("the session sent an invalid packet: %v", err)
	}
	c.n.mu.Lock()
	m := c.n.at[to.Port]
	if m != nil {
		c.n.sent[to.Port] = append(c.n.sent[to.Port], sentPacket{p, time.Now()})
	}
	c.n.mu.Unlock()
	if m != nil {
		m.dispatch(b, &net.UDPAddr{IP: net.IP(bubbleRemote.AsSlice()), Port: 49152}, 0)
	}
	return len(b), nil
}

func (netConn) Close() error { return nil }

// simNode is a Manager on the fake network with the events it reported.
type simNode struct {
	m    *Manager
	port int
	kill func() // stop without a word, as SIGKILL would

	mu     sync.Mutex
	events []Event
	at     []time.Time
}

func (n *fakeNet) start(t *testing.T, port, peerPort int) *simNode {
	nd := &simNode{port: port}
	nd.m = &Manager{Port: port, PeerPort: peerPort, Log: slog.New(slog.DiscardHandler),
		open: func(Peer) (conn, error) { return netConn{t, n}, nil },
		OnChange: func(e Event) {
			nd.mu.Lock()
			defer nd.mu.Unlock()
			nd.events, nd.at = append(nd.events, e), append(nd.at, time.Now())
		}}
	ctx, cancel := context.WithCancel(context.Background())
	nd.m.startSessions(ctx)
	n.mu.Lock()
	n.at[port] = nd.m
	n.mu.Unlock()
	nd.kill = sync.OnceFunc(func() {
		n.mu.Lock()
		delete(n.at, port)
		n.mu.Unlock()
		cancel()
		nd.m.stopSessions()
	})
	t.Cleanup(nd.kill)
	return nd
}

func (nd *simNode) eventCount() int {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return len(nd.events)
}

func (nd *simNode) eventsCopy() []Event {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return append([]Event(nil), nd.events...)
}

func (nd *simNode) state(key string) State {
	st, _ := nd.m.Status(key)
	return st.State
}

// pair starts a and b on ports pa and pb, each with a session to the
// other.
func (n *fakeNet) pair(t *testing.T, pa, pb int) (a, b *simNode) {
	a, b = n.start(t, pa, pb), n.start(t, pb, pa)
	a.m.Set([]Peer{{Key: "b", Remote: bubbleRemote}})
	b.m.Set([]Peer{{Key: "a", Remote: bubbleRemote}})
	return a, b
}

// simPair starts a (port 1) and b (port 2) and waits until both are Up:
// within the first exchange, or a slow packet later.
func simPair(t *testing.T) (n *fakeNet, a, b *simNode) {
	t.Helper()
	n = newFakeNet()
	a, b = n.pair(t, 1, 2)
	waitUp(t, 2*time.Second, a, b)
	return n, a, b
}

// waitUp waits for the nodes' sessions to be Up, for at most d of the
// bubble's time.
func waitUp(t *testing.T, d time.Duration, nodes ...*simNode) {
	t.Helper()
	start := time.Now()
	for {
		synctest.Wait()
		up := true
		for _, nd := range nodes {
			for _, k := range nd.m.Keys() {
				up = up && nd.state(k) == Up
			}
		}
		if up {
			return
		}
		if time.Since(start) > d {
			for _, nd := range nodes {
				t.Errorf("port %d: %+v", nd.port, nd.eventsCopy())
			}
			t.Fatalf("not Up after %v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Sessions come Up and then stay Up: no change at all for 100 detection
// times. Sixteen pairs: the rates are jittered, and a timer left at the
// slow rate after Up overruns the 900 ms detection time only in some runs.
func TestManagerStaysUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var nodes []*simNode
		for i := range 16 {
			a, b := n.pair(t, 2*i+1, 2*i+2)
			nodes = append(nodes, a, b)
		}
		waitUp(t, 2*time.Second, nodes...)
		counts := make([]int, len(nodes))
		for i, nd := range nodes {
			counts[i] = nd.eventCount()
		}
		time.Sleep(90 * time.Second)
		synctest.Wait()
		for i, nd := range nodes {
			if nd.eventCount() != counts[i] || nd.state(nd.m.Keys()[0]) != Up {
				t.Fatalf("port %d flapped: %+v", nd.port, nd.eventsCopy())
			}
		}
	})
}

// The remote crashes and comes back at once with a new discriminator, as
// FRR's bfdd does when it re-creates a dynamic neighbour's session: the
// session follows it back Up (Down, then Up: no detection time waited
// out) and then stays Up (no loop).
func TestManagerRemoteRecreated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, a, b := simPair(t)
		time.Sleep(time.Second)
		na := a.eventCount()
		b.kill()
		b2 := n.start(t, 2, 1)
		b2.m.Set([]Peer{{Key: "a", Remote: bubbleRemote}})
		waitUp(t, 2*time.Second, a, b2)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		got := a.eventsCopy()[na:]
		if len(got) != 2 || got[0].To != Down || got[0].Diag != DiagNeighborDown || got[1].To != Up || a.state("b") != Up || b2.state("a") != Up {
			t.Fatalf("after re-creation: %+v, want Down (neighbor signaled down), Up and nothing more", got)
		}
	})
}

// A dead remote is detected after the detection time (3 × 300 ms) from
// its last packet, to the detection timer's 25 ms tick.
func TestManagerDetectionTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, a, b := simPair(t)
		time.Sleep(time.Second) // Up at the fast rate (the Poll Sequence is over)
		b.kill()
		last := n.to(a.port, n.count(a.port)-1)[0].at
		for a.state("b") == Up && time.Since(last) < 5*time.Second {
			time.Sleep(5 * time.Millisecond)
			synctest.Wait()
		}
		st, _ := a.m.Status("b")
		took := st.Since.Sub(last)
		if st.State != Down || st.Diag != DiagDetectExpired || took < 900*time.Millisecond || took > 925*time.Millisecond {
			t.Fatalf("%+v %v after the remote's last packet; want Down (detection time expired) after 900 ms", st, took)
		}
	})
}

// Changing a running session's timing keeps it Up on both sides (a Poll
// Sequence), and the new timing is what both then run on: a's packets
// every 500 ms at most, b's detection time 4 × 500 ms.
func TestManagerTimingChangeKeepsUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, a, b := simPair(t)
		time.Sleep(time.Second)
		na, nb := a.eventCount(), b.eventCount()
		a.m.Set([]Peer{{Key: "b", Remote: bubbleRemote, Config: Config{DesiredMinTx: 500 * time.Millisecond, RequiredMinRx: 500 * time.Millisecond, DetectMult: 4}}})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if a.eventCount() != na || b.eventCount() != nb || b.state("a") != Up {
			t.Fatalf("the timing change took a session down: %+v / %+v", a.eventsCopy(), b.eventsCopy())
		}
		// The last few seconds: a's packets carry the new timing, no Poll
		// is pending, and none is more than 500 ms apart.
		since := time.Now().Add(-5 * time.Second)
		var recent []sentPacket
		for _, p := range n.to(b.port, 0) {
			if p.at.After(since) {
				recent = append(recent, p)
			}
		}
		for _, p := range recent {
			if p.DesiredMinTx != 500*time.Millisecond || p.RequiredMinRx != 500*time.Millisecond || p.DetectMult != 4 || p.Poll {
				t.Fatalf("a's packet after the change: %+v", p.Packet)
			}
		}
		if len(recent) < 10 || maxGap(since, recent) > 500*time.Millisecond {
			t.Fatalf("a sent %d packets in 5 s, longest gap %v; want one every 375–500 ms", len(recent), maxGap(since, recent))
		}
		// b detects a's death on the new timing.
		a.kill()
		last := recent[len(recent)-1].at
		for b.state("a") == Up && time.Since(last) < 10*time.Second {
			time.Sleep(5 * time.Millisecond)
			synctest.Wait()
		}
		st, _ := b.m.Status("a")
		if took := st.Since.Sub(last); st.Diag != DiagDetectExpired || took < 2*time.Second || took > 2025*time.Millisecond {
			t.Fatalf("b: %+v %v after a's last packet; want Down after 4 × 500 ms", st, took)
		}
	})
}
