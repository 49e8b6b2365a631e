package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// HostRoutes reads exactly the main table's unicast flock routes that have
// a gateway (one or several next hops), whatever else the node holds, and
// agrees with the netlink library's decoding of the same dump, across
// several datagrams.
func TestHostRoutesDump(t *testing.T) {
	inNewNetns(t, func(string) {
		var links [2]netlink.Link
		for i := range links {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("v%d", i)}, PeerName: fmt.Sprintf("v%dp", i)}
			if err := netlink.LinkAdd(v); err != nil {
				t.Error(err)
				return
			}
			l, err := netlink.LinkByName(v.Name)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			if err != nil {
				t.Error(err)
				return
			}
			links[i] = l
		}
		gw6 := []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")}
		gw4 := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")}
		add := func(r *netlink.Route) {
			if r.Protocol == 0 {
				r.Protocol = RouteProtocol
			}
			if err := netlink.RouteAdd(r); err != nil {
				t.Errorf("add %+v: %v", r, err)
			}
		}
		via := func(i int, gw netip.Addr) *netlink.NexthopInfo {
			return &netlink.NexthopInfo{LinkIndex: links[i].Attrs().Index, Gw: gw.AsSlice()}
		}
		// The pods' own routes: no gateway, not reported.
		for i := range links {
			for _, gw := range []netip.Addr{gw6[i], gw4[i]} {
				add(&netlink.Route{LinkIndex: links[i].Attrs().Index, Dst: ipnet(hostPrefix(gw)), Scope: netlink.SCOPE_LINK})
			}
		}
		want := map[netip.Prefix][]Nexthop{}
		nh := func(i int, gw netip.Addr) Nexthop { return Nexthop{Gateway: gw, Dev: links[i].Attrs().Name} }
		single := func(dst string, i int, gw netip.Addr) {
			p := netip.MustParsePrefix(dst)
			add(&netlink.Route{LinkIndex: links[i].Attrs().Index, Dst: ipnet(p), Gw: gw.AsSlice()})
			want[p] = []Nexthop{nh(i, gw)}
		}
		ecmp := func(dst string, gws []netip.Addr) {
			p := netip.MustParsePrefix(dst)
			add(&netlink.Route{Dst: ipnet(p), MultiPath: []*netlink.NexthopInfo{via(0, gws[0]), via(1, gws[1])}})
			want[p] = []Nexthop{nh(0, gws[0]), nh(1, gws[1])}
		}
		single("2001:db8:a::1/128", 0, gw6[0])
		ecmp("2001:db8:a::2/128", gw6)
		single("203.0.113.1/32", 1, gw4[1])
		ecmp("203.0.113.2/32", gw4)
		single("198.51.100.0/24", 0, gw4[0])
		// Enough to span many datagrams of the dump.
		for i := range 3000 {
			single(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xb, 14: byte(i >> 8), 15: byte(i)}).String()+"/128", i%2, gw6[i%2])
		}
		for i := range 1500 {
			single(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}).String()+"/32", i%2, gw4[i%2])
		}
		// Not flock's, not the main table, not unicast: not reported.
		add(&netlink.Route{LinkIndex: links[0].Attrs().Index, Dst: ipnet(netip.MustParsePrefix("203.0.113.3/32")), Gw: gw4[0].AsSlice(), Protocol: unix.RTPROT_STATIC})
		add(&netlink.Route{LinkIndex: links[0].Attrs().Index, Dst: ipnet(netip.MustParsePrefix("2001:db8:a::3/128")), Gw: gw6[0].AsSlice(), Table: 100})
		add(&netlink.Route{Dst: ipnet(netip.MustParsePrefix("2001:db8:ff::/48")), Type: unix.RTN_BLACKHOLE})
		add(&netlink.Route{Dst: ipnet(netip.MustParsePrefix("198.51.100.128/25")), Type: unix.RTN_UNREACHABLE})

		got, err := (&Netlink{}).HostRoutes()
		if err != nil {
			t.Error(err)
			return
		}
		if diff := routeDiff(got, want); diff != "" {
			t.Errorf("HostRoutes, against what was installed: %s", diff)
		}
		oracle, err := libraryHostRoutes()
		if err != nil {
			t.Error(err)
			return
		}
		if diff := routeDiff(got, oracle); diff != "" {
			t.Errorf("HostRoutes, against the netlink library's decoding: %s", diff)
		}
	})
}

// libraryHostRoutes is HostRoutes through the netlink library's decoding,
// as it was written before the in-place dump.
func libraryHostRoutes() (map[netip.Prefix][]Nexthop, error) {
	out := map[netip.Prefix][]Nexthop{}
	hop := func(idx int, gw net.IP) Nexthop {
		a, _ := netip.AddrFromSlice(gw)
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			return Nexthop{Gateway: a.Unmap(), Dev: fmt.Sprintf("ifindex-%d", idx)}
		}
		return Nexthop{Gateway: a.Unmap(), Dev: l.Attrs().Name}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
		for _, r := range rs {
			if r.Type != unix.RTN_UNICAST || (r.Gw == nil && len(r.MultiPath) == 0) {
				continue
			}
			p, ok := prefixOf(r.Dst)
			if !ok {
				continue
			}
			if r.Gw != nil {
				out[p] = append(out[p], hop(r.LinkIndex, r.Gw))
			}
			for _, m := range r.MultiPath {
				out[p] = append(out[p], hop(m.LinkIndex, m.Gw))
			}
		}
	}
	return out, nil
}

// routeDiff describes how got differs from want, next hops compared as sets
// ("" when equal).
func routeDiff(got, want map[netip.Prefix][]Nexthop) string {
	var d []string
	for _, p := range slices.SortedFunc(maps.Keys(want), func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) }) {
		g, w := slices.SortedFunc(slices.Values(got[p]), CompareNexthops), slices.SortedFunc(slices.Values(want[p]), CompareNexthops)
		if !slices.Equal(g, w) {
			d = append(d, fmt.Sprintf("%s: %v, want %v", p, g, w))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			d = append(d, fmt.Sprintf("%s: %v, not wanted", p, got[p]))
		}
	}
	if len(d) > 5 {
		d = append(d[:5], fmt.Sprintf("and %d more", len(d)-5))
	}
	if len(d) == 0 {
		return ""
	}
	return fmt.Sprint(d)
}

// A route message is read in place: every truncation of one is skipped or
// read partially, never a panic, and the whole one gives its next hops.
func TestParseGatewayRouteTruncated(t *testing.T) {
	ne := binary.NativeEndian
	attr := func(typ uint16, v []byte) []byte {
		b := make([]byte, nlAlign(4+len(v)))
		ne.PutUint16(b, uint16(4+len(v)))
		ne.PutUint16(b[2:], typ)
		copy(b[4:], v)
		return b
	}
	nexthop := func(idx uint32, gw netip.Addr) []byte {
		a := attr(unix.RTA_GATEWAY, gw.AsSlice())
		b := make([]byte, 8, 8+len(a))
		ne.PutUint16(b, uint16(8+len(a)))
		ne.PutUint32(b[4:], idx)
		return append(b, a...)
	}
	msg := []byte{unix.AF_INET6, 128, 0, 0, unix.RT_TABLE_MAIN, byte(RouteProtocol), 0, unix.RTN_UNICAST, 0, 0, 0, 0}
	msg = append(msg, attr(unix.RTA_DST, netip.MustParseAddr("2001:db8:a::1").AsSlice())...)
	msg = append(msg, attr(unix.RTA_MULTIPATH, append(nexthop(7, netip.MustParseAddr("fd00::1")), nexthop(9, netip.MustParseAddr("fd00::2"))...))...)
	var hops []hop
	dst, ok := parseGatewayRoute(unix.AF_INET6, msg, &hops)
	want := []hop{{7, netip.MustParseAddr("fd00::1")}, {9, netip.MustParseAddr("fd00::2")}}
	if !ok || dst != netip.MustParsePrefix("2001:db8:a::1/128") || !slices.Equal(hops, want) {
		t.Fatalf("parseGatewayRoute = %s %v %v, want 2001:db8:a::1/128 %v", dst, hops, ok, want)
	}
	if _, ok := parseGatewayRoute(unix.AF_INET, msg, &hops); ok {
		t.Error("an IPv6 route read in an IPv4 dump")
	}
	for n := range len(msg) {
		if dst, ok := parseGatewayRoute(unix.AF_INET6, msg[:n], &hops); ok && (dst != netip.MustParsePrefix("2001:db8:a::1/128") || len(hops) == 0) {
			t.Errorf("cut at %d: %s %v", n, dst, hops)
		}
	}
}

// TestWholeRetriesInterruptedDumps: a dump cut short by a change is run
// again; one that stays cut short returns its partial list and the error;
// any other error is returned at once.
func TestWholeRetriesInterruptedDumps(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cut        int // interrupted results before a whole one
		other      error
		wantCalls  int
		wantErr    error
		wantResult []int
	}{
		{name: "whole at once", cut: 0, wantCalls: 1, wantResult: []int{1, 2}},
		{name: "cut twice", cut: 2, wantCalls: 3, wantResult: []int{1, 2}},
		{name: "always cut", cut: 100, wantCalls: 9, wantErr: netlink.ErrDumpInterrupted, wantResult: []int{1}},
		{name: "other error", other: unix.EPERM, wantCalls: 1, wantErr: unix.EPERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			got, err := whole(func() ([]int, error) {
				calls++
				switch {
				case tc.other != nil:
					return nil, tc.other
				case calls <= tc.cut:
					return []int{1}, netlink.ErrDumpInterrupted
				}
				return []int{1, 2}, nil
			})
			if calls != tc.wantCalls || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || !slices.Equal(got, tc.wantResult) {
				t.Fatalf("calls %d, result %v, err %v; want %d, %v, %v", calls, got, err, tc.wantCalls, tc.wantResult, tc.wantErr)
			}
		})
	}
}
