package bfd

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
)

// The tests here run Managers on loopback sockets: packets, ports, GTSM.
// A loaded machine may delay anything here, so they wait for conditions
// with generous deadlines and assert order, not speed; the protocol's
// timing is asserted in fake time (pair_test.go, bubble_test.go).

// wait is how long a condition may take to become true: far longer than
// it takes on an idle machine, so only a failure reaches it.
const wait = 15 * time.Second

// node is a Manager running on loopback with its own port, as a test peer.
type node struct {
	t      *testing.T
	m      *Manager
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	events []Event
	at     []time.Time
	// changed is closed (and replaced) at every event.
	changed chan struct{}
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
	n := &node{t: t, done: make(chan struct{}), changed: make(chan struct{})}
	n.m = &Manager{Port: port, PeerPort: peerPort, OnChange: func(e Event) {
		n.mu.Lock()
		n.events, n.at = append(n.events, e), append(n.at, time.Now())
		close(n.changed)
		n.changed = make(chan struct{})
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

// waitFor waits for cond, checking it at every event (the status changes
// before OnChange runs), for at most wait.
func (n *node) waitFor(what string, cond func() bool) {
	n.t.Helper()
	timeout := time.After(wait)
	for {
		n.mu.Lock()
		changed := n.changed
		n.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			n.t.Fatalf("%s: not within %v; events %+v", what, wait, n.eventsCopy())
		}
	}
}

func (n *node) waitState(key string, want State) {
	n.t.Helper()
	n.waitFor(key+" "+want.String(), func() bool { return n.state(key) == want })
}

func (n *node) eventsCopy() []Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Event(nil), n.events...)
}

// waitDown waits for a change to Down after since.
func (n *node) waitDown(since time.Time) Event {
	n.t.Helper()
	var e Event
	n.waitFor("a change to Down", func() bool {
		var ok bool
		e, _, ok = n.lastDown(since)
		return ok
	})
	return e
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

// tolerant is timing for a test that must not see a detection time
// expire on a loaded machine: 6 s without a packet.
var tolerant = Config{DetectMult: 20}

func pair(t *testing.T, addr netip.Addr, cfg Config) (a, b *node, pa, pb int) {
	pa, pb = freePort(t), freePort(t)
	a, b = startNode(t, pa, pb), startNode(t, pb, pa)
	a.m.Set([]Peer{{Key: "b", Remote: addr, Config: cfg}})
	b.m.Set([]Peer{{Key: "a", Remote: addr, Config: cfg}})
	return a, b, pa, pb
}

func TestManagerUp(t *testing.T) {
	for _, addr := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")} {
		t.Run(addr.String(), func(t *testing.T) {
			a, b, _, _ := pair(t, addr, Config{})
			start := time.Now()
			a.waitState("b", Up)
			b.waitState("a", Up)
			t.Logf("FIGURE bfd-up-loopback-%s %v", addr, time.Since(start).Round(time.Millisecond))
		})
	}
}

// A dead remote is detected: Up to Down, detection time expired. (How
// soon is TestManagerDetectionTime's, in fake time: here a loaded machine
// can only make it later.)
func TestManagerDetection(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	a, b, _, _ := pair(t, addr, Config{})
	a.waitState("b", Up)
	b.waitState("a", Up)
	killed := time.Now()
	b.kill()
	e := a.waitDown(killed)
	if e.Diag != DiagDetectExpired || e.From != Up {
		t.Fatalf("down event %+v; all: %+v", e, a.eventsCopy())
	}
	_, at, _ := a.lastDown(killed)
	t.Logf("FIGURE bfd-detect-loopback %v", at.Sub(killed).Round(time.Millisecond))
}

// A planned stop: the remote sees AdminDown and knows it was deliberate.
func TestManagerShutdownAdminDown(t *testing.T) {
	addr := netip.MustParseAddr("::1")
	a, b, _, _ := pair(t, addr, tolerant)
	a.waitState("b", Up)
	b.waitState("a", Up)
	since := time.Now()
	b.m.Shutdown(30 * time.Millisecond)
	if got := b.state("a"); got != AdminDown {
		t.Fatalf("b after Shutdown: %v", got)
	}
	e := a.waitDown(since)
	if e.RemoteDiag != DiagAdminDown || e.Diag != DiagNeighborDown {
		t.Fatalf("a's down event %+v: want remote diag AdminDown", e)
	}
	// Removing a peer with Set is deliberate too.
	b.kill()
	a2, b2, _, _ := pair(t, addr, tolerant)
	a2.waitState("b", Up)
	since = time.Now()
	b2.m.Set(nil)
	if e := a2.waitDown(since); e.RemoteDiag != DiagAdminDown {
		t.Fatalf("Set(nil): a's down event %+v", e)
	}
	if len(b2.m.Keys()) != 0 {
		t.Fatalf("keys left: %v", b2.m.Keys())
	}
}

// fakePeer is a remote on loopback written by hand: a socket on the
// manager's peer port, which reads the manager's packets.
type fakePeer struct {
	t    *testing.T
	c    *net.UDPConn
	to   *net.UDPAddr // the manager's port
	buf  []byte
	seen []Packet
}

func newFakePeer(t *testing.T, port, managerPort int) *fakePeer {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &fakePeer{t: t, c: c, to: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: managerPort}, buf: make([]byte, 128)}
}

// send sends p with the given TTL.
func (f *fakePeer) send(p Packet, ttl int) {
	f.t.Helper()
	if err := ipv4.NewConn(f.c).SetTTL(ttl); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.c.WriteToUDP(p.Marshal(), f.to); err != nil {
		f.t.Fatal(err)
	}
}

// await reads the manager's packets until ok accepts one, for at most
// wait; every packet read is kept in seen.
func (f *fakePeer) await(what string, ok func(Packet) bool) Packet {
	f.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		_ = f.c.SetReadDeadline(deadline)
		n, _, err := f.c.ReadFromUDP(f.buf)
		if err != nil {
			f.t.Fatalf("no %s within %v (%v); packets seen: %+v", what, wait, err, f.seen)
		}
		if p, err := Unmarshal(f.buf[:n]); err == nil {
			f.seen = append(f.seen, p)
			if ok(p) {
				return p
			}
		}
	}
}

// Packets that are not single-hop (TTL below 255) never reach a session:
// Inits with TTL 64 that would take it Up are dropped, and the same Init
// with TTL 255, sent after them from the same socket (so read after them),
// takes it Up.
func TestManagerGTSM(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	a := startNode(t, pa, pb)
	f := newFakePeer(t, pb, pa)
	a.m.Set([]Peer{{Key: "b", Remote: netip.MustParseAddr("127.0.0.1")}})
	// The session's first packet: the manager is listening (Run starts
	// sessions after it opened its sockets), and its discriminator.
	ours := f.await("first packet", func(Packet) bool { return true }).MyDiscr
	init := func(discr uint32) Packet {
		return Packet{State: Init, DetectMult: 3, MyDiscr: discr, YourDiscr: ours, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	}
	for range 20 {
		f.send(init(64), 64)
	}
	f.send(init(255), 255)
	f.await("answer to the TTL 255 Init", func(p Packet) bool {
		if p.YourDiscr == 64 {
			t.Fatalf("a packet with TTL 64 reached the session: it answered %+v", p)
		}
		return p.YourDiscr == 255
	})
	a.waitState("b", Up)
}

// A remote that re-creates its session (FRR does, right after creating
// it, when bgpd applies a profile) hears our state with its new
// discriminator at once, not at the next periodic packet. The remote asks
// for packets a minute apart at most, so any answer within the test's
// deadline is the immediate one.
func TestManagerAnswersRenewedRemoteAtOnce(t *testing.T) {
	pa, pb := freePort(t), freePort(t)
	a := startNode(t, pa, pb)
	f := newFakePeer(t, pb, pa)
	a.m.Set([]Peer{{Key: "b", Remote: netip.MustParseAddr("127.0.0.1")}})
	f.await("first packet", func(Packet) bool { return true })
	down := func(discr uint32) Packet {
		return Packet{State: Down, DetectMult: 3, MyDiscr: discr, DesiredMinTx: time.Minute, RequiredMinRx: time.Minute}
	}
	f.send(down(100), 255)
	if p := f.await("Init for discriminator 100", func(p Packet) bool { return p.YourDiscr == 100 }); p.State != Init {
		t.Fatalf("answer to Down: %+v, want Init", p)
	}
	// Re-created: a Down with discriminator 200. Our state does not
	// change (Init stays Init); the answer must still come at once.
	f.send(down(200), 255)
	if p := f.await("Init for discriminator 200", func(p Packet) bool { return p.YourDiscr == 200 }); p.State != Init {
		t.Fatalf("answer to the re-created session: %+v, want Init", p)
	}
}
