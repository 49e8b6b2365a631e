package bfd

import (
	"math/rand/v2"
	"time"
)

// Config is a session's timing. Zero values take the defaults.
type Config struct {
	// DesiredMinTx is how often to send while Up (default 300 ms).
	DesiredMinTx time.Duration
	// RequiredMinRx is the fastest we want to receive (default 300 ms).
	RequiredMinRx time.Duration
	// DetectMult: packets missed before Down (default 3).
	DetectMult uint8
}

// Defaults: 300 ms × 3 detects a dead link within a second.
const (
	DefaultInterval   = 300 * time.Millisecond
	DefaultDetectMult = 3
	// slowTx: while not Up, at most one packet a second (RFC 5880 §6.8.3).
	slowTx = time.Second
)

func (c Config) withDefaults() Config {
	if c.DesiredMinTx <= 0 {
		c.DesiredMinTx = DefaultInterval
	}
	if c.RequiredMinRx <= 0 {
		c.RequiredMinRx = DefaultInterval
	}
	if c.DetectMult == 0 {
		c.DetectMult = DefaultDetectMult
	}
	return c
}

// machine is one session's RFC 5880 state, without I/O: the caller feeds
// it packets and time, and sends what it says.
type machine struct {
	cfg         Config
	localDiscr  uint32
	remoteDiscr uint32
	state       State
	remoteState State
	diag        Diag
	// desiredTx is what we advertise: slowTx until Up, cfg's when Up.
	desiredTx     time.Duration
	remoteMinRx   time.Duration
	remoteDesired time.Duration
	remoteMult    uint8
	remoteCPI     bool
	// poll: a Poll Sequence is running (we changed our timing while Up);
	// final: the remote asked for a Final.
	poll, final bool
	// pollTx, pollRx: while a Poll Sequence announces new timing, the old
	// transmit rate (if slower is announced) and the old receive interval
	// (if faster is asked for: the detection time) stay in force until the
	// Final (§6.8.3). pending: timing asked for during a running Poll
	// Sequence, announced with a new one after the Final.
	pollTx, pollRx time.Duration
	pending        *Config
	lastRx         time.Time
	adminDown      bool
}

// initialRemoteMinRx is bfd.RemoteMinRxInterval before the remote said
// anything (RFC 5880 §6.8.1: 1 µs): send at our own rate.
const initialRemoteMinRx = time.Microsecond

func newMachine(cfg Config, discr uint32) *machine {
	return &machine{cfg: cfg.withDefaults(), localDiscr: discr, state: Down, remoteState: Down, desiredTx: slowTx, remoteMinRx: initialRemoteMinRx}
}

// receive applies a packet (RFC 5880 §6.8.6, after the checks Unmarshal
// made and the session was selected). It reports whether the state changed.
func (m *machine) receive(p Packet, now time.Time) (changed bool) {
	m.remoteDiscr = p.MyDiscr
	m.remoteState = p.State
	m.remoteMinRx = p.RequiredMinRx
	m.remoteDesired = p.DesiredMinTx
	m.remoteMult = p.DetectMult
	m.remoteCPI = p.ControlPlaneIndependent
	m.lastRx = now
	if p.Final && m.poll {
		m.poll, m.pollTx, m.pollRx = false, 0, 0
		if c := m.pending; c != nil {
			m.pending = nil
			m.reconfigure(*c) // the caller sends the next packet: the new Poll
		}
	}
	if p.Poll {
		m.final = true
	}
	if m.state == AdminDown {
		return false
	}
	before := m.state
	switch {
	case p.State == AdminDown:
		if m.state != Down {
			m.down(DiagNeighborDown)
		}
	case m.state == Down:
		switch p.State {
		case Down:
			m.state = Init
		case Init:
			m.up()
		}
	case m.state == Init:
		if p.State == Init || p.State == Up {
			m.up()
		}
	default: // Up
		if p.State == Down {
			m.down(DiagNeighborDown)
		}
	}
	return m.state != before
}

func (m *machine) up() {
	m.state, m.diag = Up, DiagNone
	if m.desiredTx != m.cfg.DesiredMinTx {
		// Faster timing once Up: announced with a Poll Sequence.
		m.desiredTx, m.poll = m.cfg.DesiredMinTx, true
	}
}

func (m *machine) down(d Diag) {
	m.state, m.diag = Down, d
	if m.desiredTx != slowTx {
		m.desiredTx = slowTx
	}
	m.poll, m.pollTx, m.pollRx = false, 0, 0
	if c := m.pending; c != nil {
		m.cfg, m.pending = *c, nil
	}
}

// detectTime is how long without a packet before Down (asynchronous mode).
func (m *machine) detectTime() time.Duration {
	rx := m.cfg.RequiredMinRx
	if m.poll {
		rx = max(rx, m.pollRx)
	}
	return time.Duration(m.remoteMult) * max(rx, m.remoteDesired)
}

// expire checks the detection time; it reports a change to Down.
func (m *machine) expire(now time.Time) bool {
	if m.lastRx.IsZero() || now.Sub(m.lastRx) < m.detectTime() {
		return false
	}
	// §6.8.1: forget the remote once the detection time passed, in any
	// state, so a re-created remote session is accepted afresh. Its
	// Required Min RX goes too: a remote that asked for silence and died
	// would otherwise never hear from us again.
	m.remoteDiscr, m.remoteState, m.lastRx = 0, Down, time.Time{}
	m.remoteMinRx = initialRemoteMinRx
	if m.state != Up && m.state != Init {
		return false
	}
	m.down(DiagDetectExpired)
	return true
}

// txBase is the un-jittered transmit interval: ours, or slower if the
// remote wants packets less often; 0 if it wants none (Required Min RX 0:
// no periodic packets, §6.8.7).
func (m *machine) txBase() time.Duration {
	if m.remoteMinRx == 0 {
		return 0
	}
	d := m.desiredTx
	if m.poll && m.pollTx > 0 {
		d = min(d, m.pollTx)
	}
	return max(d, m.remoteMinRx)
}

// reconfigure applies new timing to a running session. Up, it starts a
// Poll Sequence announcing it (true: send now); otherwise the new values
// go out with the next packet.
func (m *machine) reconfigure(cfg Config) bool {
	cfg = cfg.withDefaults()
	if cfg == m.cfg && m.pending == nil {
		return false
	}
	if m.state == Up && m.poll {
		// One change at a time: this one follows the running sequence's
		// Final (the remote may have taken the first one's values already).
		m.pending = &cfg
		return false
	}
	old := m.cfg
	m.cfg, m.pending = cfg, nil
	if m.state != Up || cfg == old {
		return false
	}
	m.pollTx, m.pollRx = m.desiredTx, old.RequiredMinRx
	m.desiredTx, m.poll = cfg.DesiredMinTx, true
	return true
}

// txInterval is the time to the next periodic packet, jittered (§6.8.7);
// 0 means: send nothing periodically (the remote asked for no packets).
func (m *machine) txInterval() time.Duration {
	base := m.txBase()
	if base == 0 {
		return 0
	}
	lo, span := 0.75, 0.25
	if m.cfg.DetectMult == 1 {
		span = 0.15
	}
	return time.Duration(float64(base) * (lo + rand.Float64()*span))
}

// packet is what to send now; sending clears a pending Final.
func (m *machine) packet() Packet {
	p := Packet{
		Diag: m.diag, State: m.state, Poll: m.poll && !m.final, Final: m.final,
		DetectMult: m.cfg.DetectMult, MyDiscr: m.localDiscr, YourDiscr: m.remoteDiscr,
		DesiredMinTx: m.desiredTx, RequiredMinRx: m.cfg.RequiredMinRx,
	}
	m.final = false
	return p
}

// shutdown moves to AdminDown (a planned stop): the remote must not take
// it as a failure (RFC 5882 §3.2).
func (m *machine) shutdown() {
	m.state, m.diag, m.adminDown = AdminDown, DiagAdminDown, true
}
