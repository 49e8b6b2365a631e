package bgp

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// linkBandwidth is the link-bandwidth community a path carries (bytes/s;
// -1: none).
func linkBandwidth(p *apiutil.Path) float32 {
	for _, a := range p.Attrs {
		if ec, ok := a.(*bgp.PathAttributeExtendedCommunities); ok {
			for _, v := range ec.Value {
				if lb, ok := v.(*bgp.LinkBandwidthExtended); ok {
					return lb.Bandwidth
				}
			}
		}
	}
	return -1
}

// A Service route goes out as the ToR must see it: a plain one with its
// kind's communities and its weight as link bandwidth (1 Mbit/s per
// endpoint); a draining one with GRACEFUL_SHUTDOWN and the node's AS three
// more times; a change of either is re-sent, the same path never; and a
// restarted speaker reads drain and weight back from GoBGP (nothing
// re-sent for them).
func TestServicePaths(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t)
	peer := torPeer(r)
	peer.Communities = v1alpha1.KindCommunities{Service: []string{"64512:300"}}
	if err := sp.ApplyPeers([]v1alpha1.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, sp, r, "::1")

	lb6 := netip.MustParsePrefix("2001:db8:5e::1/128")
	lb4 := netip.MustParsePrefix("198.51.100.1/32")
	desired := map[netip.Prefix]advert.Path{
		summary6: {Kind: advert.Summary},
		lb6:      {Kind: advert.Service, Weight: 3},
		lb4:      {Kind: advert.Service, Drain: true},
	}
	check := func(when string) {
		t.Helper()
		var rib map[netip.Prefix]*apiutil.Path
		wantAS := func(a advert.Path) string {
			n := 1
			if a.Drain {
				n += drainPrepend
			}
			return strings.TrimSpace(strings.Repeat(fmt.Sprint(flockASN)+" ", n))
		}
		testutil.EventuallyWithin(t, waitFor, when+": the ToR has the paths as set", func() (bool, string) {
			rib = r.waitRIB(t, summary6, lb6, lb4)
			for pfx, a := range desired {
				bw := linkBandwidth(rib[pfx])
				if asPath(rib[pfx]) != wantAS(a) || a.Weight > 0 && bw != float32(a.Weight)*bandwidthPerWeight || a.Weight == 0 && bw != -1 {
					return false, fmt.Sprintf("%s: AS path %q, bandwidth %v", pfx, asPath(rib[pfx]), bw)
				}
			}
			return true, ""
		})
		for pfx, a := range desired {
			p := rib[pfx]
			std, _ := communities(p)
			if a.Kind == advert.Service && !slices.Contains(std, "64512:300") || a.Kind != advert.Service && slices.Contains(std, "64512:300") {
				t.Errorf("%s: %s: communities %v; the service kind's 64512:300 on service routes only", when, pfx, std)
			}
			if slices.Contains(std, "65535:0") != a.Drain {
				t.Errorf("%s: %s: communities %v, drain %v: GRACEFUL_SHUTDOWN exactly when draining", when, pfx, std, a.Drain)
			}
			if got := asPath(p); got != wantAS(a) {
				t.Errorf("%s: %s: AS path %q, want %q", when, pfx, got, wantAS(a))
			}
			bw := linkBandwidth(p)
			if a.Weight == 0 && bw != -1 || a.Weight > 0 && bw != float32(a.Weight)*bandwidthPerWeight {
				t.Errorf("%s: %s: link bandwidth %v, want weight %d × %d", when, pfx, bw, a.Weight, bandwidthPerWeight)
			}
		}
		assertNoMarker(t, rib)
	}
	if err := sp.Set(t.Context(), desired, false); err != nil {
		t.Fatal(err)
	}
	check("first")

	// Drain and weight change: re-sent.
	desired[lb6] = advert.Path{Kind: advert.Service, Weight: 1, Drain: true}
	desired[lb4] = advert.Path{Kind: advert.Service, Weight: 2}
	announced := countAnnounces(sp)
	if err := sp.Set(t.Context(), desired, false); err != nil {
		t.Fatal(err)
	}
	if n := announced(); n != 2 {
		t.Errorf("%d paths announced for two changes", n)
	}
	check("changed")

	// What GoBGP holds reads back as what was set: a full pass that
	// re-reads it sends nothing.
	got, err := sp.readRIB()
	if err != nil {
		t.Fatal(err)
	}
	for pfx, a := range desired {
		if got[pfx] != a {
			t.Errorf("read back %s as %+v, want %+v", pfx, got[pfx], a)
		}
	}
	announced = countAnnounces(sp)
	sp.pathMu.Lock()
	sp.reread = true
	sp.pathMu.Unlock()
	if err := sp.Set(t.Context(), desired, true); err != nil {
		t.Fatal(err)
	}
	if n := announced(); n != 0 {
		t.Errorf("%d paths re-sent after re-reading GoBGP", n)
	}
}

func TestWeightOf(t *testing.T) {
	for _, w := range []uint32{0, 1, 2, 7, 1000, 100000} {
		if got := weightOf(float32(w) * bandwidthPerWeight); got != w {
			t.Errorf("weightOf(%d × %d) = %d", w, bandwidthPerWeight, got)
		}
	}
	if linkBandwidthAS(65001) != 65001 || linkBandwidthAS(4200000001) != 23456 {
		t.Error("linkBandwidthAS: want the ASN, or AS_TRANS for a 4-octet one")
	}
}
