package bfd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ControlPort is the single-hop BFD Control port (RFC 5881 §4).
const ControlPort = 3784

// Peer is a session the manager should run.
type Peer struct {
	Key    string     // the BGP peer's key (flock's name for it)
	Remote netip.Addr // with the interface as zone for a link-local peer
	Local  netip.Addr // source address; unspecified: the kernel's choice
	Config Config
}

// Event is a session state change.
type Event struct {
	Key         string
	From, To    State
	Diag        Diag  // our diagnostic (why we left Up)
	RemoteState State // AdminDown: the remote stopped on purpose (RFC 5882 §3.2)
	RemoteDiag  Diag
}

// Status is a session as flockctl shows it.
type Status struct {
	State       State
	Diag        Diag
	RemoteState State
	// RemoteControlPlaneIndependent: the remote's C bit.
	RemoteControlPlaneIndependent bool
	Since                         time.Time
	// SocketFailures counts failed opens of the session's sending socket
	// (each retried, with backoff); SocketError is the last one's error
	// while the socket is not open.
	SocketFailures int
	SocketError    string
}

// Backoff of a session whose sending socket cannot be opened (a local
// address not configured yet, or still tentative).
const (
	openRetryMin = 100 * time.Millisecond
	openRetryMax = 10 * time.Second
)

// Manager runs the BFD sessions of one node.
type Manager struct {
	// Port listened on and sent to (ControlPort unless a test says so).
	Port, PeerPort int
	Log            *slog.Logger
	// OnChange sees every state change, from the session's goroutine.
	OnChange func(Event)
	// open opens a session's sending socket (nil: dial); tests inject
	// failures and capture packets through it.
	open func(Peer) (conn, error)

	mu       sync.Mutex
	sessions map[string]*session // by Key
	byDiscr  map[uint32]*session
	ctx      context.Context // Run's, for the sessions it starts
}

// conn is a session's sending socket.
type conn interface {
	WriteToUDP(b []byte, addr *net.UDPAddr) (int, error)
	Close() error
}

type session struct {
	peer     Peer
	m        *machine
	rx       chan rxPacket
	shutdown chan time.Duration
	reconf   chan Config // new timing for a running session (buffer 1: the latest wins)
	cancel   context.CancelFunc
	done     chan struct{}

	mu     sync.Mutex // guards status
	status Status
}

type rxPacket struct {
	p   Packet
	at  time.Time
	src netip.Addr
}

func (m *Manager) log() *slog.Logger {
	if m.Log != nil {
		return m.Log
	}
	return slog.Default()
}

// Run receives BFD Control packets until ctx ends; sessions set before or
// after it starts run under it. It returns an error only if it cannot
// listen at all.
func (m *Manager) Run(ctx context.Context) error {
	port := m.Port
	if port == 0 {
		port = ControlPort
	}
	c4, err4 := net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", port))
	c6, err6 := net.ListenPacket("udp6", fmt.Sprintf("[::]:%d", port))
	if err4 != nil && err6 != nil {
		return fmt.Errorf("bfd: listen on port %d: %w", port, errors.Join(err4, err6))
	}
	var wg sync.WaitGroup
	if err4 == nil {
		p := ipv4.NewPacketConn(c4)
		if err := p.SetControlMessage(ipv4.FlagTTL|ipv4.FlagInterface, true); err != nil {
			m.log().Warn("bfd: IPv4 control messages", "err", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.read4(p)
		}()
	}
	if err6 == nil {
		p := ipv6.NewPacketConn(c6)
		if err := p.SetControlMessage(ipv6.FlagHopLimit|ipv6.FlagInterface, true); err != nil {
			m.log().Warn("bfd: IPv6 control messages", "err", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.read6(p)
		}()
	}
	m.startSessions(ctx)
	<-ctx.Done()
	if c4 != nil {
		c4.Close()
	}
	if c6 != nil {
		c6.Close()
	}
	wg.Wait()
	m.stopSessions()
	return nil
}

// startSessions runs the sessions set so far, and those set later, under
// ctx: Run's, or a test's that feeds packets to dispatch without sockets.
func (m *Manager) startSessions(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ctx = ctx
	for _, s := range m.sessions {
		if s.cancel == nil {
			m.startLocked(ctx, s)
		}
	}
}

// stopSessions ends the sessions' goroutines (without AdminDown: Run's
// context ended) and waits for them.
func (m *Manager) stopSessions() {
	m.mu.Lock()
	var all []runHandle
	for _, s := range m.sessions {
		all = append(all, s.handleLocked())
	}
	m.ctx = nil
	m.mu.Unlock()
	for _, h := range all {
		h.stop()
	}
}

func (m *Manager) read4(p *ipv4.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, cm, src, err := p.ReadFrom(buf)
		if err != nil {
			return
		}
		// GTSM (RFC 5881 §5): a single-hop packet arrives with TTL 255.
		if cm == nil || cm.TTL != 255 {
			continue
		}
		m.dispatch(buf[:n], src, cm.IfIndex)
	}
}

func (m *Manager) read6(p *ipv6.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, cm, src, err := p.ReadFrom(buf)
		if err != nil {
			return
		}
		if cm == nil || cm.HopLimit != 255 {
			continue
		}
		m.dispatch(buf[:n], src, cm.IfIndex)
	}
}

// dispatch selects the session of a packet (RFC 5880 §6.8.6): by Your
// Discriminator, or — when it is zero, in a Down or AdminDown packet — by
// the source address (and interface, for a link-local one).
func (m *Manager) dispatch(b []byte, from net.Addr, ifIndex int) {
	p, err := Unmarshal(b)
	if err != nil {
		return
	}
	ua, ok := from.(*net.UDPAddr)
	if !ok {
		return
	}
	src, _ := netip.AddrFromSlice(ua.IP)
	src = src.Unmap()
	if src.Is6() && src.IsLinkLocalUnicast() {
		if ifi, err := net.InterfaceByIndex(ifIndex); err == nil {
			src = src.WithZone(ifi.Name)
		}
	}
	m.mu.Lock()
	var s *session
	if p.YourDiscr != 0 {
		s = m.byDiscr[p.YourDiscr]
	} else if p.State == Down || p.State == AdminDown {
		for _, c := range m.sessions {
			if c.peer.Remote == src {
				s = c
				break
			}
		}
	}
	m.mu.Unlock()
	if s == nil {
		return
	}
	select {
	case s.rx <- rxPacket{p: p, at: time.Now(), src: src}:
	default: // the session is behind; BFD tolerates loss
	}
}

// Set makes the sessions match peers: new ones start, removed ones send
// AdminDown once and stop, ones whose addresses changed restart, and a
// running one whose timing changed announces it with a Poll Sequence.
func (m *Manager) Set(peers []Peer) {
	want := map[string]Peer{}
	for _, p := range peers {
		p.Config = p.Config.withDefaults()
		want[p.Key] = p
	}
	m.mu.Lock()
	var stop []runHandle
	for k, s := range m.sessions {
		p, ok := want[k]
		if ok && p.Remote == s.peer.Remote && p.Local == s.peer.Local && s.done != nil {
			if p.Config != s.peer.Config {
				// Same session, new timing: announced with a Poll Sequence
				// (RFC 5880 §6.8.3), never by taking the session down.
				s.peer.Config = p.Config
				select {
				case <-s.reconf:
				default:
				}
				s.reconf <- p.Config
			}
			continue
		}
		stop = append(stop, s.handleLocked())
		delete(m.sessions, k)
		delete(m.byDiscr, s.m.localDiscr)
	}
	for k, p := range want {
		if _, ok := m.sessions[k]; ok {
			continue
		}
		if m.sessions == nil {
			m.sessions, m.byDiscr = map[string]*session{}, map[uint32]*session{}
		}
		s := &session{peer: p, rx: make(chan rxPacket, 16), shutdown: make(chan time.Duration), reconf: make(chan Config, 1), status: Status{State: Down, RemoteState: Down, Since: time.Now()}}
		s.m = newMachine(p.Config, m.newDiscrLocked())
		m.sessions[k], m.byDiscr[s.m.localDiscr] = s, s
		if m.ctx != nil {
			m.startLocked(m.ctx, s)
		}
	}
	m.mu.Unlock()
	for _, h := range stop {
		h.adminDown(0) // the remote learns it was deliberate, not a failure
	}
}

func (m *Manager) newDiscrLocked() uint32 {
	for {
		d := rand.Uint32()
		if _, taken := m.byDiscr[d]; d != 0 && !taken {
			return d
		}
	}
}

// Status returns a session's status.
func (m *Manager) Status(key string) (Status, bool) {
	m.mu.Lock()
	s := m.sessions[key]
	m.mu.Unlock()
	if s == nil {
		return Status{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status, true
}

// Keys lists the sessions, sorted.
func (m *Manager) Keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.sessions))
	for k := range m.sessions {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Shutdown tells every remote that the sessions go down on purpose
// (AdminDown, RFC 5882 §3.2: not a failure), a few times over d, and stops
// the sessions. The agent calls it on a planned stop.
func (m *Manager) Shutdown(d time.Duration) {
	m.mu.Lock()
	var all []runHandle
	for _, s := range m.sessions {
		all = append(all, s.handleLocked())
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, h := range all {
		wg.Go(func() { h.adminDown(d) })
	}
	wg.Wait()
}

func (m *Manager) startLocked(ctx context.Context, s *session) {
	sctx, cancel := context.WithCancel(ctx)
	s.cancel, s.done = cancel, make(chan struct{})
	p := s.peer // Set changes s.peer.Config under m.mu
	go func() {
		defer close(s.done)
		if c := m.openSocket(sctx, s, p); c != nil {
			m.runSession(sctx, s, c)
		}
	}()
}

// openSocket opens the session's sending socket, retrying with backoff
// until it opens; nil: ctx ended or the session was stopped first.
func (m *Manager) openSocket(ctx context.Context, s *session, p Peer) conn {
	open := m.open
	if open == nil {
		open = m.dial
	}
	wait := openRetryMin
	for {
		c, err := open(p)
		s.mu.Lock()
		if err != nil {
			s.status.SocketFailures++
			s.status.SocketError = err.Error()
		} else {
			s.status.SocketError = ""
		}
		failures := s.status.SocketFailures
		s.mu.Unlock()
		if err == nil {
			if failures > 0 {
				m.log().Info("bfd: the session's socket is open", "peer", p.Key, "remote", p.Remote, "failures", failures)
			}
			return c
		}
		m.log().Warn("bfd: cannot open the session's socket; retrying", "peer", p.Key, "remote", p.Remote, "err", err, "failures", failures, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-s.shutdown:
			// A planned stop or the peer's removal: AdminDown, with no
			// socket to tell the remote.
			t.Stop()
			from := s.m.state
			s.m.shutdown()
			m.notify(s, from, DiagNone)
			return nil
		case <-t.C:
		}
		wait = min(2*wait, openRetryMax)
	}
}

// dial opens a session's sending socket: a source port of its own in
// 49152–65535 and TTL / hop limit 255 (RFC 5881 §4, §5).
func (m *Manager) dial(p Peer) (conn, error) {
	network := "udp4"
	local := p.Local
	if p.Remote.Is6() {
		network = "udp6"
		if !local.IsValid() {
			local = netip.IPv6Unspecified()
		}
	} else if !local.IsValid() {
		local = netip.IPv4Unspecified()
	}
	if local.Is6() && local.IsLinkLocalUnicast() && local.Zone() == "" {
		local = local.WithZone(p.Remote.Zone())
	}
	var lastErr error
	for range 20 {
		port := 49152 + rand.IntN(65536-49152)
		c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, uint16(port))))
		if err != nil {
			lastErr = err
			continue
		}
		if p.Remote.Is6() {
			err = ipv6.NewConn(c).SetHopLimit(255)
		} else {
			err = ipv4.NewConn(c).SetTTL(255)
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("bfd: TTL 255 on the socket to %v: %w", p.Remote, err)
		}
		return c, nil
	}
	return nil, lastErr
}

// runHandle is how to stop a session's goroutine, read under m.mu (Run
// starts goroutines, and so writes these, while Set and Shutdown stop
// them).
type runHandle struct {
	cancel   context.CancelFunc // nil: never started
	done     chan struct{}
	shutdown chan time.Duration
}

func (s *session) handleLocked() runHandle {
	return runHandle{cancel: s.cancel, done: s.done, shutdown: s.shutdown}
}

func (h runHandle) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	<-h.done
}

func (h runHandle) adminDown(d time.Duration) {
	if h.cancel == nil {
		return
	}
	select {
	case h.shutdown <- d:
	case <-h.done:
	}
	<-h.done
}

// notify records a state change of the session's and reports it.
func (m *Manager) notify(s *session, from State, remoteDiag Diag) {
	to := s.m.state
	s.mu.Lock()
	s.status.State, s.status.Diag, s.status.Since = to, s.m.diag, time.Now()
	s.status.RemoteState, s.status.RemoteControlPlaneIndependent = s.m.remoteState, s.m.remoteCPI
	s.mu.Unlock()
	m.log().Info("bfd: session state", "peer", s.peer.Key, "remote", s.peer.Remote, "from", from, "to", to, "diag", s.m.diag, "remoteDiag", remoteDiag)
	if m.OnChange != nil {
		m.OnChange(Event{Key: s.peer.Key, From: from, To: to, Diag: s.m.diag, RemoteState: s.m.remoteState, RemoteDiag: remoteDiag})
	}
}

func (m *Manager) runSession(ctx context.Context, s *session, c conn) {
	defer c.Close()
	peerPort := m.PeerPort
	if peerPort == 0 {
		peerPort = ControlPort
	}
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.peer.Remote, uint16(peerPort)))
	send := func() {
		_, _ = c.WriteToUDP(s.m.packet().Marshal(), dst)
	}
	tx := time.NewTimer(0)
	defer tx.Stop()
	// rearm schedules the next periodic packet, or none while the remote
	// wants none (its Required Min RX is 0): its next packet re-arms.
	rearm := func() {
		if iv := s.m.txInterval(); iv > 0 {
			tx.Reset(iv)
		} else {
			tx.Stop()
		}
	}
	detect := time.NewTicker(25 * time.Millisecond)
	defer detect.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-s.shutdown: // a planned stop: AdminDown, a few times
			from := s.m.state
			s.m.shutdown()
			m.notify(s, from, DiagNone)
			for i := range 3 {
				send()
				if i < 2 {
					time.Sleep(d / 3)
				}
			}
			return
		case r := <-s.rx:
			from, base, oldRemote := s.m.state, s.m.txBase(), s.m.remoteDiscr
			// A remote that re-created its session (new discriminator)
			// has to hear our state with its new discriminator before it
			// can move: answer at once rather than at the next slow-rate
			// packet up to a second later (FRR re-creates a session just
			// after creating it when bgpd applies a profile).
			renewed := r.p.MyDiscr != oldRemote
			if s.m.receive(r.p, r.at) {
				m.notify(s, from, r.p.Diag)
				send() // a state change goes out at once
			} else if r.p.Poll || (renewed && s.m.state != AdminDown) {
				send()
			}
			// A new rate (ours after a state change, or the remote asking
			// for packets more often, or for none, or for some again)
			// applies from now: a timer armed at the old, slower rate
			// would leave a gap longer than the remote's new detection
			// time.
			if s.m.txBase() != base {
				rearm()
			}
			s.mu.Lock()
			s.status.RemoteState = s.m.remoteState
			s.status.RemoteControlPlaneIndependent = s.m.remoteCPI
			s.mu.Unlock()
		case cfg := <-s.reconf:
			base := s.m.txBase()
			if s.m.reconfigure(cfg) {
				send() // the Poll goes out at once
			}
			if s.m.txBase() != base {
				rearm()
			}
		case now := <-detect.C:
			from, base := s.m.state, s.m.txBase()
			if s.m.expire(now) {
				m.notify(s, from, DiagNone)
				send()
			}
			if s.m.txBase() != base { // the slow rate, or a forgotten remote's silence lifted
				rearm()
			}
		case <-tx.C:
			if s.m.state != AdminDown {
				send()
			}
			rearm()
		}
	}
}
