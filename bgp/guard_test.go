package bgp

import (
	"strings"
	"testing"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

func enhe(tuples ...*bgp.CapExtendedNexthopTuple) *bgp.CapExtendedNexthop {
	return bgp.NewCapExtendedNexthop(tuples)
}

func TestDecide(t *testing.T) {
	mp4 := bgp.NewCapMultiProtocol(bgp.RF_IPv4_UC)
	mp6 := bgp.NewCapMultiProtocol(bgp.RF_IPv6_UC)
	gr := bgp.NewCapGracefulRestart(false, false, 120, nil)
	as4 := bgp.NewCapFourOctetASNumber(64513)
	enhe4 := enhe(bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv4_UC, bgp.AFI_IP6))
	tests := []struct {
		name        string
		transportV6 bool
		ipv4        bool
		remote      []bgp.ParameterCapabilityInterface
		wantSend    bool
		wantWarn    string // substring; "" means no warning at all
	}{
		{
			name:        "IPv4 not configured",
			transportV6: true, ipv4: false,
			remote: []bgp.ParameterCapabilityInterface{mp6},
		},
		{
			name:        "IPv4 not configured, IPv4 transport",
			transportV6: false, ipv4: false,
			remote: []bgp.ParameterCapabilityInterface{mp4},
		},
		{
			name:        "IPv4 transport needs no extended next hop",
			transportV6: false, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{mp4},
			wantSend: true,
		},
		{
			name:        "IPv4 transport, no capabilities at all",
			transportV6: false, ipv4: true,
			wantSend: true,
		},
		{
			name:        "IPv6 transport with the extended next hop tuple",
			transportV6: true, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{as4, mp6, mp4, gr, enhe4},
			wantSend: true,
		},
		{
			name:        "IPv6 transport, tuple among others",
			transportV6: true, ipv4: true,
			remote: []bgp.ParameterCapabilityInterface{mp4, mp6, enhe(
				bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv4_MC, bgp.AFI_IP6),
				bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv4_UC, bgp.AFI_IP6),
			)},
			wantSend: true,
		},
		{
			name:        "IPv6 transport, IPv4 unicast but no extended next hop",
			transportV6: true, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{as4, mp6, mp4, gr},
			wantWarn: "extended next hop",
		},
		{
			name:        "IPv6 transport, extended next hop for IPv4 multicast only",
			transportV6: true, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{mp4, mp6, enhe(bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv4_MC, bgp.AFI_IP6))},
			wantWarn: "extended next hop",
		},
		{
			name:        "IPv6 transport, extended next hop tuple for IPv6 NLRI",
			transportV6: true, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{mp4, mp6, enhe(bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv6_UC, bgp.AFI_IP6))},
			wantWarn: "extended next hop",
		},
		{
			name:        "IPv6 transport, extended next hop tuple with an IPv4 next hop",
			transportV6: true, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{mp4, mp6, enhe(bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv4_UC, bgp.AFI_IP))},
			wantWarn: "extended next hop",
		},
		{
			name:        "IPv6 transport, no IPv4 unicast at all",
			transportV6: true, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{as4, mp6, gr},
			wantWarn: "did not negotiate IPv4 unicast",
		},
		{
			// No multiprotocol capability means IPv4 unicast only.
			name:        "IPv6 transport, no capabilities at all",
			transportV6: true, ipv4: true,
			wantWarn: "extended next hop",
		},
		{
			name:        "IPv6 transport, extended next hop and no multiprotocol capability (IPv4 implied)",
			transportV6: true, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{as4, enhe4},
			wantSend: true,
		},
		{
			// An extended next hop tuple is no use without IPv4 unicast
			// itself: no IPv4 route can be sent, and the operator should
			// be told so.
			name:        "IPv6 transport, extended next hop but no IPv4 unicast",
			transportV6: true, ipv4: true,
			remote:   []bgp.ParameterCapabilityInterface{mp6, enhe4},
			wantWarn: "did not negotiate IPv4 unicast",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := Decide(tt.transportV6, tt.ipv4, tt.remote)
			if g.SendIPv4 != tt.wantSend {
				t.Errorf("SendIPv4 = %v, want %v", g.SendIPv4, tt.wantSend)
			}
			switch {
			case tt.wantWarn == "" && g.Warning != "":
				t.Errorf("unexpected warning %q", g.Warning)
			case tt.wantWarn != "" && !strings.Contains(g.Warning, tt.wantWarn):
				t.Errorf("warning %q does not mention %q", g.Warning, tt.wantWarn)
			}
			if g.SendIPv4 && g.Warning != "" {
				t.Errorf("IPv4 sent but warning %q", g.Warning)
			}
		})
	}
}
