package bfd

import (
	"context"
	"golang.org/x/net/ipv4"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"
)

// node is a Manager running on loopback with its own port, as a test peer.
type node struct {
	t      *testing.T
	m      *Manager
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	events []Event
	at     []time.Time
}

func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		c4, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := c4.LocalAddr().(*net.UDPAddr).Port
		c4.Close()
		if c6, err := net.ListenPacket("udp6", net.JoinHostPort("::1", strconv.Itoa(port))); err == nil {
			c6.Close()
			return port
		}
	}
	t.Fatal("no free UDP port")
	return 0
}

func startNode(t *testing.T, port, peerPort int) *node {
	t.Helper()
	n := &node{t: t, done: make(chan struct{})}
	n.m = &Manager{Port: port, PeerPort: peerPort, OnChange: func(e Event) {
		n.mu.Lock()
		n.events, n.at = append(n.events, e), append(n.at, time.Now())
		n.mu.Unlock()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() {
		defer close(n.done)
		if err := n.m.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(n.kill)
	return n
}

// kill stops the node without telling anyone, as SIGKILL would.
func (n *node) kill() {
	n.cancel()
	<-n.done
}

func (n *node) state(key string) State {
	s, _ := n.m.Status(key)
	return s.State
}

func (n *node) waitState(key string, want State, within time.Duration) {
	n.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if n.state(key) == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	s, _ := n.m.Status(key)
	n.t.Fatalf("%s: state %v (diag %v), want %v within %v; events %+v", key, s.State, s.Diag, want, within, n.eventsCopy())
}

func (n *node) eventsCopy() []Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Event(nil), n.events...)
}

func (n *node) eventCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.events)
}

// waitDown waits for a change to Down after since (the status changes a
// moment before OnChange runs).
func (n *node) waitDown(since time.Time, within time.Duration) Event {
	n.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if e, _, ok := n.lastDown(since); ok {
			return e
		}
		time.Sleep(10 * time.Millisecond)
	}
	n.t.Fatalf("no change to Down within %v; events %+v", within, n.eventsCopy())
	return Event{}
}

// lastDown is the time of the last change to Down after since.
func (n *node) lastDown(since time.Time) (Event, time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := len(n.events) - 1; i >= 0; i-- {
		if n.events[i].To == Down && n.at[i].After(since) {
			return n.events[i], n.at[i], true
		}
	}
	return Event{}, time.Time{}, false
}

func pair(t *testing.T, addr netip.Addr) (a, b *node, pa, pb int) {
	pa, pb = freePort(t), freePort(t)
	a, b = startNode(t, pa, pb), startNode(t, pb, pa)
	a.m.Set([]Peer{{Key: "b", Remote: addr}})
	b.m.Set([]Peer{{Key: "a", Remote: addr}})
	return a, b, pa, pb
}

func TestManagerUp(t *testing.T) {
	for _, addr := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")} {
		t.Run(addr.String(), func(t *testing.T) {
			a, b, _, _ := pair(t, addr)
			start := time.Now()
			a.waitState("b", Up, 5*time.Second)
			b.waitState("a", Up, 5*time.Second)
			t.Logf("FIGURE bfd-up-loopback-%s %v", addr, time.Since(start).Round(time.Millisecond))
			// Stable: no change for longer than several detection times.
			n := a.eventCount() + b.eventCount()
			time.Sleep(3 * time.Second)
			if got := a.eventCount() + b.eventCount(); got != n {
				t.Fatalf("sessions flapped: %+v / %+v", a.eventsCopy(), b.eventsCopy())
			}
		})
	}
}

// The remote crashes and comes back at once with a new discriminator, as
// FRR's bfdd does when it re-creates a dynamic neighbour's session: the
// session follows it back Up, and then stays Up (no loop).
func TestManagerRemoteRecreated(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	a, b, pa, pb := pair(t, addr)
	a.waitState("b", Up, 5*time.Second)
	b.kill()
	b2 := startNode(t, pb, pa)
	b2.m.Set([]Peer{{Key: "a", Remote: addr}})
	b2.waitState("a", Up, 5*time.Second)
	a.waitState("b", Up, 5*time.Second)
	n := a.eventCount()
	time.Sleep(3 * time.Second)
	if a.eventCount() != n || a.state("b") != Up {
		t.Fatalf("flap after re-creation: %+v", a.eventsCopy())
	}
}

// A dead remote is detected within the detection time (3 × 300 ms).
func TestManagerDetection(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	a, b, _, _ := pair(t, addr)
	a.waitState("b", Up, 5*time.Second)
	b.waitState("a", Up, 5*time.Second)
	// Let the fast rate settle (the Poll Sequence).
	time.Sleep(time.Second)
	killed := time.Now()
	b.kill()
	a.waitDown(killed, 5*time.Second)
	e, at, ok := a.lastDown(killed)
	if !ok || e.Diag != DiagDetectExpired || e.From != Up {
		t.Fatalf("down event %+v", a.eventsCopy())
	}
	took := at.Sub(killed)
	t.Logf("FIGURE bfd-detect-loopback %v", took.Round(time.Millisecond))
	// The protocol's bound is 900 ms after the last packet; twice that
	// would mean the session ran on the slow (1 s) timers while Up.
	if took > 1800*time.Millisecond {
		t.Fatalf("detection took %v; the session is not at 300 ms × 3", took)
	}
}

// A planned stop: the remote sees AdminDown and knows it was deliberate.
func TestManagerShutdownAdminDown(t *testing.T) {
	addr := netip.MustParseAddr("::1")
	a, b, _, _ := pair(t, addr)
	a.waitState("b", Up, 5*time.Second)
	b.waitState("a", Up, 5*time.Second)
	since := time.Now()
	b.m.Shutdown(30 * time.Millisecond)
	if got := b.state("a"); got != AdminDown {
		t.Fatalf("b after Shutdown: %v", got)
	}
	e := a.waitDown(since, 2*time.Second)
	if e.RemoteDiag != DiagAdminDown || e.Diag != DiagNeighborDown {
		t.Fatalf("a's down event %+v: want remote diag AdminDown", e)
	}
	// Removing a peer with Set is deliberate too.
	b.kill()
	a2, b2, _, _ := pair(t, addr)
	a2.waitState("b", Up, 5*time.Second)
	since = time.Now()
	b2.m.Set(nil)
	if e := a2.waitDown(since, 2*time.Second); e.RemoteDiag != DiagAdminDown {
		t.Fatalf("Set(nil): a's down event %+v", e)
	}
	if len(b2.m.Keys()) != 0 {
		t.Fatalf("keys left: %v", b2.m.Keys())
	}
}

// Packets that are not single-hop (TTL below 255) never reach a session.
func TestManagerGTSM(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	a := startNode(t, pa, pb)
	a.m.Set([]Peer{{Key: "b", Remote: netip.MustParseAddr("127.0.0.1")}})
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: pa})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Default TTL (64): an Init addressed to a's session would make it Up.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		for _, d := range discrs(a.m) {
			c.Write(Packet{State: Init, DetectMult: 3, MyDiscr: 77, YourDiscr: d, DesiredMinTx: time.Second, RequiredMinRx: time.Second}.Marshal())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := a.state("b"); got != Down {
		t.Fatalf("a packet with TTL 64 moved the session to %v", got)
	}
}

func discrs(m *Manager) []uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []uint32
	for d := range m.byDiscr {
		out = append(out, d)
	}
	return out
}

// A remote that re-creates its session (FRR does, right after creating
// it, when bgpd applies a profile) hears our state with its new
// discriminator at once, not at the next slow-rate packet a second later.
func TestManagerAnswersRenewedRemoteAtOnce(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	a := startNode(t, pa, pb)
	remote, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: pb})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	if err := ipv4.NewConn(remote).SetTTL(255); err != nil {
		t.Fatal(err)
	}
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: pa}
	a.m.Set([]Peer{{Key: "b", Remote: netip.MustParseAddr("127.0.0.1")}})
	// await reads our packets until one names discr as Your Discriminator.
	await := func(discr uint32, within time.Duration) (Packet, bool) {
		deadline := time.Now().Add(within)
		buf := make([]byte, 128)
		for {
			_ = remote.SetReadDeadline(deadline)
			n, _, err := remote.ReadFromUDP(buf)
			if err != nil {
				return Packet{}, false
			}
			p, err := Unmarshal(buf[:n])
			if err == nil && p.YourDiscr == discr {
				return p, true
			}
		}
	}
	down := func(discr uint32) Packet {
		return Packet{State: Down, DetectMult: 3, MyDiscr: discr, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	}
	// Until the manager listens, our Down may go nowhere: repeat it.
	var p Packet
	ok := false
	for range 20 {
		if _, err := remote.WriteToUDP(down(100).Marshal(), to); err != nil {
			t.Fatal(err)
		}
		if p, ok = await(100, 200*time.Millisecond); ok {
			break
		}
	}
	if !ok || p.State != Init {
		t.Fatalf("no Init for discriminator 100: %+v", p)
	}
	// The remote's session is re-created: a Down with discriminator 200.
	// Our state does not change (Init stays Init), the answer must still
	// come well before the next 1 s slow-rate packet.
	if _, err := remote.WriteToUDP(down(200).Marshal(), to); err != nil {
		t.Fatal(err)
	}
	if p, ok := await(200, 300*time.Millisecond); !ok || p.State != Init {
		t.Fatalf("no immediate Init for the re-created session (discriminator 200): %+v", p)
	}
}

// Changing a running session's timing keeps it Up on both sides.
func TestManagerTimingChangeKeepsUp(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	a, b, _, _ := pair(t, addr)
	a.waitState("b", Up, 5*time.Second)
	b.waitState("a", Up, 5*time.Second)
	n := a.eventCount() + b.eventCount()
	a.m.Set([]Peer{{Key: "b", Remote: addr, Config: Config{DesiredMinTx: 500 * time.Millisecond, RequiredMinRx: 500 * time.Millisecond, DetectMult: 4}}})
	time.Sleep(3 * time.Second)
	if got := a.eventCount() + b.eventCount(); got != n {
		t.Fatalf("the timing change took a session down: %+v / %+v", a.eventsCopy(), b.eventsCopy())
	}
	if st, _ := b.m.Status("a"); st.State != Up {
		t.Fatalf("remote %v", st.State)
	}
}
