package lab

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

func mustPrefix(t *testing.T, s string) bgp.PathNLRI {
	t.Helper()
	p, err := bgp.NewIPAddrPrefix(netip.MustParsePrefix(s))
	if err != nil {
		t.Fatal(err)
	}
	return bgp.PathNLRI{NLRI: p}
}

func serialize(t *testing.T, m *bgp.BGPMessage) []byte {
	t.Helper()
	b, err := m.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The decoder is checked against GoBGP's own encoder: IPv4 in the body,
// both families in MP_REACH/MP_UNREACH (RFC 5549 next hop for IPv4),
// End-of-RIB markers.
func TestParseUpdate(t *testing.T) {
	reach6, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{mustPrefix(t, "2001:db8:100::7/128"), mustPrefix(t, "fd00:10:1::/64")}, netip.MustParseAddr("fd00:0:1::1"))
	if err != nil {
		t.Fatal(err)
	}
	reach4, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv4_UC, []bgp.PathNLRI{mustPrefix(t, "198.51.100.3/32")}, netip.MustParseAddr("fd00:0:1::1"))
	if err != nil {
		t.Fatal(err)
	}
	unreach6, err := bgp.NewPathAttributeMpUnreachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{mustPrefix(t, "2001:db8:100::8/128")})
	if err != nil {
		t.Fatal(err)
	}
	eor6, err := bgp.NewPathAttributeMpUnreachNLRI(bgp.RF_IPv6_UC, nil)
	if err != nil {
		t.Fatal(err)
	}
	nh, err := bgp.NewPathAttributeNextHop(netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	pp := netip.MustParsePrefix
	for _, tc := range []struct {
		name    string
		msg     *bgp.BGPMessage
		ann, wd []netip.Prefix
		eor     bool
	}{
		{"mp-reach-v6", bgp.NewBGPUpdateMessage(nil, []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0), reach6}, nil), []netip.Prefix{pp("2001:db8:100::7/128"), pp("fd00:10:1::/64")}, nil, false},
		{"mp-reach-v4-over-v6", bgp.NewBGPUpdateMessage(nil, []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0), reach4}, nil), []netip.Prefix{pp("198.51.100.3/32")}, nil, false},
		{"v4-body", bgp.NewBGPUpdateMessage([]bgp.PathNLRI{mustPrefix(t, "10.10.1.0/24")}, []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0), nh}, []bgp.PathNLRI{mustPrefix(t, "203.0.113.9/32")}), []netip.Prefix{pp("203.0.113.9/32")}, []netip.Prefix{pp("10.10.1.0/24")}, false},
		{"mp-unreach-v6", bgp.NewBGPUpdateMessage(nil, []bgp.PathAttributeInterface{unreach6}, nil), nil, []netip.Prefix{pp("2001:db8:100::8/128")}, false},
		{"eor-v4", bgp.NewBGPUpdateMessage(nil, nil, nil), nil, nil, true},
		{"eor-v6", bgp.NewBGPUpdateMessage(nil, []bgp.PathAttributeInterface{eor6}, nil), nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := serialize(t, tc.msg)
			u, err := ParseUpdate(b[19:])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(u.Announced, tc.ann) || !slices.Equal(u.Withdrawn, tc.wd) || u.EoR != tc.eor {
				t.Fatalf("got %+v, want announced %v withdrawn %v eor %v", u, tc.ann, tc.wd, tc.eor)
			}
		})
	}
	if _, err := ParseUpdate([]byte{0, 9, 1}); err == nil {
		t.Fatal("a truncated UPDATE parsed")
	}
}

// frame builds an Ethernet/IPv6/TCP frame from port 179 with payload.
func frame(seq uint32, syn bool, payload []byte) []byte {
	b := make([]byte, 14+40+20+len(payload))
	binary.BigEndian.PutUint16(b[12:], 0x86dd)
	ip := b[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(20+len(payload)))
	ip[6] = 6
	ip[23], ip[39] = 1, 2
	tcp := ip[40:]
	binary.BigEndian.PutUint16(tcp, 179)
	binary.BigEndian.PutUint16(tcp[2:], 40000)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	tcp[12] = 5 << 4
	if syn {
		tcp[13] = 0x02
	}
	copy(tcp[20:], payload)
	return b
}

// The stream reassembly takes messages split across segments, skips
// retransmissions and resynchronises on a marker after a capture loss.
func TestCaptureStream(t *testing.T) {
	c := newCapture()
	up := func(p string) []byte {
		reach, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{mustPrefix(t, p)}, netip.MustParseAddr("fd00::1"))
		if err != nil {
			t.Fatal(err)
		}
		return serialize(t, bgp.NewBGPUpdateMessage(nil, []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0), reach}, nil))
	}
	now := time.Now()
	m1, m2, m3 := up("2001:db8::1/128"), up("2001:db8::2/128"), up("2001:db8::3/128")
	seq := uint32(1000)
	feed := func(p []byte) {
		c.packet(now, frame(seq, false, p))
	}
	c.packet(now, frame(seq-1, true, nil))
	both := append(append([]byte{}, m1...), m2[:10]...)
	feed(both)
	feed(both) // retransmitted
	seq += uint32(len(both))
	feed(m2[10:])
	seq += uint32(len(m2) - 10)
	seq += 7 // a segment the capture lost: the next starts mid-message
	feed(append(append([]byte{}, m2[3:]...), m3...))
	var got []netip.Prefix
	for _, ev := range c.events {
		got = append(got, ev.Announced...)
	}
	want := []netip.Prefix{netip.MustParsePrefix("2001:db8::1/128"), netip.MustParsePrefix("2001:db8::2/128"), netip.MustParsePrefix("2001:db8::3/128")}
	if !slices.Equal(got, want) {
		t.Fatalf("announced %v, want %v", got, want)
	}
}
