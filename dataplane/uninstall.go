package dataplane

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RemoveAll takes flock off the node's network: every flock veth (the
// pod's end goes with it, and with both the routes through it) and every
// route of flock's protocol left (the summaries' blackholes, anycast and
// Service next hops). For an uninstall only: running pods lose their
// network. It goes on past a failure and returns them all.
func (d *Netlink) RemoveAll() (veths, routes int, err error) {
	var errs []error
	names, lerr := d.HostVeths()
	if lerr != nil {
		errs = append(errs, lerr)
	}
	for _, name := range names {
		l, err := netlink.LinkByName(name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				errs = append(errs, fmt.Errorf("veth %s: %w", name, err))
			}
			continue
		}
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("remove veth %s: %w", name, err))
			continue
		}
		veths++
	}
	rs, rerr := d.flockRoutes()
	if rerr != nil {
		errs = append(errs, rerr)
	}
	for _, r := range rs {
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("remove route %s: %w", r.Dst, err))
			continue
		}
		routes++
	}
	return veths, routes, errors.Join(errs...)
}
