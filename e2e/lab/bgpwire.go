package lab

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// bgpUpdate is the UPDATE message type (RFC 4271).
const bgpUpdate = 2

// Update is what one BGP UPDATE carries, decoded just far enough for
// latency figures: the prefixes announced and withdrawn (IPv4 and IPv6
// unicast, in the body or in MP_REACH/MP_UNREACH) and whether it is an
// End-of-RIB marker.
type Update struct {
	Announced, Withdrawn []netip.Prefix
	EoR                  bool
}

// ParseUpdate decodes the body of an UPDATE (after the 19-byte header).
// ADD-PATH is not supported (flock does not negotiate it).
func ParseUpdate(body []byte) (Update, error) {
	var u Update
	if len(body) < 4 {
		return u, errors.New("update: short body")
	}
	wl := int(binary.BigEndian.Uint16(body))
	if 2+wl+2 > len(body) {
		return u, fmt.Errorf("update: withdrawn length %d exceeds body", wl)
	}
	w, err := parsePrefixes(body[2:2+wl], 4)
	if err != nil {
		return u, fmt.Errorf("update: withdrawn routes: %w", err)
	}
	u.Withdrawn = w
	al := int(binary.BigEndian.Uint16(body[2+wl:]))
	attrs := body[4+wl:]
	if al > len(attrs) {
		return u, fmt.Errorf("update: attribute length %d exceeds body", al)
	}
	nlri, err := parsePrefixes(attrs[al:], 4)
	if err != nil {
		return u, fmt.Errorf("update: nlri: %w", err)
	}
	u.Announced = nlri
	attrs = attrs[:al]
	mpEmpty := false
	for len(attrs) > 0 {
		if len(attrs) < 3 {
			return u, errors.New("update: truncated attribute")
		}
		flags, typ := attrs[0], attrs[1]
		hl, l := 3, int(attrs[2])
		if flags&0x10 != 0 {
			if len(attrs) < 4 {
				return u, errors.New("update: truncated attribute")
			}
			hl, l = 4, int(binary.BigEndian.Uint16(attrs[2:]))
		}
		if hl+l > len(attrs) {
			return u, fmt.Errorf("update: attribute %d length %d exceeds body", typ, l)
		}
		v := attrs[hl : hl+l]
		attrs = attrs[hl+l:]
		switch typ {
		case 14: // MP_REACH_NLRI
			if len(v) < 5 || 5+int(v[3]) > len(v) {
				return u, errors.New("update: short MP_REACH_NLRI")
			}
			fam, ok := afi(binary.BigEndian.Uint16(v), v[2])
			if !ok {
				continue
			}
			p, err := parsePrefixes(v[5+int(v[3]):], fam)
			if err != nil {
				return u, fmt.Errorf("update: MP_REACH_NLRI: %w", err)
			}
			u.Announced = append(u.Announced, p...)
		case 15: // MP_UNREACH_NLRI
			if len(v) < 3 {
				return u, errors.New("update: short MP_UNREACH_NLRI")
			}
			fam, ok := afi(binary.BigEndian.Uint16(v), v[2])
			if !ok {
				continue
			}
			p, err := parsePrefixes(v[3:], fam)
			if err != nil {
				return u, fmt.Errorf("update: MP_UNREACH_NLRI: %w", err)
			}
			mpEmpty = len(p) == 0
			u.Withdrawn = append(u.Withdrawn, p...)
		}
	}
	// RFC 4724: End-of-RIB is an empty UPDATE (IPv4) or one with nothing
	// but an empty MP_UNREACH_NLRI.
	u.EoR = len(u.Announced) == 0 && len(u.Withdrawn) == 0 && (al == 0 || mpEmpty)
	return u, nil
}

func afi(a uint16, safi byte) (int, bool) {
	switch {
	case a == 1 && safi == 1:
		return 4, true
	case a == 2 && safi == 1:
		return 6, true
	}
	return 0, false
}

func parsePrefixes(b []byte, fam int) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for len(b) > 0 {
		bits := int(b[0])
		n := (bits + 7) / 8
		if (fam == 4 && bits > 32) || (fam == 6 && bits > 128) || 1+n > len(b) {
			return nil, fmt.Errorf("bad prefix length %d", bits)
		}
		var a netip.Addr
		if fam == 4 {
			var x [4]byte
			copy(x[:], b[1:1+n])
			a = netip.AddrFrom4(x)
		} else {
			var x [16]byte
			copy(x[:], b[1:1+n])
			a = netip.AddrFrom16(x)
		}
		out = append(out, netip.PrefixFrom(a, bits))
		b = b[1+n:]
	}
	return out, nil
}

// WireEvent is one UPDATE seen on the wire.
type WireEvent struct {
	At time.Time
	Update
}

// BGPCapture records the UPDATEs a node sends, read from the ToR's side of
// the link with a packet socket: what a capture on the switch port shows,
// before the ToR's own processing.
type BGPCapture struct {
	fd      int
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	changed *sync.Cond
	events  []WireEvent
	// announced/withdrawn index the events by prefix: positions in events.
	byPrefix map[netip.Prefix][]int
	streams  map[string]*tcpStream
	errs     []error
}

type tcpStream struct {
	next   uint32
	synced bool // next is known
	buf    []byte
}

// CaptureBGP starts capturing on ifName inside ns, keeping BGP messages
// that arrive there (sent by the far end of the link).
func CaptureBGP(ns *NS, ifName string) (*BGPCapture, error) {
	c := newCapture()
	err := ns.InNS(func() error {
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		ifi, err := net.InterfaceByName(ifName)
		if err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to %s: %w", ifName, err)
		}
		// The initial table (10,000 routes) arrives as a burst.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
		tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return err
		}
		c.fd = fd
		return nil
	})
	if err != nil {
		return nil, err
	}
	go c.run()
	return c, nil
}

func newCapture() *BGPCapture {
	c := &BGPCapture{stop: make(chan struct{}), done: make(chan struct{}), byPrefix: map[netip.Prefix][]int{}, streams: map[string]*tcpStream{}}
	c.changed = sync.NewCond(&c.mu)
	return c
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Close stops the capture.
func (c *BGPCapture) Close() {
	close(c.stop)
	<-c.done
	unix.Close(c.fd)
}

func (c *BGPCapture) run() {
	defer close(c.done)
	buf := make([]byte, 1<<18)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			c.fail(fmt.Errorf("capture: %w", err))
			return
		}
		at := time.Now()
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue // what the ToR itself sends
		}
		c.packet(at, buf[:n])
	}
}

func (c *BGPCapture) fail(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
	c.changed.Broadcast()
}

// packet decodes Ethernet / IPv6 or IPv4 / TCP and feeds port-179 payload
// into its stream.
func (c *BGPCapture) packet(at time.Time, p []byte) {
	if len(p) < 14 {
		return
	}
	et := binary.BigEndian.Uint16(p[12:])
	p = p[14:]
	var src, dst []byte
	var tcp []byte
	switch et {
	case 0x86dd:
		if len(p) < 40 || p[6] != unix.IPPROTO_TCP {
			return
		}
		pl := int(binary.BigEndian.Uint16(p[4:]))
		if 40+pl > len(p) {
			pl = len(p) - 40 // GSO super-packets may carry 0
		}
		if pl == 0 {
			pl = len(p) - 40
		}
		src, dst, tcp = p[8:24], p[24:40], p[40:40+pl]
	case 0x0800:
		if len(p) < 20 || p[9] != unix.IPPROTO_TCP {
			return
		}
		ihl := int(p[0]&0x0f) * 4
		tl := int(binary.BigEndian.Uint16(p[2:]))
		if tl == 0 || tl > len(p) {
			tl = len(p)
		}
		if ihl < 20 || ihl > tl {
			return
		}
		src, dst, tcp = p[12:16], p[16:20], p[ihl:tl]
	default:
		return
	}
	if len(tcp) < 20 {
		return
	}
	sport, dport := binary.BigEndian.Uint16(tcp), binary.BigEndian.Uint16(tcp[2:])
	if sport != 179 && dport != 179 {
		return
	}
	seq := binary.BigEndian.Uint32(tcp[4:])
	off := int(tcp[12]>>4) * 4
	flags := tcp[13]
	if off < 20 || off > len(tcp) {
		return
	}
	key := fmt.Sprintf("%x/%d>%x/%d", src, sport, dst, dport)
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.streams[key]
	if s == nil || flags&0x02 != 0 { // SYN: a new connection
		s = &tcpStream{}
		c.streams[key] = s
		if flags&0x02 != 0 {
			s.next, s.synced = seq+1, true
			return
		}
	}
	data := tcp[off:]
	if len(data) == 0 {
		return
	}
	if !s.synced {
		s.next, s.synced = seq, true
		s.buf = nil
	}
	switch d := int32(seq - s.next); {
	case d < 0 && int(-d) >= len(data):
		return // retransmission
	case d < 0:
		data, seq = data[-d:], s.next
	case d > 0: // lost from the capture: resynchronise on a marker
		s.buf = nil
	}
	s.next = seq + uint32(len(data))
	s.buf = append(s.buf, data...)
	c.drain(at, s)
}

var marker = bytes.Repeat([]byte{0xff}, 16)

func (c *BGPCapture) drain(at time.Time, s *tcpStream) {
	for len(s.buf) >= 19 {
		if !bytes.Equal(s.buf[:16], marker) {
			i := bytes.Index(s.buf[1:], marker)
			if i < 0 {
				s.buf = s.buf[len(s.buf)-15:]
				return
			}
			s.buf = s.buf[1+i:]
			continue
		}
		l := int(binary.BigEndian.Uint16(s.buf[16:]))
		if l < 19 || l > 65535 {
			s.buf = s.buf[1:]
			continue
		}
		if len(s.buf) < l {
			return
		}
		if msg := s.buf[:l]; msg[18] == bgpUpdate {
			if u, err := ParseUpdate(msg[19:]); err != nil {
				c.errs = append(c.errs, err)
			} else {
				i := len(c.events)
				c.events = append(c.events, WireEvent{At: at, Update: u})
				for _, p := range slices.Concat(u.Announced, u.Withdrawn) {
					c.byPrefix[p] = append(c.byPrefix[p], i)
				}
			}
		}
		s.buf = s.buf[l:]
		c.changed.Broadcast()
	}
	if len(s.buf) == 0 {
		s.buf = nil // let a large burst's buffer go
	}
}

// Mark is a position in the capture: later queries look only at what
// arrived after it.
type Mark int

// Mark returns the current position.
func (c *BGPCapture) Mark() Mark {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Mark(len(c.events))
}

// WaitFor waits until an UPDATE after m announces (withdraw false) or
// withdraws p, and returns when it arrived.
func (c *BGPCapture) WaitFor(m Mark, p netip.Prefix, withdraw bool, timeout time.Duration) (time.Time, error) {
	var at time.Time
	c.mu.Lock()
	defer c.mu.Unlock()
	err := condWait(c.changed, timeout, func() (bool, error) {
		for _, i := range c.byPrefix[p] {
			if i < int(m) {
				continue
			}
			ev := c.events[i]
			list := ev.Announced
			if withdraw {
				list = ev.Withdrawn
			}
			if slices.Contains(list, p) {
				at = ev.At
				return true, nil
			}
		}
		return false, errors.Join(c.errs...)
	}, func() error {
		what := "announcement"
		if withdraw {
			what = "withdrawal"
		}
		return fmt.Errorf("no %s of %s on the wire within %s", what, p, timeout)
	})
	return at, err
}

// WireSummary is what arrived after a mark: distinct prefixes announced,
// prefixes withdrawn (each withdrawal counted), End-of-RIB markers, and when
// the last announcement arrived.
type WireSummary struct {
	Announced     int
	Withdrawn     int
	EoRs          int
	LastAnnounced time.Time
}

// Since summarises the UPDATEs after m.
func (c *BGPCapture) Since(m Mark) WireSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s WireSummary
	seen := map[netip.Prefix]bool{}
	for _, ev := range c.events[m:] {
		for _, p := range ev.Announced {
			if !seen[p] {
				seen[p] = true
				s.Announced++
			}
			s.LastAnnounced = ev.At
		}
		s.Withdrawn += len(ev.Withdrawn)
		if ev.EoR {
			s.EoRs++
		}
	}
	return s
}

// WaitAnnounced waits until at least n distinct prefixes were announced
// after m and returns when the last of them arrived.
func (c *BGPCapture) WaitAnnounced(m Mark, n int, timeout time.Duration) (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[netip.Prefix]bool{}
	next := int(m)
	var last time.Time
	err := condWait(c.changed, timeout, func() (bool, error) {
		for ; next < len(c.events); next++ {
			ev := c.events[next]
			for _, p := range ev.Announced {
				if !seen[p] {
					seen[p] = true
					last = ev.At
				}
			}
		}
		return len(seen) >= n, errors.Join(c.errs...)
	}, func() error {
		return fmt.Errorf("%d of %d prefixes announced on the wire within %s", len(seen), n, timeout)
	})
	return last, err
}

// condWait waits on c, whose lock the caller holds, until check reports
// done or an error, or timeout passes (then it returns timedOut()).
func condWait(c *sync.Cond, timeout time.Duration, check func() (bool, error), timedOut func() error) error {
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, c.Broadcast)
	defer t.Stop()
	for {
		if done, err := check(); done || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return timedOut()
		}
		c.Wait()
	}
}
