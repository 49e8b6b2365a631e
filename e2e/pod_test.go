package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

func readSysctl(t *testing.T, ns *lab.NS, key string) string {
	t.Helper()
	var v string
	err := ns.InNS(func() error {
		b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
		v = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestDualStackAdd: one pod through libcni gets a usable /128 and /32, the
// gateways and routes of the SPEC, and pings work both ways in both families.
func TestDualStackAdd(t *testing.T) {
	n := startNode(t, defaultConfig)
	podNS := newNS(t, "flkp-")
	pod := lab.Pod{ContainerID: "c0ffee01", NS: podNS, Args: lab.PodArgs("default", "web-0")}
	ctx := ctxT(t)
	res, err := n.cni.Add(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.cni.Del(ctx, pod) })
	ips := podIPs(t, res)
	if len(ips) != 2 || !ips[0].Is6() || !ips[1].Is4() {
		t.Fatalf("want [IPv6, IPv4] in the result, got %v", ips)
	}
	v6, v4 := ips[0], ips[1]
	if !netip.MustParsePrefix("fd00:10:1::/64").Contains(v6) || !netip.MustParsePrefix("10.1.1.0/24").Contains(v4) {
		t.Fatalf("IPs %v not from the summary pools", ips)
	}

	// Pod side.
	err = podNS.Do(func(h *netlink.Handle) error {
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		if eth0.Attrs().Flags&net.FlagUp == 0 {
			t.Error("pod eth0 is down")
		}
		addrs, err := h.AddrList(eth0, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		var got []string
		for _, a := range addrs {
			got = append(got, a.IPNet.String())
			if a.Flags&unix.IFA_F_TENTATIVE != 0 {
				t.Errorf("pod address %s is tentative", a.IPNet)
			}
			if a.IP.IsLinkLocalUnicast() {
				t.Errorf("pod has a kernel link-local %s (addr_gen_mode should be 1)", a.IPNet)
			}
		}
		slices.Sort(got)
		want := []string{v4.String() + "/32", v6.String() + "/128"}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("pod eth0 addresses %v, want %v", got, want)
		}
		r6, err := h.RouteList(eth0, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		if !hasDefault(r6, "fe80::1") {
			t.Errorf("pod has no IPv6 default via fe80::1: %v", r6)
		}
		r4, err := h.RouteList(eth0, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if !hasDefault(r4, "169.254.1.1") {
			t.Errorf("pod has no IPv4 default via 169.254.1.1: %v", r4)
		}
		onlink := false
		for _, r := range r4 {
			if r.Dst != nil && r.Dst.String() == "169.254.1.1/32" && r.Scope == netlink.SCOPE_LINK {
				onlink = true
			}
		}
		if !onlink {
			t.Errorf("pod has no on-link route to 169.254.1.1/32: %v", r4)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Host side.
	veth := dataplane.HostVethName(pod.ContainerID)
	if !strings.HasPrefix(veth, "flock") || len(veth) != 13 {
		t.Fatalf("bad veth name %q", veth)
	}
	err = n.ns.Do(func(h *netlink.Handle) error {
		l, err := h.LinkByName(veth)
		if err != nil {
			return err
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		if len(addrs) != 1 || addrs[0].IPNet.String() != "fe80::1/64" {
			t.Errorf("host veth addresses %v, want only fe80::1/64", addrs)
		}
		for fam, ip := range map[int]netip.Addr{netlink.FAMILY_V6: v6, netlink.FAMILY_V4: v4} {
			rs, err := h.RouteList(l, fam)
			if err != nil {
				return err
			}
			found := false
			for _, r := range rs {
				if r.Dst != nil && prefixOf(r.Dst) == netip.PrefixFrom(ip, ip.BitLen()) {
					found = true
				}
			}
			if !found {
				t.Errorf("host has no route %s dev %s: %v", ip, veth, rs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"net.ipv6.conf." + veth + ".addr_gen_mode": "1",
		"net.ipv4.conf." + veth + ".proxy_arp":     "1",
		"net.ipv4.ip_forward":                      "1",
		"net.ipv6.conf.all.forwarding":             "1",
	} {
		if got := readSysctl(t, n.ns, key); got != want {
			t.Errorf("node sysctl %s = %s, want %s", key, got, want)
		}
	}
	if got := readSysctl(t, podNS, "net.ipv6.conf.eth0.addr_gen_mode"); got != "1" {
		t.Errorf("pod eth0 addr_gen_mode = %s, want 1", got)
	}

	for _, p := range []struct {
		from *lab.NS
		to   netip.Addr
	}{{n.ns, v6}, {n.ns, v4}, {podNS, nodeV6}, {podNS, nodeV4}} {
		if err := lab.Ping(p.from, p.to, 5*time.Second); err != nil {
			t.Error(err)
		}
	}
}

func hasDefault(rs []netlink.Route, gw string) bool {
	for _, r := range rs {
		isDefault := r.Dst == nil || func() bool { o, _ := r.Dst.Mask.Size(); return o == 0 }()
		if isDefault && r.Gw != nil && r.Gw.String() == gw {
			return true
		}
	}
	return false
}

var _ = fmt.Sprintf
