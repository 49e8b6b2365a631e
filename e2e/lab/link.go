package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Connect joins two namespaces with a veth pair (aIf in a, bIf in b), both
// ends up. DAD is off on both ends (a lab link has no duplicates), so the
// kernel link-local addresses are usable at once.
func Connect(a *NS, aIf string, b *NS, bIf string) error {
	bh, err := netns.GetFromPath(b.Path)
	if err != nil {
		return err
	}
	defer bh.Close()
	if err := a.Do(func(h *netlink.Handle) error {
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aIf}, PeerName: bIf, PeerNamespace: netlink.NsFd(int(bh))})
	}); err != nil {
		return fmt.Errorf("veth %s/%s <-> %s/%s: %w", a.Name, aIf, b.Name, bIf, err)
	}
	for _, end := range []struct {
		ns *NS
		If string
	}{{a, aIf}, {b, bIf}} {
		if err := end.ns.Sysctl("net.ipv6.conf."+end.If+".accept_dad", "0"); err != nil {
			return err
		}
		if err := end.ns.Sysctl("net.ipv6.conf."+end.If+".accept_ra", "0"); err != nil {
			return err
		}
		if err := end.ns.Do(func(h *netlink.Handle) error {
			l, err := h.LinkByName(end.If)
			if err != nil {
				return err
			}
			return h.LinkSetUp(l)
		}); err != nil {
			return err
		}
	}
	return nil
}

// Sysctl writes a sysctl inside the namespace ("net.ipv4.ip_forward").
func (n *NS) Sysctl(key, value string) error {
	return n.InNS(func() error {
		p := "/proc/sys/" + dotsToSlashes(key)
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("netns %s: sysctl %s=%s: %w", n.Name, key, value, err)
		}
		return nil
	})
}

func dotsToSlashes(key string) string {
	b := []byte(key)
	for i := range b {
		if b[i] == '.' {
			b[i] = '/'
		}
	}
	return string(b)
}

// AddrAdd puts prefix (address with its length) on ifName, without DAD.
func (n *NS) AddrAdd(ifName string, prefix netip.Prefix) error {
	return n.Do(func(h *netlink.Handle) error {
		l, err := h.LinkByName(ifName)
		if err != nil {
			return err
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrReplace(l, a); err != nil {
			return fmt.Errorf("netns %s: add %s to %s: %w", n.Name, prefix, ifName, err)
		}
		return nil
	})
}

// RouteAdd adds dst via gw (gateway resolved by the kernel).
func (n *NS) RouteAdd(dst netip.Prefix, gw netip.Addr) error {
	return n.Do(func(h *netlink.Handle) error {
		r := &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}, Gw: gw.AsSlice()}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("netns %s: route %s via %s: %w", n.Name, dst, gw, err)
		}
		return nil
	})
}

// LinkLocal returns the kernel link-local address of ifName.
func (n *NS) LinkLocal(ifName string) (netip.Addr, error) {
	var out netip.Addr
	err := n.Do(func(h *netlink.Handle) error {
		l, err := h.LinkByName(ifName)
		if err != nil {
			return err
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
				out = ip
				return nil
			}
		}
		return fmt.Errorf("netns %s: %s has no link-local address", n.Name, ifName)
	})
	return out, err
}
