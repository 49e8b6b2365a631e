package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// What Setup leaves in the kernel, read back through vishvananda/netlink
// and /proc/sys (not through the batches that wrote it): every address
// with its flags and lifetimes, every route with its protocol and scope,
// every neighbour, the sysctls, and nothing else (no kernel link-local).
func TestSetupKernelState(t *testing.T) {
	inNewNetns(t, func(podNS string) {
		d := &Netlink{}
		p := Pod{ContainerID: "c1", HostVeth: HostVethName("c1"), Netns: podNS, IfName: "eth0",
			IPs:       []netip.Addr{netip.MustParseAddr("fd00:10::5"), netip.MustParseAddr("10.1.0.5")},
			Addresses: []netip.Addr{netip.MustParseAddr("2001:db8:aa::7"), netip.MustParseAddr("192.0.2.7")},
			Anycast:   []netip.Addr{netip.MustParseAddr("2001:db8:ff::1"), netip.MustParseAddr("198.51.100.1")},
			HostMAC:   RandomMAC(), PodMAC: RandomMAC()}
		if _, err := d.Setup(p); err != nil {
			t.Fatal(err)
		}
		defer d.Teardown(p.HostVeth)
		host, err := netlink.LinkByName(p.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := inNetns(podNS, func(h *netlink.Handle) (netlink.Link, error) { return h.LinkByName(p.IfName) })
		if err != nil {
			t.Fatal(err)
		}
		if host.Attrs().ParentIndex != pl.Attrs().Index {
			t.Errorf("host veth's peer index %d, pod eth0's %d", host.Attrs().ParentIndex, pl.Attrs().Index)
		}
		for _, l := range []netlink.Link{host, pl} {
			a := l.Attrs()
			if a.OperState != netlink.OperUp && a.OperState != netlink.OperUnknown || a.Flags&1 == 0 || a.TxQLen != 0 {
				t.Errorf("%s: flags %v, oper %v, qlen %d; want up, qlen 0", a.Name, a.Flags, a.OperState, a.TxQLen)
			}
		}
		if host.Attrs().HardwareAddr.String() != p.HostMAC.String() || pl.Attrs().HardwareAddr.String() != p.PodMAC.String() {
			t.Errorf("MACs %s/%s, want %s/%s", host.Attrs().HardwareAddr, pl.Attrs().HardwareAddr, p.HostMAC, p.PodMAC)
		}

		// Addresses, as `ip addr` would print them.
		addrs := func(list func(netlink.Link, int) ([]netlink.Addr, error), l netlink.Link) []string {
			as, err := list(l, netlink.FAMILY_ALL)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, a := range as {
				s := a.IPNet.String()
				if a.Flags&unix.IFA_F_NODAD != 0 {
					s += " nodad"
				}
				if a.PreferedLft == 0 {
					s += " deprecated"
				}
				if a.ValidLft != infiniteLifetime {
					s += fmt.Sprintf(" valid %d", a.ValidLft)
				}
				out = append(out, s)
			}
			slices.Sort(out)
			return out
		}
		wantHost := []string{"fe80::1/64 nodad"}
		if got := addrs(netlink.AddrList, host); !slices.Equal(got, wantHost) {
			t.Errorf("host veth addresses %q, want %q", got, wantHost)
		}
		wantPod := []string{"10.1.0.5/32", "192.0.2.7/32", "198.51.100.1/32", "2001:db8:aa::7/128 nodad", "2001:db8:ff::1/128 nodad deprecated", "fd00:10::5/128 nodad"}
		podAddrs, _ := inNetns(podNS, func(h *netlink.Handle) ([]string, error) { return addrs(h.AddrList, pl), nil })
		if !slices.Equal(podAddrs, wantPod) {
			t.Errorf("pod eth0 addresses %q, want %q", podAddrs, wantPod)
		}

		// Routes and neighbours through each end.
		routes := func(list func(netlink.Link, int) ([]netlink.Route, error), l netlink.Link) []string {
			rs, err := list(l, netlink.FAMILY_ALL)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, r := range rs {
				if r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast() && r.Dst.IP.To4() == nil || r.Type != unix.RTN_UNICAST {
					continue // fe80::/64 of the gateway address; local routes
				}
				dst := "default"
				if r.Dst != nil {
					dst = r.Dst.String()
				}
				if r.Gw != nil {
					dst += " via " + r.Gw.String()
				}
				out = append(out, fmt.Sprintf("%s proto %d scope %d", dst, r.Protocol, r.Scope))
			}
			slices.Sort(out)
			return out
		}
		neighs := func(list func(int, int) ([]netlink.Neigh, error), l netlink.Link) []string {
			ns, err := list(l.Attrs().Index, netlink.FAMILY_ALL)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, n := range ns {
				if n.State == netlink.NUD_NOARP {
					continue // multicast
				}
				out = append(out, fmt.Sprintf("%s lladdr %s state %#x", n.IP, n.HardwareAddr, n.State))
			}
			slices.Sort(out)
			return out
		}
		wantHostRoutes := []string{"10.1.0.5/32 proto 70 scope 253", "fd00:10::5/128 proto 70 scope 0"}
		if got := routes(netlink.RouteList, host); !slices.Equal(got, wantHostRoutes) {
			t.Errorf("routes through the host veth %q, want %q", got, wantHostRoutes)
		}
		wantHostNeigh := []string{"10.1.0.5 lladdr " + p.PodMAC.String() + " state 0x80", "fd00:10::5 lladdr " + p.PodMAC.String() + " state 0x80"}
		if got := neighs(netlink.NeighList, host); !slices.Equal(got, wantHostNeigh) {
			t.Errorf("host veth neighbours %q, want %q", got, wantHostNeigh)
		}
		// The kernel's own (proto 2) routes of the IPv6 addresses besides.
		wantPodRoutes := []string{"0.0.0.0/0 via 169.254.1.1 proto 3 scope 0", "169.254.1.1/32 proto 3 scope 253",
			"2001:db8:aa::7/128 proto 2 scope 0", "2001:db8:ff::1/128 proto 2 scope 0", "::/0 via fe80::1 proto 3 scope 0", "fd00:10::5/128 proto 2 scope 0"}
		podRoutes, _ := inNetns(podNS, func(h *netlink.Handle) ([]string, error) { return routes(h.RouteList, pl), nil })
		if !slices.Equal(podRoutes, wantPodRoutes) {
			t.Errorf("pod routes %q, want %q", podRoutes, wantPodRoutes)
		}
		wantPodNeigh := []string{"169.254.1.1 lladdr " + p.HostMAC.String() + " state 0x80", "fe80::1 lladdr " + p.HostMAC.String() + " state 0x80"}
		podNeigh, _ := inNetns(podNS, func(h *netlink.Handle) ([]string, error) { return neighs(h.NeighList, pl), nil })
		if !slices.Equal(podNeigh, wantPodNeigh) {
			t.Errorf("pod neighbours %q, want %q", podNeigh, wantPodNeigh)
		}

		// The host end's sysctls (this thread is in the node's netns).
		for key, want := range map[string]string{
			"ipv6/conf/" + p.HostVeth + "/addr_gen_mode": "1",
			"ipv4/conf/" + p.HostVeth + "/proxy_arp":     "1",
			"ipv4/neigh/" + p.HostVeth + "/proxy_delay":  "0",
		} {
			b, err := os.ReadFile("/proc/sys/net/" + key)
			if got := strings.TrimSpace(string(b)); err != nil || got != want {
				t.Errorf("%s = %q (%v), want %s", key, got, err, want)
			}
		}
		// And nothing else changed: the pod end keeps proxy ARP off, and
		// another link keeps the default proxy_delay.
		if b, _ := os.ReadFile("/proc/sys/net/ipv4/neigh/lo/proxy_delay"); strings.TrimSpace(string(b)) == "0" {
			t.Error("lo's proxy_delay changed")
		}
	})
}

// A batch reports its first failure by name with the kernel's errno, still
// reads every acknowledgement (the socket stays usable), and hands GET
// answers to their request.
func TestRtnlBatchErrors(t *testing.T) {
	inNewNetns(t, func(string) {
		s, err := newRtnl()
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		const missing = 999999
		err = s.run([]request{
			setUp(int32(lo.Attrs().Index)),
			addAddr(netip.MustParseAddr("192.0.2.1"), 32, missing, 0, false),
			addRoute(netip.MustParsePrefix("198.51.100.0/24"), netip.Addr{}, missing, 3, unix.RT_SCOPE_LINK),
		})
		if !errors.Is(err, unix.ENODEV) || !strings.HasPrefix(err.Error(), "add 192.0.2.1/32: ") {
			t.Errorf("batch with a missing link: %v, want the address request named, wrapping ENODEV", err)
		}
		// The same socket answers the next batch, in step.
		var idx, peer int32
		if err := s.run([]request{getLink("lo", func(i, p int32) { idx, peer = i, p })}); err != nil || int(idx) != lo.Attrs().Index || peer != idx {
			t.Errorf("look up lo after a failed batch: index %d, peer %d, %v; want %d", idx, peer, err, lo.Attrs().Index)
		}
		err = s.run([]request{getLink("nosuch0", func(int32, int32) { t.Error("a missing link was reported") })})
		if !errors.Is(err, unix.ENODEV) || !strings.Contains(err.Error(), "look up nosuch0") {
			t.Errorf("look up a missing link: %v", err)
		}
		if s.broken {
			t.Error("kernel errors marked the socket broken")
		}
	})
}

// Setup into a netns path that is not one fails naming it, before
// anything is created.
func TestSetupBadNetns(t *testing.T) {
	inNewNetns(t, func(string) {
		d := &Netlink{}
		p := Pod{ContainerID: "c1", HostVeth: HostVethName("c1"), Netns: "/run/netns/flock-no-such-ns", IfName: "eth0",
			IPs: []netip.Addr{netip.MustParseAddr("fd00:10::5")}}
		var ne *NetnsError
		if _, err := d.Setup(p); !errors.As(err, &ne) || ne.Path != p.Netns {
			t.Errorf("Setup into a missing netns: %v, want a NetnsError naming it", err)
		}
		if _, err := netlink.LinkByName(p.HostVeth); err == nil {
			t.Errorf("a failed Setup left %s", p.HostVeth)
		}
	})
}
