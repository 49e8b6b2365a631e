package bgp

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Unnumbered peers: GoBGP resolves the link-local address of the peer on
// an interface once, at AddPeer, and keeps dialling that address. A ToR
// that is replaced (new hardware, new link-local address) would never be
// peered again. relink watches for it: a session down for relinkAfter
// whose resolved neighbour no longer answers while another link-local
// neighbour on the link does is deleted and added again, which resolves
// the link afresh.
//
// A link whose carrier just came back (carrier.go) is looked at sooner:
// for relinkFastFor, every relinkFastEvery, without waiting relinkAfter.
const (
	relinkAfter     = 5 * time.Second
	relinkEvery     = 2 * time.Second
	relinkFastFor   = 15 * time.Second
	relinkFastEvery = 500 * time.Millisecond
)

// Neighbour is a link-local neighbour on an interface, as the kernel's
// neighbour table has it.
type Neighbour struct {
	Addr netip.Addr // without zone
	// Reachable: confirmed recently. Failed: the kernel's probes failed
	// (or never completed). Neither: stale, not known either way.
	Reachable, Failed bool
}

// Neighbours is the kernel's neighbour table as relink uses it.
type Neighbours interface {
	// Solicit makes every neighbour on the link answer (an all-nodes
	// ping), so a new one enters the table.
	Solicit(iface string) error
	// LinkLocal lists the link-local neighbours on iface (not our own).
	LinkLocal(iface string) ([]Neighbour, error)
	// Answers pings addr on iface and tells whether it replied in time.
	Answers(iface string, addr netip.Addr, timeout time.Duration) bool
	// Forget removes a dead neighbour, so GoBGP's resolution (which wants
	// exactly one live link-local neighbour) finds the new one.
	Forget(iface string, addr netip.Addr) error
}

type kernelNeighbours struct{}

func (kernelNeighbours) Solicit(iface string) error { return SolicitNeighbors(iface) }

func (kernelNeighbours) LinkLocal(iface string) ([]Neighbour, error) {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, err
	}
	own := map[netip.Addr]bool{}
	if addrs, err := ifi.Addrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					own[ip.Unmap()] = true
				}
			}
		}
	}
	neighs, err := netlink.NeighList(ifi.Index, netlink.FAMILY_V6)
	if err != nil {
		return nil, err
	}
	var out []Neighbour
	for _, n := range neighs {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || !ip.IsLinkLocalUnicast() || own[ip] {
			continue
		}
		out = append(out, Neighbour{Addr: ip,
			Reachable: n.State&(netlink.NUD_REACHABLE|netlink.NUD_PERMANENT) != 0,
			Failed:    n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) != 0})
	}
	return out, nil
}

func (kernelNeighbours) Answers(iface string, addr netip.Addr, timeout time.Duration) bool {
	return pingOnce(iface, addr, timeout) == nil
}

func (kernelNeighbours) Forget(iface string, addr netip.Addr) error {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return err
	}
	return netlink.NeighDel(&netlink.Neigh{LinkIndex: ifi.Index, Family: netlink.FAMILY_V6, IP: addr.AsSlice()})
}

// relinkCheck is one unnumbered peer to look at, taken under the lock.
type relinkCheck struct {
	key, iface string
	addr       netip.Addr // as GoBGP keys the peer (with zone)
}

// relink checks every unnumbered peer whose session has been down for
// relinkAfter, or whose link's carrier came back within relinkFastFor. Run's goroutine; it takes s.mu itself (the probe waits).
func (s *Speaker) relink(ctx context.Context, now time.Time) {
	s.mu.Lock()
	var checks []relinkCheck
	for key, p := range s.peers {
		if p.spec.Interface != "" && p.added && p.apiAddr.IsValid() && p.state != bgp.BGP_FSM_ESTABLISHED &&
			(now.Sub(p.since) >= relinkAfter || now.Before(s.fastRelink[p.spec.Interface])) {
			checks = append(checks, relinkCheck{key, p.spec.Interface, p.apiAddr})
		}
	}
	s.mu.Unlock()
	for _, c := range checks {
		old := c.addr.WithZone("")
		neighs, err := s.neigh.LinkLocal(c.iface)
		if err != nil {
			s.log.Debug("bgp: unnumbered: neighbour table", "interface", c.iface, "err", err)
			continue
		}
		var other netip.Addr
		oldReachable := false
		for _, n := range neighs {
			switch {
			case n.Addr == old:
				oldReachable = n.Reachable
			case !n.Failed:
				other = n.Addr
			}
		}
		if !other.IsValid() {
			// No one else on the link (yet): make a new ToR known.
			if err := s.neigh.Solicit(c.iface); err != nil {
				s.log.Debug("bgp: unnumbered: solicit", "interface", c.iface, "err", err)
			}
			continue
		}
		// Someone else answers on the link. The old neighbour may still be
		// there (the session is down for another reason): ask it.
		if oldReachable || s.neigh.Answers(c.iface, old, time.Second) {
			continue
		}
		s.mu.Lock()
		if p := s.peers[c.key]; p != nil && p.added && p.apiAddr == c.addr && p.state != bgp.BGP_FSM_ESTABLISHED {
			s.repeerLocked(ctx, c.key, p, old, other, now)
		}
		s.mu.Unlock()
	}
}

// repeerLocked deletes an unnumbered peer whose neighbour is gone, for
// syncPeers to add it again: GoBGP then resolves the link anew.
func (s *Speaker) repeerLocked(ctx context.Context, key string, p *peer, old, other netip.Addr, now time.Time) {
	iface := p.spec.Interface
	s.log.Warn("bgp: unnumbered peer's link-local neighbour changed (ToR replaced?); peering with the new one",
		"peer", key, "interface", iface, "old", old, "new", other)
	if err := s.neigh.Forget(iface, old); err != nil {
		s.log.Debug("bgp: unnumbered: forget the old neighbour", "interface", iface, "addr", old, "err", err)
	}
	if err := s.readdLocked(ctx, key, p); err != nil {
		s.log.Warn("bgp: unnumbered: re-add peer", "peer", key, "err", err)
		return
	}
	p.apiAddr, p.local = netip.Addr{}, netip.Addr{} // resolved again
	p.state, p.since = bgp.BGP_FSM_IDLE, now
}
