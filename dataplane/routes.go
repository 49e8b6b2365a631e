package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// SetRoute points dst at the given next hops (one ECMP route for several),
// or removes it when there are none. A next hop whose device is gone is
// left out and reported in the error, so one vanished replica cannot keep
// the others' route from being programmed.
func (d *Netlink) SetRoute(dst netip.Prefix, nhs []Nexthop) error {
	r := &netlink.Route{Dst: ipnet(dst), Protocol: RouteProtocol, Family: family(dst.Addr())}
	var errs []error
	type hop struct {
		idx int
		gw  netip.Addr
	}
	var live []hop
	for _, nh := range nhs {
		l, err := netlink.LinkByName(nh.Dev)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %s via %s dev %s: %w", dst, nh.Gateway, nh.Dev, err))
			continue
		}
		live = append(live, hop{l.Attrs().Index, nh.Gateway})
	}
	switch len(live) {
	case 0:
		if err := netlink.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", dst, err))
		}
		return errors.Join(errs...)
	case 1:
		r.LinkIndex, r.Gw = live[0].idx, live[0].gw.AsSlice()
	default:
		for _, h := range live {
			r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{LinkIndex: h.idx, Gw: h.gw.AsSlice()})
		}
	}
	if err := netlink.RouteReplace(r); err != nil {
		errs = append(errs, fmt.Errorf("route %s via %v: %w", dst, nhs, err))
	}
	return errors.Join(errs...)
}

// HostRoutes returns the flock routes that have a gateway (the anycast and
// `addresses` host routes) with their next hops, as the kernel holds them.
func (d *Netlink) HostRoutes() (map[netip.Prefix][]Nexthop, error) {
	// Names of just the links the routes use, one ioctl each: a link dump
	// of a node with 1,000 pods costs more than the routes themselves.
	names := map[int]string{}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket for link names: %w", err)
	}
	defer unix.Close(fd)
	name := func(idx int) string {
		dev, ok := names[idx]
		if !ok {
			dev = linkName(fd, idx)
			names[idx] = dev
		}
		return dev
	}
	// A dump that a change interrupted may miss routes: read again (a
	// repair that thought a route missing would only replace it).
	for attempt := 1; ; attempt++ {
		out := make(map[netip.Prefix][]Nexthop, d.routes.Load())
		interrupted := false
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			err := dumpGatewayRoutes(fam, func(dst netip.Prefix, hops []hop) {
				for _, h := range hops {
					out[dst] = append(out[dst], Nexthop{Gateway: h.gw, Dev: name(h.idx)})
				}
			})
			switch {
			case errors.Is(err, errDumpInterrupted):
				interrupted = true
			case err != nil:
				return nil, fmt.Errorf("list routes: %w", err)
			}
		}
		if !interrupted || attempt == 3 {
			d.routes.Store(int64(len(out)))
			return out, nil
		}
	}
}

// linkName is the name of link idx ("ifindex-N" if it is gone), asked
// through fd (any socket of the namespace).
func linkName(fd, idx int) string {
	if ifr, err := unix.NewIfreq(""); err == nil {
		ifr.SetUint32(uint32(idx))
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr); err == nil {
			return ifr.Name()
		}
	}
	return fmt.Sprintf("ifindex-%d", idx)
}
