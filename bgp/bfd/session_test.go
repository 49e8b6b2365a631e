package bfd

import (
	"testing"
	"time"
)

func TestMachineThreeWayHandshake(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, b := newMachine(Config{}, 11), newMachine(Config{}, 22)
	// a → b: Down, no Your Discriminator yet.
	pa := a.packet()
	if pa.State != Down || pa.YourDiscr != 0 || pa.DesiredMinTx != slowTx {
		t.Fatalf("first packet %+v", pa)
	}
	if !b.receive(pa, t0) || b.state != Init {
		t.Fatalf("b after Down: %v", b.state)
	}
	pb := b.packet()
	if pb.State != Init || pb.YourDiscr != 11 {
		t.Fatalf("b's reply %+v", pb)
	}
	if !a.receive(pb, t0) || a.state != Up {
		t.Fatalf("a after Init: %v", a.state)
	}
	pa = a.packet()
	if pa.State != Up || !pa.Poll || pa.DesiredMinTx != DefaultInterval {
		t.Fatalf("a's Up packet must announce the fast rate with a Poll: %+v", pa)
	}
	if !b.receive(pa, t0) || b.state != Up {
		t.Fatalf("b after Up: %v", b.state)
	}
	pb = b.packet()
	if !pb.Final {
		t.Fatalf("b must answer a Poll with a Final: %+v", pb)
	}
	if pb2 := b.packet(); pb2.Final {
		t.Fatal("Final sent twice")
	}
	a.receive(pb, t0)
	if a.poll {
		t.Fatal("a's Poll Sequence did not end on the Final")
	}
	// A Control packet of an Up session is never C-bit: flock's BFD shares
	// fate with its control plane.
	if a.packet().ControlPlaneIndependent {
		t.Fatal("C bit set")
	}
}

// The defect of GoBGP v4.8.0 against FRR: the remote re-creates its session
// (new discriminator, Down, Your Discriminator 0). The session must take the
// new discriminator and come back Up, not keep talking to the old one.
func TestMachineRemoteRecreated(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := up(t, t0)
	if a.remoteDiscr != 22 {
		t.Fatalf("remote discr %d", a.remoteDiscr)
	}
	if !a.receive(Packet{State: Down, DetectMult: 3, MyDiscr: 99, DesiredMinTx: time.Second, RequiredMinRx: time.Second}, t0) || a.state != Down || a.diag != DiagNeighborDown {
		t.Fatalf("a after remote's Down: %v %v", a.state, a.diag)
	}
	if p := a.packet(); p.YourDiscr != 99 || p.State != Down {
		t.Fatalf("a must address the new discriminator: %+v", p)
	}
	a.receive(Packet{State: Down, DetectMult: 3, MyDiscr: 99, DesiredMinTx: time.Second, RequiredMinRx: time.Second}, t0)
	if a.state != Init {
		t.Fatalf("a after second Down: %v", a.state)
	}
	a.receive(Packet{State: Up, DetectMult: 3, MyDiscr: 99, YourDiscr: 11, DesiredMinTx: time.Second, RequiredMinRx: time.Second}, t0)
	if a.state != Up {
		t.Fatalf("a after Up: %v", a.state)
	}
	// And from Init: a remote whose session was re-created while we were
	// in Init sends Down; we stay Init, now for the new discriminator.
	c := newMachine(Config{}, 1)
	c.receive(Packet{State: Down, DetectMult: 3, MyDiscr: 5}, t0)
	c.receive(Packet{State: Down, DetectMult: 3, MyDiscr: 6}, t0)
	if c.state != Init || c.packet().YourDiscr != 6 {
		t.Fatalf("Init, re-created remote: %v %+v", c.state, c.packet())
	}
}

func TestMachineDetection(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := up(t, t0)
	a.receive(Packet{State: Up, DetectMult: 3, MyDiscr: 22, YourDiscr: 11, DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond}, t0)
	if got := a.detectTime(); got != 900*time.Millisecond {
		t.Fatalf("detect time %v, want 900ms (3 × 300 ms)", got)
	}
	if a.expire(t0.Add(899 * time.Millisecond)) {
		t.Fatal("expired early")
	}
	if !a.expire(t0.Add(900*time.Millisecond)) || a.state != Down || a.diag != DiagDetectExpired {
		t.Fatalf("after detection time: %v %v", a.state, a.diag)
	}
	if a.remoteDiscr != 0 {
		t.Fatal("remote discriminator kept after the detection time")
	}
	if p := a.packet(); p.DesiredMinTx != slowTx {
		t.Fatalf("Down must fall back to the slow rate: %+v", p)
	}
	// The detection time follows the slower of the remote's rate and ours.
	b := newMachine(Config{RequiredMinRx: 100 * time.Millisecond}, 1)
	b.receive(Packet{State: Down, DetectMult: 5, MyDiscr: 2, DesiredMinTx: 200 * time.Millisecond}, t0)
	if got := b.detectTime(); got != time.Second {
		t.Fatalf("detect time %v, want 1s (5 × 200 ms)", got)
	}
	// In Down (the remote said AdminDown) the remote discriminator is
	// forgotten too, without a state change.
	c := newMachine(Config{}, 1)
	c.receive(Packet{State: AdminDown, DetectMult: 3, MyDiscr: 2, DesiredMinTx: time.Second}, t0)
	if c.state != Down || c.remoteDiscr != 2 {
		t.Fatalf("c: %v %d", c.state, c.remoteDiscr)
	}
	if c.expire(t0.Add(4*time.Second)) || c.remoteDiscr != 0 {
		t.Fatalf("Down: changed or kept the discriminator (%d)", c.remoteDiscr)
	}
}

// AdminDown from the remote (RFC 5882 §3.2) takes us Down with "neighbor
// signaled down"; the caller tells planned from failed by the remote's diag.
func TestMachineRemoteAdminDown(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := up(t, t0)
	if !a.receive(Packet{Diag: DiagAdminDown, State: AdminDown, DetectMult: 3, MyDiscr: 22, YourDiscr: 11}, t0) || a.state != Down || a.diag != DiagNeighborDown {
		t.Fatalf("%v %v", a.state, a.diag)
	}
	// And AdminDown in Down changes nothing.
	if a.receive(Packet{State: AdminDown, DetectMult: 3, MyDiscr: 22}, t0) {
		t.Fatal("AdminDown in Down changed the state")
	}
}

func TestMachineShutdown(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := up(t, t0)
	a.shutdown()
	p := a.packet()
	if p.State != AdminDown || p.Diag != DiagAdminDown {
		t.Fatalf("%+v", p)
	}
	// Once AdminDown, nothing the remote sends brings it back.
	if a.receive(Packet{State: Down, DetectMult: 3, MyDiscr: 22}, t0) || a.state != AdminDown {
		t.Fatalf("left AdminDown: %v", a.state)
	}
}

func TestMachineTxInterval(t *testing.T) {
	a := newMachine(Config{}, 1)
	for range 100 {
		iv := a.txInterval()
		if iv < 750*time.Millisecond || iv > time.Second {
			t.Fatalf("slow interval %v outside 75–100%% of 1s", iv)
		}
	}
	// The remote's Required Min RX bounds how fast we send.
	a.receive(Packet{State: Init, DetectMult: 3, MyDiscr: 2, YourDiscr: 1, RequiredMinRx: 2 * time.Second}, time.Unix(0, 0))
	if iv := a.txInterval(); iv < 1500*time.Millisecond {
		t.Fatalf("interval %v ignores the remote's 2s", iv)
	}
	// Required Min RX 0: the remote wants no periodic packets.
	a.receive(Packet{State: Up, DetectMult: 3, MyDiscr: 2, YourDiscr: 1}, time.Unix(0, 0))
	if iv := a.txInterval(); iv != 0 || a.txBase() != 0 {
		t.Fatalf("interval %v (base %v), want none", iv, a.txBase())
	}
	// Once the remote is forgotten (detection time), we send again.
	if !a.expire(time.Unix(10, 0)) {
		t.Fatal("no expiry")
	}
	if iv := a.txInterval(); iv < 750*time.Millisecond || iv > time.Second {
		t.Fatalf("Down, remote forgotten: interval %v, want the slow rate", iv)
	}
}

// up returns a session of ours (discr 11) Up with a remote (discr 22).
func up(t *testing.T, at time.Time) *machine {
	t.Helper()
	a := newMachine(Config{}, 11)
	a.receive(Packet{State: Init, DetectMult: 3, MyDiscr: 22, YourDiscr: 11, DesiredMinTx: time.Second, RequiredMinRx: time.Second}, at)
	if a.state != Up {
		t.Fatalf("not Up: %v", a.state)
	}
	return a
}

// FRR advertises a slow Required Min RX until its session is Up and then
// speeds up with a Poll: the transmit base must follow at once (the caller
// re-arms its timer on a change), or the gap overruns FRR's new detection
// time and the session flaps right after coming Up.
func TestMachineRemoteSpeedsUp(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := newMachine(Config{}, 11)
	a.receive(Packet{State: Init, DetectMult: 3, MyDiscr: 22, YourDiscr: 11, DesiredMinTx: time.Second, RequiredMinRx: time.Second}, t0)
	if a.state != Up || a.txBase() != time.Second {
		t.Fatalf("%v, base %v", a.state, a.txBase())
	}
	a.receive(Packet{State: Up, Poll: true, DetectMult: 3, MyDiscr: 22, YourDiscr: 11, DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond}, t0)
	if a.txBase() != DefaultInterval {
		t.Fatalf("base %v after the remote's Poll, want %v", a.txBase(), DefaultInterval)
	}
	if p := a.packet(); !p.Final {
		t.Fatal("no Final for the remote's Poll")
	}
}

// upPair brings two machines Up with their Poll Sequences done.
func upPair(t *testing.T, t0 time.Time) (a, b *machine) {
	t.Helper()
	a, b = newMachine(Config{}, 11), newMachine(Config{}, 22)
	for range 6 {
		b.receive(a.packet(), t0)
		a.receive(b.packet(), t0)
	}
	if a.state != Up || b.state != Up || a.poll || b.poll {
		t.Fatalf("not settled: a %v poll %v, b %v poll %v", a.state, a.poll, b.state, b.poll)
	}
	return a, b
}

// A timing change on an Up session is a Poll Sequence, never a Down; a
// slower rate waits for the Final (RFC 5880 §6.8.3), a faster one does not.
func TestMachineReconfigure(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, b := upPair(t, t0)
	slow := Config{DesiredMinTx: time.Second, RequiredMinRx: time.Second, DetectMult: 5}
	if !a.reconfigure(slow) {
		t.Fatal("an Up session's new timing must be announced at once")
	}
	if a.state != Up || a.txBase() != DefaultInterval {
		t.Fatalf("before the Final: state %v, sending every %v (want the old 300 ms)", a.state, a.txBase())
	}
	p := a.packet()
	if !p.Poll || p.DesiredMinTx != time.Second || p.RequiredMinRx != time.Second || p.DetectMult != 5 {
		t.Fatalf("the Poll must carry the new timing: %+v", p)
	}
	if b.receive(p, t0) || b.state != Up {
		t.Fatalf("the remote left Up: %v", b.state)
	}
	if b.detectTime() != 5*time.Second {
		t.Errorf("the remote's detection time %v, want 5 × 1 s", b.detectTime())
	}
	a.receive(b.packet(), t0) // the Final
	if a.poll || a.txBase() != time.Second {
		t.Fatalf("after the Final: poll %v, sending every %v (want 1 s)", a.poll, a.txBase())
	}
	// Faster again: at once.
	a.reconfigure(Config{})
	if a.txBase() != DefaultInterval || !a.poll {
		t.Fatalf("faster: sending every %v, poll %v", a.txBase(), a.poll)
	}
	if a.reconfigure(Config{}) {
		t.Error("the same timing again is no change")
	}
	// Down: the new timing waits for Up.
	d := newMachine(Config{}, 33)
	if d.reconfigure(slow) || d.poll || d.desiredTx != slowTx {
		t.Errorf("a Down session: poll %v, desired %v", d.poll, d.desiredTx)
	}
}

// Asking for packets more often does not shorten our detection time until
// the remote has confirmed it (the Final); a second change during a Poll
// Sequence waits for that sequence's Final and then gets its own.
func TestMachineReconfigureDetectionAndPending(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, b := upPair(t, t0)
	slow := Config{DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	a.reconfigure(slow)
	b.receive(a.packet(), t0)
	a.receive(b.packet(), t0) // Final
	b.receive(a.packet(), t0)
	if a.poll || a.detectTime() != 3*time.Second {
		t.Fatalf("settled at 1 s: poll %v, detection %v", a.poll, a.detectTime())
	}
	// Faster: until the Final, the remote may still send once a second.
	a.reconfigure(Config{})
	if got := a.detectTime(); got != 3*time.Second {
		t.Fatalf("detection time before the Final %v, want the old 3 s", got)
	}
	// A second change meanwhile waits.
	third := Config{DesiredMinTx: 500 * time.Millisecond, RequiredMinRx: 500 * time.Millisecond}
	if a.reconfigure(third) {
		t.Fatal("a change during a Poll Sequence must wait for its Final")
	}
	if p := a.packet(); p.DesiredMinTx != DefaultInterval || !p.Poll {
		t.Fatalf("the running sequence's packet changed: %+v", p)
	}
	b.receive(a.packet(), t0)
	a.receive(b.packet(), t0) // Final of the first: the second starts
	if !a.poll || a.cfg != third.withDefaults() {
		t.Fatalf("after the Final: poll %v, cfg %+v", a.poll, a.cfg)
	}
	if p := a.packet(); !p.Poll || p.DesiredMinTx != 500*time.Millisecond {
		t.Fatalf("the second sequence's Poll: %+v", p)
	}
}
