package bgp

import (
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Guard is the RFC 5549 decision for one session.
type Guard struct {
	// SendIPv4 allows IPv4 routes to the peer.
	SendIPv4 bool
	// Warning explains a withheld family ("" when all is well).
	Warning string
}

// Decide applies the RFC 5549 guard: over an IPv6 session an IPv4 route can
// only carry an IPv6 next hop, which a peer that did not negotiate the
// extended next hop capability (for IPv4 unicast with IPv6 next hops)
// drops without a word. GoBGP sends it anyway, so flock withholds IPv4
// from such a peer and says so.
func Decide(transportV6, ipv4Configured bool, remote []bgp.ParameterCapabilityInterface) Guard {
	if !ipv4Configured {
		return Guard{}
	}
	if !transportV6 {
		return Guard{SendIPv4: true}
	}
	mp, anyMP, enhe := false, false, false
	for _, c := range remote {
		switch c := c.(type) {
		case *bgp.CapMultiProtocol:
			anyMP = true
			if c.CapValue == bgp.RF_IPv4_UC {
				mp = true
			}
		case *bgp.CapExtendedNexthop:
			for _, t := range c.Tuples {
				if t.NLRIAFI == bgp.AFI_IP && t.NLRISAFI == bgp.SAFI_UNICAST && t.NexthopAFI == bgp.AFI_IP6 {
					enhe = true
				}
			}
		}
	}
	// Both are needed: an extended next hop tuple without IPv4 unicast
	// itself still means no IPv4 route reaches the peer. No multiprotocol
	// capability at all means IPv4 unicast (RFC 4760, as GoBGP negotiates).
	if !mp && anyMP {
		return Guard{Warning: "peer did not negotiate IPv4 unicast: no IPv4 routes sent"}
	}
	if enhe {
		return Guard{SendIPv4: true}
	}
	return Guard{Warning: "RFC 5549 mismatch: peer negotiated IPv4 unicast but not the extended next hop capability, so IPv4 routes (IPv6 next hop) are withheld; enable 'extended next hop' on the peer"}
}
