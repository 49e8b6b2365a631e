package dataplane

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RemoveAll takes every flock veth and route away, and only flock's: a
// veth of another name and a route of another protocol stay. Twice is
// fine (an uninstall retried).
func TestRemoveAll(t *testing.T) {
	inNewNetns(t, func(podNS string) {
		d := &Netlink{}
		for i, ifName := range []string{"eth0", "eth1"} {
			id := []string{"c1", "c2"}[i]
			p := Pod{ContainerID: id, HostVeth: HostVethName(id), Netns: podNS, IfName: ifName,
				IPs: []netip.Addr{netip.MustParseAddr([]string{"fd00:10::5", "fd00:10::6"}[i]),
					netip.MustParseAddr([]string{"10.1.0.5", "10.1.0.6"}[i])},
				HostMAC: RandomMAC(), PodMAC: RandomMAC()}
			if _, err := d.Setup(p); err != nil {
				t.Error(err)
				return
			}
		}
		if err := d.EnsureNode([]netip.Prefix{netip.MustParsePrefix("fd00:10::/64"), netip.MustParsePrefix("10.1.0.0/24")}); err != nil {
			t.Error(err)
			return
		}
		if err := d.SetRoute(netip.MustParsePrefix("2001:db8:a::1/128"), []Nexthop{{Gateway: netip.MustParseAddr("fd00:10::5"), Dev: HostVethName("c1")}}); err != nil {
			t.Error(err)
			return
		}
		// Not flock's: another veth pair and a static route.
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "other0"}, PeerName: "other1"}); err != nil {
			t.Error(err)
			return
		}
		lo, _ := netlink.LinkByName("lo")
		_ = netlink.LinkSetUp(lo)
		_, keep, _ := net.ParseCIDR("2001:db8:ffff::/64")
		if err := netlink.RouteAdd(&netlink.Route{Dst: keep, Type: unix.RTN_BLACKHOLE, Protocol: unix.RTPROT_STATIC}); err != nil {
			t.Error(err)
			return
		}
		veths, routes, err := d.RemoveAll()
		// The veths take their host routes with them: what is left to
		// remove is the 2 blackholes and the anycast route (which may go
		// with its veth first).
		if err != nil || veths != 2 || routes < 2 {
			t.Errorf("RemoveAll = %d veths, %d routes, %v; want 2 veths and at least the 2 blackholes", veths, routes, err)
		}
		if left, err := d.HostVeths(); err != nil || len(left) != 0 {
			t.Errorf("flock veths left: %v (%v)", left, err)
		}
		if rs, err := d.flockRoutes(); err != nil || len(rs) != 0 {
			t.Errorf("flock routes left: %v (%v)", rs, err)
		}
		if _, err := netlink.LinkByName("other0"); err != nil {
			t.Errorf("another veth went too: %v", err)
		}
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Dst: keep}, netlink.RT_FILTER_DST)
		if err != nil || len(rs) != 1 {
			t.Errorf("another route went too: %v (%v)", rs, err)
		}
		if v, r, err := d.RemoveAll(); v != 0 || r != 0 || err != nil {
			t.Errorf("RemoveAll again = %d, %d, %v; want nothing to do", v, r, err)
		}
	})
}
