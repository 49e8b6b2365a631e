package verdicts

import (
	"slices"

	"golang.org/x/sys/unix"
)

// PortRange is the ports First through Last.
type PortRange struct{ First, Last uint16 }

// Ports is a set of (protocol, port): All, or port ranges per protocol.
// NetworkPolicy ports name TCP, UDP and SCTP only, so a packet of any
// other protocol is in the set only when All is.
type Ports struct {
	All bool
	// By protocol number (unix.IPPROTO_TCP, _UDP, _SCTP): sorted,
	// disjoint, non-adjacent.
	By map[uint8][]PortRange
}

// Protocols are the protocols a port names.
var Protocols = []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP}

// Has tells whether the set holds (proto, port).
func (p Ports) Has(proto uint8, port uint16) bool {
	if p.All {
		return true
	}
	for _, r := range p.By[proto] {
		if r.First <= port && port <= r.Last {
			return true
		}
	}
	return false
}

// Empty tells whether nothing is in the set.
func (p Ports) Empty() bool {
	if p.All {
		return false
	}
	for _, rs := range p.By {
		if len(rs) > 0 {
			return false
		}
	}
	return true
}

func (p *Ports) add(proto uint8, r PortRange) {
	if p.By == nil {
		p.By = map[uint8][]PortRange{}
	}
	p.By[proto] = mergePorts(append(p.By[proto], r))
}

func (p *Ports) union(o Ports) {
	if o.All {
		*p = Ports{All: true}
		return
	}
	if p.All {
		return
	}
	for proto, rs := range o.By {
		for _, r := range rs {
			p.add(proto, r)
		}
	}
}

// intersect is p ∩ o.
func intersect(p, o Ports) Ports {
	switch {
	case p.All:
		return o
	case o.All:
		return p
	}
	var out Ports
	for proto, as := range p.By {
		for _, a := range as {
			for _, b := range o.By[proto] {
				lo, hi := max(a.First, b.First), min(a.Last, b.Last)
				if lo <= hi {
					out.add(proto, PortRange{lo, hi})
				}
			}
		}
	}
	return out
}

func mergePorts(rs []PortRange) []PortRange {
	slices.SortFunc(rs, func(a, b PortRange) int { return int(a.First) - int(b.First) })
	var out []PortRange
	for _, r := range rs {
		if n := len(out); n > 0 && uint32(r.First) <= uint32(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}
