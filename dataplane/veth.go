package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// addrFlags: a /128 on a point-to-point veth needs no DAD, and the pod must
// be able to use its address the moment ADD returns.
func addrFlags(ip netip.Addr) int {
	if ip.Is6() {
		return unix.IFA_F_NODAD
	}
	return 0
}

// ErrInterfaceExists is wrapped by Setup when the pod's netns already has
// an interface of the name asked for (nothing is created then).
var ErrInterfaceExists = errors.New("interface name taken")

// vethQueues is each veth end's number of transmit and receive queues.
const vethQueues = 1

// Setup creates the veth pair and programs both ends. A leftover host veth
// of the same name (a crashed earlier attempt) is removed and the pair
// created again; an interface of the pod's name in its netns is an error. On error the
// caller tears down; Setup does not clean up after itself.
//
// Three batches of netlink requests, each one system call and its acks
// (see rtnl): create the pair and look the ends' indexes up; then the
// host end's settings and the pod end's, at once, on a socket of each
// namespace. The pod namespace's socket is opened while the pair is
// created.
func (d *Netlink) Setup(p Pod) (Link, error) {
	hostName := p.HostVeth
	if !strings.HasPrefix(hostName, VethPrefix) || len(hostName) > 15 {
		return Link{}, fmt.Errorf("host veth name %q: want %s plus at most %d characters", hostName, VethPrefix, 15-len(VethPrefix))
	}
	nsh, err := netns.GetFromPath(p.Netns)
	if err != nil {
		return Link{}, &NetnsError{Path: p.Netns, Err: err}
	}
	defer nsh.Close()
	podSock := rtnlIn(nsh)
	var ps *rtnl
	podSocket := func() (*rtnl, error) {
		if ps == nil {
			r := <-podSock
			if r.err != nil {
				return nil, &NetnsError{Path: p.Netns, Err: r.err}
			}
			ps = r.s
		}
		return ps, nil
	}
	defer func() {
		if _, err := podSocket(); err == nil {
			ps.close()
		}
	}()

	// The agent picks both MACs before the kernel is touched (its record
	// has them); a caller that did not gets random ones, as the kernel
	// would pick.
	link := Link{HostVeth: hostName, HostMAC: p.HostMAC, PodMAC: p.PodMAC}
	if link.HostMAC == nil {
		link.HostMAC = RandomMAC()
	}
	if link.PodMAC == nil {
		link.PodMAC = RandomMAC()
	}
	hs, err := d.rtnl()
	if err != nil {
		return Link{}, err
	}
	defer d.putRtnl(hs)

	// One queue each way on both ends, which is what a veth uses anyway
	// unless XDP or GRO is turned on: with the kernel's default (a queue
	// per possible CPU) the kernel trims the active queues to one after
	// registering each end, and that waits for an expedited RCU grace
	// period — all CPUs interrupted, and most of the creation's time.
	var hostIdx, podIdx int32
	create := func() error {
		return hs.run([]request{
			newVeth(hostName, p.IfName, link.HostMAC, link.PodMAC, int(nsh)),
			getLink(hostName, func(index, peer int32) { hostIdx, podIdx = index, peer }),
		})
	}
	// Create first and look only when that fails: every netlink call
	// takes the kernel's rtnl lock, which all concurrent ADDs share.
	if err := create(); errors.Is(err, unix.EEXIST) {
		s, serr := podSocket()
		if serr != nil {
			return Link{}, serr
		}
		exists := false
		if err := s.run([]request{getLink(p.IfName, func(int32, int32) { exists = true })}); err == nil && exists {
			return Link{}, fmt.Errorf("interface %q already exists in netns %s: %w", p.IfName, p.Netns, ErrInterfaceExists)
		} else if err != nil && !errors.Is(err, unix.ENODEV) {
			return Link{}, fmt.Errorf("netns %s: %w", p.Netns, err)
		}
		// A leftover host veth of this name (a crashed earlier attempt).
		if err := d.deleteHostVeth(hostName); err != nil {
			return Link{}, err
		}
		if err := create(); err != nil {
			return Link{}, fmt.Errorf("veth %s/%s: %w", hostName, p.IfName, err)
		}
	} else if err != nil {
		return Link{}, fmt.Errorf("veth %s/%s: %w", hostName, p.IfName, err)
	}
	if hostIdx == 0 {
		return Link{}, fmt.Errorf("veth %s: created, but the kernel did not report it", hostName)
	}

	// The two ends are independent from here.
	podErr := make(chan error, 1)
	go func() {
		s, err := podSocket()
		if err == nil {
			err = s.run(podSide(p, podIdx, link.HostMAC))
			if err != nil {
				err = fmt.Errorf("netns %s: %s: %w", p.Netns, p.IfName, err)
			}
		}
		podErr <- err
	}()
	err = hs.run(hostSide(p, hostIdx, link.PodMAC))
	if perr := <-podErr; perr != nil {
		return Link{}, perr
	}
	if err != nil {
		return Link{}, fmt.Errorf("veth %s: %w", hostName, err)
	}
	return link, nil
}

// hostSide programs the host end: no kernel link-local, fe80::1, proxy
// ARP without delay (the default holds the first answer back up to
// 0.8 s), up, and a host route and pinned neighbour per pod IP (pinning
// the pod's MAC saves the first packet a neighbour lookup).
func hostSide(p Pod, index int32, podMAC net.HardwareAddr) []request {
	b := []request{
		setAddrGen(index, true),
		setProxyDelay(index, 0),
		addAddr(GatewayV6, 64, index, unix.IFA_F_NODAD, false),
		setUp(index),
	}
	for _, ip := range p.IPs {
		scope := uint8(unix.RT_SCOPE_UNIVERSE)
		if ip.Is4() {
			scope = unix.RT_SCOPE_LINK
		}
		b = append(b, addRoute(hostPrefix(ip), netip.Addr{}, index, uint8(RouteProtocol), scope),
			pinNeigh(ip, podMAC, index))
	}
	return b
}

// podSide programs the pod end: no kernel link-local, up, its addresses,
// and per family a pinned gateway neighbour and the default route through
// it (IPv4's gateway needs an on-link route first).
//
// Anycast IPs sit on eth0 too, not on lo, because the runtime's loopback
// plugin may run after flock's ADD (containerd attaches networks in
// parallel) and fails the sandbox when lo holds anything but loopback
// addresses. They come after the pod IPs: the IPv6 ones deprecated
// (preferred lifetime 0) so the pod never picks one as a source (RFC 6724
// rule 3) while it still accepts and binds it; the kernel picks the first
// IPv4 address, the pod's.
func podSide(p Pod, index int32, hostMAC net.HardwareAddr) []request {
	b := []request{setAddrGen(index, false), setUp(index)}
	for _, ip := range append(append([]netip.Addr{}, p.IPs...), p.Addresses...) {
		b = append(b, addAddr(ip, ip.BitLen(), index, uint32(addrFlags(ip)), false))
	}
	for _, ip := range p.Anycast {
		b = append(b, addAddr(ip, ip.BitLen(), index, uint32(addrFlags(ip)), ip.Is6()))
	}
	for _, ip := range p.IPs {
		gw := GatewayV6
		if ip.Is4() {
			gw = GatewayV4
			b = append(b, addRoute(hostPrefix(gw), netip.Addr{}, index, routeProtoPodDefault, unix.RT_SCOPE_LINK))
		}
		b = append(b, pinNeigh(gw, hostMAC, index),
			addRoute(netip.PrefixFrom(zero(ip), 0), gw, index, routeProtoPodDefault, unix.RT_SCOPE_UNIVERSE))
	}
	return b
}

func zero(ip netip.Addr) netip.Addr {
	if ip.Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

func (d *Netlink) deleteHostVeth(name string) error {
	// A socket of its own: unregistering waits an RCU grace period (~20 ms),
	// and a kept one would be lent out meanwhile.
	h := &netlink.Handle{}
	return onHostVeth(h, name, "delete", h.LinkDel)
}

// Retire takes a pod's host veth down: the kernel drops the routes through
// it and nothing passes, at the cost of a link change rather than the RCU
// grace period that unregistering it takes (Teardown). Missing is fine.
func (d *Netlink) Retire(hostVeth string) error {
	h := d.host()
	defer d.put(h)
	return onHostVeth(h, hostVeth, "take down", h.LinkSetDown)
}

// onHostVeth applies op to the veth called name; a missing link is fine,
// a link of that name that is not a veth is refused.
func onHostVeth(h *netlink.Handle, name, what string, op func(netlink.Link) error) error {
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if l.Type() != "veth" {
		return fmt.Errorf("%s exists but is a %s, not a veth: refusing to %s it", name, l.Type(), what)
	}
	if err := op(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("%s %s: %w", what, name, err)
	}
	return nil
}

// Teardown removes a pod's host veth; the pod end, the host routes and the
// neighbour entries go with it. Missing objects are not errors.
func (d *Netlink) Teardown(hostVeth string) error { return d.deleteHostVeth(hostVeth) }
