// Package verdicts compiles what kube-network-policies decides for a
// packet into a program the kernel can run: sets of addresses and ports,
// and per pod the terms any of which lets a packet pass. The engine stays
// the judge: Program.Allows must equal its evaluatePacket for every packet
// it would queue (the differential tests hold the two side by side), so
// the compiler mirrors the engine's reading of a policy, quirks included,
// and names each quirk where it copies one.
package verdicts

import (
	"net/netip"
	"slices"
)

// Packet is what a verdict depends on. Proto is the IP protocol number;
// ports are 0 unless it is TCP, UDP or SCTP (as the engine parses them).
type Packet struct {
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
}

// Program is the compiled verdict of every packet the engine would judge
// on this node.
type Program struct {
	// Selected are the addresses of this node's pods that some
	// NetworkPolicy selects (the engine's podips sets): a packet from or
	// to one is judged; every other packet passes.
	Selected map[netip.Addr]bool
	// Egress lists, by source address, the groups that must all let a
	// judged packet out; Ingress, by destination address, those that
	// must all let it in. An address whose pods no policy isolates in
	// that direction has none.
	Egress, Ingress map[netip.Addr][]int
	Groups          []*Group
	// Queued, with the admin policies on (Input.Admin), are the
	// addresses of the pods an admin policy applies to: a packet from or
	// to one goes to the engine (NFQUEUE), which decides it. Nil without
	// them.
	Queued map[netip.Addr]bool
	// peerSets are the terms' sets of peers of the groups built for
	// every peer (those of this node's pods), each Addrs's id its index
	// plus one; peerFrom the rules each holds the peers of (nil: not
	// known). A change of a pod elsewhere that is such a peer changes
	// them and nothing else of the groups (Deps.Dispatch).
	peerSets []*Addrs
	peerFrom [][]peerSource
}

// Queues reports whether k goes to the engine rather than being decided
// by the program.
func (p *Program) Queues(k Packet) bool {
	return p.Queued[k.Src] || p.Queued[k.Dst]
}

// Group is the verdict of one set of policies for a pod in one
// direction: a packet passes if one of its terms matches it, the peer
// being the packet's other end.
type Group struct {
	// Key says what it stands for: direction, namespace, the policies,
	// and the pod when named ports are resolved on it.
	Key string
	// Egress: the peer is the packet's destination (else its source).
	Egress bool
	Terms  []Term
	// Several are peers that several pods hold (an anycast address): the
	// engine lets a packet pass only if it passes for each of them, so
	// what they allow together is compiled per address and decides
	// alone for it.
	Several map[netip.Addr]Ports
}

// Term matches a packet whose peer is in Peers (nil: any) and whose
// protocol and port are in Ports; or, when Named is set, whose peer,
// protocol and port are one of Named (egress named ports, resolved on
// each destination pod).
type Term struct {
	Peers *Addrs
	Ports Ports
	Named []PeerPort
}

// PeerPort is a port of one peer address.
type PeerPort struct {
	Addr  netip.Addr
	Proto uint8
	Port  uint16
}

// Allows is the program's verdict for k.
func (p *Program) Allows(k Packet) bool {
	if !p.Selected[k.Src] && !p.Selected[k.Dst] {
		return true
	}
	for _, g := range p.Egress[k.Src] {
		if !p.Groups[g].allows(k.Dst, k) {
			return false
		}
	}
	for _, g := range p.Ingress[k.Dst] {
		if !p.Groups[g].allows(k.Src, k) {
			return false
		}
	}
	return true
}

func (g *Group) allows(peer netip.Addr, k Packet) bool {
	if ports, ok := g.Several[peer]; ok {
		return ports.Has(k.Proto, k.DstPort)
	}
	for _, t := range g.Terms {
		if t.Named != nil {
			if slices.Contains(t.Named, PeerPort{peer, k.Proto, k.DstPort}) {
				return true
			}
			continue
		}
		if (t.Peers == nil || t.Peers.Contains(peer)) && t.Ports.Has(k.Proto, k.DstPort) {
			return true
		}
	}
	return false
}
