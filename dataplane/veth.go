package dataplane

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// anycastAddr is an anycast IP as it sits on the pod's eth0, after the pod
// IPs: there, not on lo, because the runtime's loopback plugin may run
// after flock's ADD (containerd attaches networks in parallel) and fails
// the sandbox when lo holds anything but loopback addresses. The IPv6 one
// is deprecated (preferred lifetime 0) so the pod never picks it as a
// source (RFC 6724 rule 3) while it still accepts and binds it; the IPv4
// one comes after the pod IP, which the kernel picks first.
func anycastAddr(ip netip.Addr) *netlink.Addr {
	a := &netlink.Addr{IPNet: ipnet(hostPrefix(ip)), Flags: addrFlags(ip)}
	if ip.Is6() {
		a.PreferedLft, a.ValidLft = 0, infiniteLifetime
	}
	return a
}

// infiniteLifetime is the kernel's "forever" for an address lifetime.
// (netlink.Addr holds it in an int: on 32-bit platforms 68 years.)
const infiniteLifetime = min(math.MaxInt, 0xffffffff)

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
func (d *Netlink) Setup(p Pod) (Link, error) {
	hostName := p.HostVeth
	if !strings.HasPrefix(hostName, VethPrefix) || len(hostName) > 15 {
		return Link{}, fmt.Errorf("host veth name %q: want %s plus at most %d characters", hostName, VethPrefix, 15-len(VethPrefix))
	}
	h := d.host()
	defer d.put(h)
	nsh, ph, err := openNetns(p.Netns)
	if err != nil {
		return Link{}, err
	}
	defer nsh.Close()
	defer ph.Delete()

	// One queue each way on both ends, which is what a veth uses anyway
	// unless XDP or GRO is turned on: with the kernel's default (a queue
	// per possible CPU) the kernel trims the active queues to one after
	// registering each end, and that waits for an expedited RCU grace
	// period — all CPUs interrupted, and most of the creation's time.
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: hostName, HardwareAddr: p.HostMAC, NumTxQueues: vethQueues, NumRxQueues: vethQueues},
		PeerName:         p.IfName,
		PeerNamespace:    netlink.NsFd(int(nsh)),
		PeerHardwareAddr: p.PodMAC,
		PeerNumTxQueues:  vethQueues,
		PeerNumRxQueues:  vethQueues,
	}
	// Create first and look only when that fails: every netlink call
	// takes the kernel's rtnl lock, which all concurrent ADDs share.
	if err := h.LinkAdd(veth); errors.Is(err, unix.EEXIST) {
		if _, err := ph.LinkByName(p.IfName); err == nil {
			return Link{}, fmt.Errorf("interface %q already exists in netns %s: %w", p.IfName, p.Netns, ErrInterfaceExists)
		}
		// A leftover host veth of this name (a crashed earlier attempt).
		if err := d.deleteHostVeth(hostName); err != nil {
			return Link{}, err
		}
		err = h.LinkAdd(veth)
		if err != nil {
			return Link{}, fmt.Errorf("create veth %s/%s: %w", hostName, p.IfName, err)
		}
	} else if err != nil {
		return Link{}, fmt.Errorf("create veth %s/%s: %w", hostName, p.IfName, err)
	}
	// LinkAdd looked the host end's index up already.
	var host netlink.Link = veth
	if veth.Index == 0 || p.HostMAC == nil {
		if host, err = h.LinkByName(hostName); err != nil {
			return Link{}, fmt.Errorf("veth %s: %w", hostName, err)
		}
	}
	link := Link{HostVeth: hostName, HostMAC: host.Attrs().HardwareAddr, PodMAC: p.PodMAC}
	// The two ends are independent from here: program the pod's while the
	// host's is done (each request is a round trip to the kernel). The
	// host end needs the pod's MAC: the one asked for, else the kernel's.
	podMAC := make(chan net.HardwareAddr, 1)
	if p.PodMAC != nil {
		podMAC <- p.PodMAC
	}
	podErr := make(chan error, 1)
	go func() {
		defer close(podErr)
		defer close(podMAC)
		pod, err := ph.LinkByName(p.IfName)
		if err != nil {
			podErr <- fmt.Errorf("netns %s: %s: %w", p.Netns, p.IfName, err)
			return
		}
		link.PodMAC = pod.Attrs().HardwareAddr
		if p.PodMAC == nil {
			podMAC <- link.PodMAC
		}
		if err := d.setupPodSide(ph, pod, p, link.HostMAC); err != nil {
			podErr <- fmt.Errorf("netns %s: %w", p.Netns, err)
		}
	}()
	if err := d.setupHostSide(h, host, p, podMAC); err != nil {
		if perr := <-podErr; perr != nil {
			return Link{}, perr // the cause, when the host end only waited for it
		}
		return Link{}, err
	}
	if err := <-podErr; err != nil {
		return Link{}, err
	}
	return link, nil
}

// setupHostSide programs the host end: no kernel link-local, fe80::1,
// proxy ARP, up, and a host route and pinned neighbour per pod IP (the
// pod's MAC comes from podMAC; closed empty, the pod end failed).
func (d *Netlink) setupHostSide(h *netlink.Handle, host netlink.Link, p Pod, podMACs <-chan net.HardwareAddr) error {
	hostName := p.HostVeth
	// No kernel link-local on either end: the host end has exactly fe80::1,
	// the pod end only its /128.
	if err := h.LinkSetIP6AddrGenMode(host, 1); err != nil {
		return fmt.Errorf("veth %s: addr_gen_mode: %w", hostName, err)
	}
	if err := d.sysctl("net.ipv4.conf."+hostName+".proxy_arp", "1"); err != nil {
		return err
	}
	// The default proxy_delay holds the first ARP answer back up to 0.8 s.
	if err := d.sysctl("net.ipv4.neigh."+hostName+".proxy_delay", "0"); err != nil {
		return err
	}
	gw6 := &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(GatewayV6, 64)), Flags: unix.IFA_F_NODAD}
	if err := h.AddrReplace(host, gw6); err != nil {
		return fmt.Errorf("veth %s: add %s/64: %w", hostName, GatewayV6, err)
	}
	if err := h.LinkSetUp(host); err != nil {
		return fmt.Errorf("veth %s: up: %w", hostName, err)
	}

	podMAC, ok := <-podMACs
	if !ok {
		return fmt.Errorf("veth %s: the pod end failed", hostName)
	}
	for _, ip := range p.IPs {
		r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipnet(hostPrefix(ip)), Protocol: RouteProtocol}
		if ip.Is4() {
			r.Scope = netlink.SCOPE_LINK
		}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("host route %s dev %s: %w", hostPrefix(ip), hostName, err)
		}
		// Pinning the pod's MAC saves the first packet a neighbour lookup.
		n := &netlink.Neigh{LinkIndex: host.Attrs().Index, Family: family(ip), State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: podMAC}
		if err := h.NeighSet(n); err != nil {
			return fmt.Errorf("neighbour %s on %s: %w", ip, hostName, err)
		}
	}
	return nil
}

func (d *Netlink) setupPodSide(h *netlink.Handle, pod netlink.Link, p Pod, hostMAC net.HardwareAddr) error {
	if err := h.LinkSetIP6AddrGenMode(pod, 1); err != nil {
		return fmt.Errorf("%s: addr_gen_mode: %w", p.IfName, err)
	}
	if err := h.LinkSetUp(pod); err != nil {
		return fmt.Errorf("%s: up: %w", p.IfName, err)
	}
	idx := pod.Attrs().Index
	for _, ip := range append(append([]netip.Addr{}, p.IPs...), p.Addresses...) {
		a := &netlink.Addr{IPNet: ipnet(hostPrefix(ip)), Flags: addrFlags(ip)}
		if err := h.AddrReplace(pod, a); err != nil {
			return fmt.Errorf("%s: add %s: %w", p.IfName, hostPrefix(ip), err)
		}
	}
	for _, ip := range p.Anycast {
		if err := h.AddrReplace(pod, anycastAddr(ip)); err != nil {
			return fmt.Errorf("%s: add anycast %s: %w", p.IfName, hostPrefix(ip), err)
		}
	}
	for _, ip := range p.IPs {
		gw := GatewayV6
		if ip.Is4() {
			gw = GatewayV4
			onlink := &netlink.Route{LinkIndex: idx, Dst: ipnet(hostPrefix(gw)), Scope: netlink.SCOPE_LINK}
			if err := h.RouteReplace(onlink); err != nil {
				return fmt.Errorf("route %s dev %s: %w", hostPrefix(gw), p.IfName, err)
			}
		}
		n := &netlink.Neigh{LinkIndex: idx, Family: family(gw), State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: hostMAC}
		if err := h.NeighSet(n); err != nil {
			return fmt.Errorf("neighbour %s on %s: %w", gw, p.IfName, err)
		}
		def := &netlink.Route{LinkIndex: idx, Dst: ipnet(netip.PrefixFrom(zero(ip), 0)), Gw: gw.AsSlice()}
		if err := h.RouteReplace(def); err != nil {
			return fmt.Errorf("default route via %s dev %s: %w", gw, p.IfName, err)
		}
	}
	return nil
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
