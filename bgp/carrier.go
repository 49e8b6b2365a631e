package bgp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// An unnumbered peer lives on one link, so the link's carrier says what
// the session cannot yet: when it goes, the ToR is gone (the hold timer
// would take its 9 s or more to agree), and when it comes back, perhaps
// with another ToR behind it. The speaker acts on both at once, as FRR's
// fast-external-failover and BIRD's `check link` do: carrier down drops
// the session (the routes through the dead link with it) and forgets the
// link's neighbours; carrier up asks who is on the link and adds the peer
// again straight away, resolving whoever answers.

// Carrier is one interface's carrier, as it changes.
type Carrier struct {
	Iface string
	Up    bool
}

// Links reports carrier changes.
type Links interface {
	// Watch sends an interface's carrier when it changes (not the
	// states found at the start), until ctx ends; it then closes the
	// channel.
	Watch(ctx context.Context) (<-chan Carrier, error)
}

// kernelLinks reads the kernel's link notifications from a netlink socket
// of its own, blocking with a timeout so it sees ctx end. (netlink's
// LinkSubscribe gave up on its first empty read when started in a
// network namespace: its non-blocking socket returned EAGAIN.)
type kernelLinks struct{}

func (kernelLinks) Watch(ctx context.Context) (<-chan Carrier, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	fail := func(what string, err error) (<-chan Carrier, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink %s: %w", what, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_LINK - 1)}); err != nil {
		return fail("bind", err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000}); err != nil {
		return fail("receive timeout", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	// The links as they are now: their states, not changes.
	dump := make([]byte, unix.SizeofNlMsghdr+unix.SizeofIfInfomsg)
	*(*unix.NlMsghdr)(unsafe.Pointer(&dump[0])) = unix.NlMsghdr{Len: uint32(len(dump)), Type: unix.RTM_GETLINK, Flags: unix.NLM_F_REQUEST | unix.NLM_F_DUMP, Seq: 1}
	if err := unix.Sendto(fd, dump, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fail("dump links", err)
	}
	out := make(chan Carrier, 16)
	go func() {
		defer close(out)
		defer unix.Close(fd)
		last := map[string]linkState{}
		buf := make([]byte, 1<<16)
		for ctx.Err() == nil {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue // the timeout: look at ctx
				}
				if errors.Is(err, unix.ENOBUFS) {
					continue // notifications lost; the next ones still come
				}
				return
			}
			msgs, err := syscall.ParseNetlinkMessage(buf[:n])
			if err != nil {
				continue
			}
			for _, m := range msgs {
				name, now, ok := linkStateOf(m)
				if !ok {
					continue
				}
				if m.Header.Type == unix.RTM_DELLINK {
					delete(last, name)
					continue
				}
				was, seen := last[name]
				last[name] = now
				if !seen {
					continue // a state, not a change
				}
				for _, c := range changes(name, was, now) {
					select {
					case out <- c:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return out, nil
}

// linkState is what a link message says of the carrier.
type linkState struct {
	up    bool   // IFF_UP and IFF_LOWER_UP
	downs uint32 // IFLA_CARRIER_DOWN_COUNT: carrier losses so far
}

// changes are the carrier changes from was to now. A loss and its return
// in quick succession (a ToR's port flapped, or replaced) can come as one
// message that is up as before: the count of losses tells.
func changes(name string, was, now linkState) []Carrier {
	switch {
	case was.up != now.up && now.downs != was.downs && now.up:
		return []Carrier{{name, false}, {name, true}}
	case was.up != now.up:
		return []Carrier{{name, now.up}}
	case now.downs != was.downs && now.up:
		return []Carrier{{name, false}, {name, true}}
	}
	return nil
}

// linkStateOf reads a link message: the link's name and carrier.
func linkStateOf(m syscall.NetlinkMessage) (string, linkState, bool) {
	if (m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK) || len(m.Data) < unix.SizeofIfInfomsg {
		return "", linkState{}, false
	}
	flags := binary.NativeEndian.Uint32(m.Data[8:12]) // ifi_flags
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil {
		return "", linkState{}, false
	}
	var name string
	st := linkState{up: flags&unix.IFF_UP != 0 && flags&unix.IFF_LOWER_UP != 0}
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFLA_IFNAME:
			name = strings.TrimRight(string(a.Value), "\x00")
		case unix.IFLA_CARRIER_DOWN_COUNT:
			if len(a.Value) >= 4 {
				st.downs = binary.NativeEndian.Uint32(a.Value[:4])
			}
		}
	}
	return name, st, name != ""
}

// linkUp is closed, and replaced, whenever a link's carrier comes up:
// the add goroutines of unnumbered peers wait on it beside their back-off.
type linkUp struct {
	mu sync.Mutex
	ch chan struct{}
}

func (l *linkUp) wait() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ch == nil {
		l.ch = make(chan struct{})
	}
	return l.ch
}

func (l *linkUp) signal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ch != nil {
		close(l.ch)
	}
	l.ch = make(chan struct{})
}

// handleCarrier acts on a carrier change of the unnumbered peers' links.
// Run's goroutine.
func (s *Speaker) handleCarrier(ctx context.Context, c Carrier, now time.Time) {
	s.mu.Lock()
	s.linkDown[c.Iface] = !c.Up
	if c.Up {
		delete(s.linkDown, c.Iface)
	}
	var forget []netip.Addr
	unnumbered := false
	for key, p := range s.peers {
		if p.spec.Interface != c.Iface {
			continue
		}
		unnumbered = true
		if !p.added || (c.Up && p.state == bgp.BGP_FSM_ESTABLISHED) {
			continue
		}
		// Carrier lost: the session and what it taught us go now, and the
		// peer is added again (resolving the link afresh) once someone
		// answers on it. Carrier back while the peer is added but not
		// established (the loss went unseen): resolve afresh too.
		old := p.apiAddr.WithZone("")
		if c.Up {
			s.log.Info("bgp: unnumbered peer's link has its carrier back, session down; resolving the link again",
				"peer", key, "interface", c.Iface, "neighbour", old)
		} else {
			s.log.Warn("bgp: unnumbered peer's link lost its carrier; session dropped until the link is back",
				"peer", key, "interface", c.Iface, "neighbour", old, "was", p.state.String())
		}
		if old.IsValid() && !c.Up {
			forget = append(forget, old)
		}
		if err := s.readdLocked(ctx, key, p); err != nil {
			s.log.Warn("bgp: unnumbered: drop the session", "peer", key, "err", err)
			continue
		}
		p.apiAddr, p.local = netip.Addr{}, netip.Addr{}
		p.state, p.since = bgp.BGP_FSM_IDLE, now
	}
	s.mu.Unlock()
	if !unnumbered {
		return
	}
	for _, a := range forget {
		// The kernel flushes a link's neighbours with its carrier; should
		// it not, a stale one would make two answers on the link, and
		// GoBGP resolves only one.
		if err := s.neigh.Forget(c.Iface, a); err != nil {
			s.log.Debug("bgp: unnumbered: forget the neighbour", "interface", c.Iface, "addr", a, "err", err)
		}
	}
	if c.Up {
		s.log.Info("bgp: unnumbered peer's link has its carrier; asking who is on it", "interface", c.Iface)
		// A neighbour being resolved, or that failed to be, counts for
		// GoBGP as one on the link: the old ToR's, made again by our own
		// last packets to it, would be resolved instead of the new one.
		s.forgetFailed(c.Iface)
		s.mu.Lock()
		s.fastRelink[c.Iface] = now.Add(relinkFastFor)
		s.mu.Unlock()
		if err := s.neigh.Solicit(c.Iface); err != nil {
			s.log.Debug("bgp: unnumbered: solicit", "interface", c.Iface, "err", err)
		}
		s.linkUp.signal()
	}
}

// relinkingFast tells whether some link's carrier came back within
// relinkFastFor (forgetting the links whose window has passed).
func (s *Speaker) relinkingFast(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for iface, until := range s.fastRelink {
		if !now.Before(until) {
			delete(s.fastRelink, iface)
		}
	}
	return len(s.fastRelink) > 0
}

// carrierLost tells whether iface's carrier was last seen lost.
func (s *Speaker) carrierLost(iface string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.linkDown[iface]
}

// forgetFailed removes the link-local neighbours on iface being resolved
// or failed: GoBGP takes any of them for a neighbour on the link.
func (s *Speaker) forgetFailed(iface string) {
	neighs, err := s.neigh.LinkLocal(iface)
	if err != nil {
		return
	}
	for _, n := range neighs {
		if n.Failed {
			_ = s.neigh.Forget(iface, n.Addr)
		}
	}
}
