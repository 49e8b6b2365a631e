package verdicts

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// Merged terms match exactly the packets the terms did, for random terms
// over a few shared peer sets (nil: any) and random ports.
func TestMergeTermsMatchesTheSame(t *testing.T) {
	s := seed(t)
	r := rand.New(rand.NewPCG(s, 0x6d72))
	addr := func() netip.Addr { return netip.AddrFrom4([4]byte{198, 51, 100, byte(r.IntN(16))}) }
	randPorts := func() Ports {
		if r.IntN(5) == 0 {
			return Ports{All: true}
		}
		var p Ports
		for range 1 + r.IntN(2) {
			first := uint16(r.IntN(8))
			p.add(Protocols[r.IntN(len(Protocols))], PortRange{first, first + uint16(r.IntN(3))})
		}
		return p
	}
	for wi := range scaled(t, 200) {
		var pool []*Addrs
		for range 3 {
			var b addrsBuilder
			for range 1 + r.IntN(5) {
				b.addAddr(addr())
			}
			pool = append(pool, b.build())
		}
		pool = append(pool, nil)
		var ts []Term
		for range r.IntN(8) {
			if r.IntN(6) == 0 {
				ts = append(ts, Term{Named: []PeerPort{{addr(), unix.IPPROTO_TCP, uint16(r.IntN(8))}}})
				continue
			}
			ts = append(ts, Term{Peers: pool[r.IntN(len(pool))], Ports: randPorts()})
		}
		type probe struct {
			peer netip.Addr
			k    Packet
			want bool
		}
		// The verdicts before merging, taken first: merging must not
		// change the terms it was given either.
		before := &Group{Terms: ts}
		var probes []probe
		for range 200 {
			k := Packet{Proto: []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_ICMP}[r.IntN(4)], DstPort: uint16(r.IntN(12))}
			peer := addr()
			probes = append(probes, probe{peer, k, before.allows(peer, k)})
		}
		after := &Group{Terms: mergeTerms(ts, nil)}
		if len(after.Terms) > len(ts) {
			t.Fatalf("world %d: %d terms became %d", wi, len(ts), len(after.Terms))
		}
		for _, pr := range probes {
			if got := after.allows(pr.peer, pr.k); got != pr.want || before.allows(pr.peer, pr.k) != pr.want {
				t.Fatalf("world %d (FLOCK_SEED=%d): peer %s proto %d port %d: merged %v, terms before merging %v, after %v\nmerged %+v", wi, s, pr.peer, pr.k.Proto, pr.k.DstPort, got, pr.want, before.allows(pr.peer, pr.k), after.Terms)
			}
		}
	}
}

// make bench's pod, which 100 policies select (a rule of each on one port
// from a peer of its own, another from one peer they share), is judged by
// a chain of two terms, not two hundred.
func TestManyPoliciesFewTerms(t *testing.T) {
	p := Compile(benchInput())
	if len(p.Groups) != 1 {
		t.Fatalf("%d groups, want 1", len(p.Groups))
	}
	if n := len(p.Groups[0].Terms); n != 2 {
		t.Errorf("the selected pod's group has %d terms, want 2 (its 200 rules merged by ports and by peers)", n)
	}
}
