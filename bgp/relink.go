package bgp

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Unnumbered peers: GoBGP resolves the link-local address of the peer on
// an interface once, at AddPeer, and keeps dialling that address. A ToR
// that is replaced (new hardware, new link-local address) would never be
// peered again. relink watches for it: a session down for relinkAfter
// whose resolved neighbour no longer answers while another link-local
// neighbour on the link does is deleted and added again, which resolves
// the link afresh.
const (
	relinkAfter = 5 * time.Second
	relinkEvery = 2 * time.Second
)

// Neighbour is a link-local neighbour on an interface, as the kernel's
// neighbour table has it.
type Neighbour struct {
	Addr netip.Addr // without zone
	// Alive: reachable, or not yet proven unreachable (stale, delay,
	// probe, permanent); false once the kernel's probes failed.
	Alive bool
}

// Neighbours is the kernel's neighbour table as relink uses it.
type Neighbours interface {
	// Solicit makes every neighbour on the link answer (an all-nodes
	// ping), so a new one enters the table.
	Solicit(iface string) error
	// LinkLocal lists the link-local neighbours on iface (not our own).
	LinkLocal(iface string) ([]Neighbour, error)
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
		dead := n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) != 0
		out = append(out, Neighbour{Addr: ip, Alive: !dead})
	}
	return out, nil
}

func (kernelNeighbours) Forget(iface string, addr netip.Addr) error {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return err
	}
	return netlink.NeighDel(&netlink.Neigh{LinkIndex: ifi.Index, Family: netlink.FAMILY_V6, IP: addr.AsSlice()})
}

// relinkLocked checks every unnumbered peer whose session has been down
// for relinkAfter. Run's goroutine.
func (s *Speaker) relinkLocked(ctx context.Context, now time.Time) {
	for key, p := range s.peers {
		if p.spec.Interface == "" || !p.added || !p.apiAddr.IsValid() || p.state == bgp.BGP_FSM_ESTABLISHED || now.Sub(p.since) < relinkAfter {
			continue
		}
		iface, old := p.spec.Interface, p.apiAddr.WithZone("")
		neighs, err := s.neigh.LinkLocal(iface)
		if err != nil {
			s.log.Debug("bgp: unnumbered: neighbour table", "interface", iface, "err", err)
			continue
		}
		oldAlive, other := false, netip.Addr{}
		for _, n := range neighs {
			switch {
			case n.Addr == old:
				oldAlive = n.Alive
			case n.Alive:
				other = n.Addr
			}
		}
		if oldAlive || !other.IsValid() {
			// The old neighbour may still answer (the session is down for
			// another reason), or no new one has answered yet: ask again.
			if err := s.neigh.Solicit(iface); err != nil {
				s.log.Debug("bgp: unnumbered: solicit", "interface", iface, "err", err)
			}
			continue
		}
		s.log.Warn("bgp: unnumbered peer's link-local neighbour changed (ToR replaced?); peering with the new one",
			"peer", key, "interface", iface, "old", old, "new", other)
		if err := s.neigh.Forget(iface, old); err != nil {
			s.log.Debug("bgp: unnumbered: forget the old neighbour", "interface", iface, "addr", old, "err", err)
		}
		if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: p.apiAddr.String()}); err != nil {
			s.log.Warn("bgp: unnumbered: delete peer", "peer", key, "err", err)
			continue
		}
		p.added, p.enabled, p.apiAddr, p.local = false, false, netip.Addr{}, netip.Addr{}
		p.restarting = false
		p.state, p.since = bgp.BGP_FSM_IDLE, now
		s.kick() // syncPeers adds it again: GoBGP resolves the link anew
	}
}
