package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Check compares the live kernel state with p and reports every difference:
// a missing route is an error, never ignored.
func (d *Netlink) Check(p Pod) error {
	var errs []error
	hostName := p.HostVeth
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return fmt.Errorf("host veth %s: %w", hostName, err)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		errs = append(errs, fmt.Errorf("host veth %s is down", hostName))
	}
	if err := hasAddr(netlink.AddrList, host, netip.PrefixFrom(GatewayV6, 64)); err != nil {
		errs = append(errs, fmt.Errorf("host veth %s: %w", hostName, err))
	}
	for _, ip := range p.IPs {
		if !hasDevRoute(netlink.RouteListFiltered, host, hostPrefix(ip)) {
			errs = append(errs, fmt.Errorf("host route %s dev %s is missing", hostPrefix(ip), hostName))
		}
	}

	nsh, ph, err := openNetns(p.Netns)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer nsh.Close()
	defer ph.Delete()
	pod, err := ph.LinkByName(p.IfName)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("netns %s: %s: %w", p.Netns, p.IfName, err))...)
	}
	if pod.Attrs().Flags&net.FlagUp == 0 {
		errs = append(errs, fmt.Errorf("netns %s: %s is down", p.Netns, p.IfName))
	}
	for _, ip := range append(append([]netip.Addr{}, p.IPs...), p.Addresses...) {
		if err := hasAddr(ph.AddrList, pod, hostPrefix(ip)); err != nil {
			errs = append(errs, fmt.Errorf("netns %s: %s: %w", p.Netns, p.IfName, err))
		}
	}
	for _, ip := range p.IPs {
		gw := GatewayV6
		if ip.Is4() {
			gw = GatewayV4
		}
		if !hasDefaultVia(ph, pod, ip, gw) {
			errs = append(errs, fmt.Errorf("netns %s: default route via %s dev %s is missing", p.Netns, gw, p.IfName))
		}
	}
	for _, ip := range p.Anycast {
		if err := hasAddr(ph.AddrList, pod, hostPrefix(ip)); err != nil {
			errs = append(errs, fmt.Errorf("netns %s: %s: anycast %w", p.Netns, p.IfName, err))
		}
	}
	return errors.Join(errs...)
}

func hasAddr(list func(netlink.Link, int) ([]netlink.Addr, error), l netlink.Link, want netip.Prefix) error {
	addrs, err := whole(func() ([]netlink.Addr, error) { return list(l, family(want.Addr())) })
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet); ok && p == want {
			if a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
				return fmt.Errorf("address %s is tentative or failed DAD", want)
			}
			return nil
		}
	}
	return fmt.Errorf("address %s is missing", want)
}

func hasDevRoute(list func(int, *netlink.Route, uint64) ([]netlink.Route, error), l netlink.Link, dst netip.Prefix) bool {
	rs, err := whole(func() ([]netlink.Route, error) {
		return list(family(dst.Addr()), &netlink.Route{LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_OIF)
	})
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return false
	}
	for _, r := range rs {
		if p, ok := prefixOf(r.Dst); ok && p == dst {
			return true
		}
	}
	return false
}

func hasDefaultVia(h *netlink.Handle, l netlink.Link, ip, gw netip.Addr) bool {
	rs, err := whole(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(family(ip), &netlink.Route{LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_OIF)
	})
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return false
	}
	for _, r := range rs {
		p, ok := prefixOf(r.Dst)
		isDefault := r.Dst == nil || (ok && p.Bits() == 0)
		if g, ok := netip.AddrFromSlice(r.Gw); isDefault && ok && g.Unmap() == gw {
			return true
		}
	}
	return false
}
