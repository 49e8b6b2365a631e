package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetnsExists tells whether path still is a network namespace. After a
// reboot (or once the runtime removed it) the bind mount is gone: the path
// is missing, or an empty file that is no longer nsfs.
func (d *Netlink) NetnsExists(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return false, nil
		}
		return false, fmt.Errorf("netns %s: %w", path, err)
	}
	return st.Type == unix.NSFS_MAGIC || st.Type == unix.PROC_SUPER_MAGIC, nil
}

// HostVeths lists the flock veths present on the node.
func (d *Netlink) HostVeths() ([]string, error) {
	links, err := whole(netlink.LinkList)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		if l.Type() == "veth" && strings.HasPrefix(l.Attrs().Name, VethPrefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// EnsureNode turns on forwarding and installs a blackhole route for each
// node summary, removing flock blackholes for summaries no longer
// configured. An unallocated address inside a summary is dropped here
// instead of bouncing between node and ToR.
func (d *Netlink) EnsureNode(summaries []netip.Prefix) error {
	d.put(d.host()) // a kept socket opens at start, not on the first ADD
	if err := d.sysctl("net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	if err := d.sysctl("net.ipv6.conf.all.forwarding", "1"); err != nil {
		return err
	}
	want := map[netip.Prefix]bool{}
	for _, s := range summaries {
		want[s] = true
		r := &netlink.Route{Dst: ipnet(s), Type: unix.RTN_BLACKHOLE, Protocol: RouteProtocol, Family: family(s.Addr())}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("blackhole %s: %w", s, err)
		}
	}
	routes, err := d.flockRoutes()
	if err != nil {
		return err
	}
	for _, r := range routes {
		if r.Type != unix.RTN_BLACKHOLE {
			continue
		}
		if p, ok := prefixOf(r.Dst); ok && !want[p] {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("remove stale blackhole %s: %w", p, err)
			}
			d.log().Info("removed stale summary blackhole", "prefix", p)
		}
	}
	return nil
}

func (d *Netlink) flockRoutes() ([]netlink.Route, error) {
	var out []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := whole(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		})
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		out = append(out, rs...)
	}
	return out, nil
}

// whole runs a netlink dump again while a concurrent change cuts it short
// (ErrDumpInterrupted, with partial results), which on a node creating and
// deleting pods is common. After a few tries it returns what it has and the
// error; callers that can live with a partial list say so.
func whole[T any](dump func() ([]T, error)) ([]T, error) {
	out, err := dump()
	for i := 0; i < 8 && errors.Is(err, netlink.ErrDumpInterrupted); i++ {
		out, err = dump()
	}
	return out, err
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}
