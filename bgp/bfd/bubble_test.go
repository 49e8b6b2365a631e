package bfd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The tests here run a Manager's session against a scripted remote inside
// a synctest bubble: the clock is fake, so rates, silences and detection
// times are exact however loaded the machine is, and nothing sleeps in
// real time. Packets go in through dispatch and come out through a fake
// socket.

// fakeConn is a session's sending socket: it keeps what the session sent.
type fakeConn struct {
	t      *testing.T
	mu     sync.Mutex
	sent   []sentPacket
	closed bool
}

type sentPacket struct {
	Packet
	at time.Time
}

func (c *fakeConn) WriteToUDP(b []byte, _ *net.UDPAddr) (int, error) {
	p, err := Unmarshal(b)
	if err != nil {
		c.t.Errorf("the session sent an invalid packet: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, sentPacket{p, time.Now()})
	return len(b), nil
}

func (c *fakeConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *fakeConn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sent)
}

// from returns what was sent from the i-th packet on.
func (c *fakeConn) from(i int) []sentPacket {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sentPacket(nil), c.sent[i:]...)
}

var bubbleRemote = netip.MustParseAddr("127.0.0.1")

// bubble is a Manager with one session ("r") and the remote's side of it.
// Only the bubble's root goroutine uses it.
type bubble struct {
	t      *testing.T
	m      *Manager
	conn   *fakeConn
	cancel context.CancelFunc

	// The remote: its discriminator, ours as it learnt it, its state and
	// Required Min RX; silent: it stopped sending periodically.
	discr, ours uint32
	state       State
	minRx       time.Duration
	silent      bool
	lastTx      time.Time
	read        int // our packets the remote has looked at
}

func newBubble(t *testing.T) *bubble {
	b := &bubble{t: t, conn: &fakeConn{t: t}, discr: 100, state: Down, minRx: DefaultInterval}
	b.m = &Manager{Log: slog.New(slog.DiscardHandler), open: func(Peer) (conn, error) { return b.conn, nil }}
	var ctx context.Context
	ctx, b.cancel = context.WithCancel(context.Background())
	b.m.startSessions(ctx)
	b.m.Set([]Peer{{Key: "r", Remote: bubbleRemote}})
	t.Cleanup(b.stop)
	synctest.Wait()
	return b
}

func (b *bubble) stop() {
	b.cancel()
	b.m.stopSessions()
}

func (b *bubble) status() Status {
	st, _ := b.m.Status("r")
	return st
}

// send delivers one packet of the remote's and lets the session act on it.
func (b *bubble) send(poll, final bool) {
	your := b.ours
	if b.state == Down {
		your = 0
	}
	p := Packet{State: b.state, Poll: poll, Final: final, DetectMult: 3, MyDiscr: b.discr, YourDiscr: your,
		DesiredMinTx: DefaultInterval, RequiredMinRx: b.minRx}
	b.m.dispatch(p.Marshal(), &net.UDPAddr{IP: net.IP(bubbleRemote.AsSlice()), Port: ControlPort}, 0)
	b.lastTx = time.Now()
	synctest.Wait()
}

// poll sends the remote's Poll and returns what the session sent at once:
// it must be exactly one packet, the Final (RFC 5880 §6.8.7).
func (b *bubble) poll() sentPacket {
	b.t.Helper()
	n := b.conn.count()
	b.send(true, false)
	got := b.conn.from(n)
	b.read = b.conn.count()
	if len(got) != 1 || !got[0].Final {
		b.t.Fatalf("the answer to a Poll: %+v, want one packet with the Final bit", got)
	}
	return got[0]
}

// run lets d pass in 5 ms steps: the remote sends every 300 ms unless
// silent, answers our Polls with a Final, and learns our discriminator.
// It returns what the session sent meanwhile.
func (b *bubble) run(d time.Duration) []sentPacket {
	b.t.Helper()
	start := b.conn.count()
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
		synctest.Wait()
		for _, p := range b.conn.from(b.read) {
			b.read++
			b.ours = p.MyDiscr
			if p.Poll {
				b.send(false, true)
			}
		}
		if !b.silent && time.Since(b.lastTx) >= DefaultInterval {
			b.send(false, false)
		}
	}
	return b.conn.from(start)
}

// up brings the session Up with the remote (three-way handshake) and lets
// our Poll Sequence for the fast rate end.
func (b *bubble) up() {
	b.t.Helper()
	b.run(10 * time.Millisecond) // our first Down: the remote learns our discriminator
	if b.ours == 0 {
		b.t.Fatal("the session sent nothing")
	}
	b.send(false, false) // Down → we go Init
	b.state = Up
	b.send(false, false) // Up → we go Up and Poll for the fast rate
	b.run(100 * time.Millisecond)
	if st := b.status(); st.State != Up {
		b.t.Fatalf("not Up after the handshake: %+v", st)
	}
}

// maxGap is the longest time without a packet from since to now.
func maxGap(since time.Time, ps []sentPacket) time.Duration {
	var g time.Duration
	for _, p := range ps {
		g = max(g, p.at.Sub(since))
		since = p.at
	}
	return max(g, time.Since(since))
}

// RFC 5880 §6.8.7: a remote whose Required Min RX is 0 gets no periodic
// packets, only the Final for its Poll; when it asks for packets again,
// they come at our rate.
func TestSessionRemoteMinRxZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		b.up()
		since := time.Now()
		if got := b.run(3 * time.Second); len(got) < 9 || maxGap(since, got) > DefaultInterval {
			t.Fatalf("Up at 300 ms: %d packets in 3 s, longest gap %v", len(got), maxGap(since, got))
		}

		// The remote stops wanting packets: a change of timing, so a Poll.
		b.minRx = 0
		quiet := b.poll().at
		if got := b.run(10 * time.Second); len(got) != 0 {
			t.Fatalf("%d packets in 10 s to a remote with Required Min RX 0 (want none), the first at +%v: %+v",
				len(got), got[0].at.Sub(quiet), got[0].Packet)
		}
		// Our detection time is the remote's rate, not ours: still Up.
		if st := b.status(); st.State != Up {
			t.Fatalf("left Up while quiet: %+v", st)
		}
		// A Poll is still answered, and only it.
		b.poll()
		if got := b.run(3 * time.Second); len(got) != 0 {
			t.Fatalf("after answering a Poll: %d packets, want none", len(got))
		}

		// Packets wanted again: periodic transmission resumes at once.
		b.minRx = DefaultInterval
		final := b.poll()
		if got := b.run(3 * time.Second); len(got) < 9 || maxGap(final.at, got) > DefaultInterval {
			t.Fatalf("after Required Min RX 300 ms again: %d packets in 3 s, longest gap %v", len(got), maxGap(final.at, got))
		}
		if st := b.status(); st.State != Up {
			t.Fatalf("%+v", st)
		}
	})
}

// While quiet, our detection time still applies: a remote that stops
// sending is Down after 3 × 300 ms. Down, the remote is forgotten (§6.8.1)
// with its wish for silence: a slow Down a second, so that a remote coming
// back finds us.
func TestSessionDetectionWhileQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		b.up()
		b.minRx = 0
		b.poll()
		if got := b.run(2 * time.Second); len(got) != 0 {
			t.Fatalf("quiet: %d packets", len(got))
		}
		b.silent = true
		last, n := b.lastTx, b.conn.count()
		for b.status().State == Up && time.Since(last) < 5*time.Second {
			b.run(5 * time.Millisecond)
		}
		st := b.status()
		took := st.Since.Sub(last)
		// The detection timer ticks every 25 ms.
		if st.State != Down || st.Diag != DiagDetectExpired || took < 900*time.Millisecond || took > 925*time.Millisecond {
			t.Fatalf("%+v %v after the remote's last packet; want Down (detection time expired) after 900 ms", st, took)
		}
		b.run(3 * time.Second)
		got := b.conn.from(n)
		if len(got) < 4 || got[0].State != Down || maxGap(st.Since, got) > slowTx {
			t.Fatalf("Down after the detection time: %d packets in 3 s (longest gap %v), want the Down and one a second: %+v",
				len(got), maxGap(st.Since, got), got)
		}
	})
}

// failingOpen is an opener that fails its first fails calls (all of them
// if fails < 0) and then opens c; it records when it was called.
type failingOpen struct {
	mu    sync.Mutex
	fails int
	c     conn
	calls []time.Time
}

var errNotAvail = errors.New("bind: cannot assign requested address")

func (o *failingOpen) open(p Peer) (conn, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, time.Now())
	if o.fails < 0 || len(o.calls) <= o.fails {
		return nil, fmt.Errorf("listen udp %v: %w", p.Remote, errNotAvail)
	}
	return o.c, nil
}

// gaps are the times between calls.
func (o *failingOpen) gaps() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(o.calls); i++ {
		out = append(out, o.calls[i].Sub(o.calls[i-1]))
	}
	return out
}

func (o *failingOpen) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.calls)
}

// openManager is a Manager running in the bubble whose sockets open with o.
func openManager(t *testing.T, o *failingOpen) (*Manager, context.CancelFunc) {
	m := &Manager{Log: slog.New(slog.DiscardHandler), open: o.open}
	ctx, cancel := context.WithCancel(context.Background())
	m.startSessions(ctx)
	t.Cleanup(func() {
		cancel()
		within(t, "stopSessions", m.stopSessions)
	})
	return m, cancel
}

// within runs f and fails the test if it has not returned after a minute
// of the bubble's time: a session that ignores its stop would otherwise
// hang the test (the bubble then panics with the goroutine left over).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not return: the session's goroutine did not stop", what)
	}
}

// A sending socket that cannot be opened (a local address not configured
// yet, say) is retried on its own, 100 ms doubling, with the failures in
// the status: no configuration change is needed.
func TestSessionOpenRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &fakeConn{t: t}
		o := &failingOpen{fails: 5, c: c}
		m, _ := openManager(t, o)
		m.Set([]Peer{{Key: "r", Remote: bubbleRemote}})
		time.Sleep(time.Second) // calls at 0, 0.1, 0.3, 0.7 s
		synctest.Wait()
		if c.count() != 0 {
			t.Fatal("sent without a socket")
		}
		if st, _ := m.Status("r"); st.State != Down || st.SocketFailures != 4 || !strings.Contains(st.SocketError, errNotAvail.Error()) {
			t.Fatalf("while failing: %+v, want 4 socket failures and the error", st)
		}
		time.Sleep(9 * time.Second) // 1.5 s fails, 3.1 s opens
		synctest.Wait()
		if o.count() != 6 || c.count() == 0 {
			t.Fatalf("%d opens, %d packets sent: the socket was not retried until it opened", o.count(), c.count())
		}
		want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond}
		if got := o.gaps(); !slices.Equal(got, want) {
			t.Fatalf("retried after %v, want %v", got, want)
		}
		if st, _ := m.Status("r"); st.SocketFailures != 5 || st.SocketError != "" {
			t.Fatalf("once open: %+v, want 5 socket failures and no current error", st)
		}
	})
}

// The backoff stops doubling at 10 s, and the retries end with the peer's
// removal, a planned stop and the manager's context.
func TestSessionOpenRetryBackoffAndStop(t *testing.T) {
	start := func(t *testing.T) (*Manager, *failingOpen, context.CancelFunc) {
		o := &failingOpen{fails: -1}
		m, cancel := openManager(t, o)
		m.Set([]Peer{{Key: "r", Remote: bubbleRemote}})
		time.Sleep(time.Minute)
		synctest.Wait()
		return m, o, cancel
	}
	// stopped checks that nothing retries any more.
	stopped := func(t *testing.T, o *failingOpen) {
		t.Helper()
		n := o.count()
		time.Sleep(time.Minute)
		synctest.Wait()
		if o.count() != n {
			t.Fatalf("%d more opens after the session was stopped", o.count()-n)
		}
	}
	t.Run("backoff", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, o, _ := start(t)
			gaps := o.gaps()
			if len(gaps) < 10 {
				t.Fatalf("%d retries in a minute", len(gaps))
			}
			for i, g := range gaps {
				if want := min(100*time.Millisecond<<i, 10*time.Second); g != want {
					t.Fatalf("retry %d after %v, want %v (all: %v)", i+1, g, want, gaps)
				}
			}
		})
	})
	t.Run("removed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m, o, _ := start(t)
			within(t, "Set(nil)", func() { m.Set(nil) })
			stopped(t, o)
		})
	})
	t.Run("shutdown", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m, o, _ := start(t)
			within(t, "Shutdown", func() { m.Shutdown(0) })
			if st, _ := m.Status("r"); st.State != AdminDown {
				t.Fatalf("after Shutdown: %+v", st)
			}
			stopped(t, o)
		})
	})
	t.Run("context", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m, o, cancel := start(t)
			cancel()
			within(t, "stopSessions", m.stopSessions)
			stopped(t, o)
		})
	})
}
