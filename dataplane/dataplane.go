// Package dataplane programs the kernel for flock over netlink: the routed
// veth of each pod, the host routes towards it, anycast ECMP routes and the
// node summary blackholes. It holds no state of its own: every call is
// idempotent and reads what it needs from the kernel, so the control logic
// (package agent) can be tested against a fake without root.
package dataplane

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RouteProtocol marks every route flock installs (see `ip route show proto
// 70`), so that stale ones can be found after a crash without touching
// routes that belong to someone else.
const RouteProtocol netlink.RouteProtocol = 70

// VethPrefix starts every host-side veth name.
const VethPrefix = "flock"

// Gateway addresses the pod routes through. fe80::1 lives on every host
// veth; 169.254.1.1 is answered by proxy ARP (and pinned by a permanent
// neighbour entry in the pod, so it works even on a node without a default
// route).
var (
	GatewayV6 = netip.MustParseAddr("fe80::1")
	GatewayV4 = netip.MustParseAddr("169.254.1.1")
)

// HostVethName is the host-side veth of a container: "flock" + 8 hex digits
// of FNV-1a-32 of the container ID.
func HostVethName(containerID string) string { return ProbeVethName(containerID, 0) }

// ProbeVethName is the container's n-th candidate host veth name: n = 0 is
// HostVethName; on a hash collision with another live container the agent
// takes the first free n > 0 (the FNV-1a-32 of "<containerID>#<n>") and
// records the name it took, so every later step uses that name.
func ProbeVethName(containerID string, n int) string {
	h := fnv.New32a()
	h.Write([]byte(containerID))
	if n > 0 {
		fmt.Fprintf(h, "#%d", n)
	}
	return fmt.Sprintf("%s%08x", VethPrefix, h.Sum32())
}

// Pod is the desired network of one pod attachment.
type Pod struct {
	ContainerID string
	HostVeth    string // host-side veth name (the agent picks it, see ProbeVethName)
	Netns       string // path
	IfName      string
	IPs         []netip.Addr // /128 and /32 on IfName
	Addresses   []netip.Addr // extra addresses on IfName
	Anycast     []netip.Addr // on the pod's eth0 (anycastAddr)
	// HostMAC and PodMAC, if set, are the veth ends' MACs (the agent picks
	// them before the kernel is touched, so the pending record is whole);
	// unset, the kernel picks them.
	HostMAC, PodMAC net.HardwareAddr
}

// Link describes the veth pair Setup created.
type Link struct {
	HostVeth string
	HostMAC  net.HardwareAddr
	PodMAC   net.HardwareAddr
}

// Nexthop of a route towards a pod.
type Nexthop struct {
	Gateway netip.Addr
	Dev     string
}

// CompareNexthops orders next hops by gateway, then device.
func CompareNexthops(a, b Nexthop) int {
	return cmp.Or(a.Gateway.Compare(b.Gateway), strings.Compare(a.Dev, b.Dev))
}

// Netlink is the real dataplane, acting on the agent's own (node) netns.
type Netlink struct {
	Log *slog.Logger
	// ProcSys is the sysctl tree, "/proc/sys" unless a test says otherwise.
	ProcSys string

	once    sync.Once
	handles chan *netlink.Handle // kept sockets of the node's netns, idle
	// routes is how many prefixes the last HostRoutes found: the next
	// one's map starts at that size instead of growing there.
	routes atomic.Int64
}

// keptHandles bounds the idle sockets kept: about the ADDs a node runs at
// once.
const keptHandles = 8

// host lends a netlink handle of the agent's namespace that keeps its
// socket (the package-level calls open and close one per request, which
// every ADD pays a dozen times over); put gives it back. A handle runs one
// request at a time, so concurrent ADDs each get their own: unrelated
// pods' netlink work never waits on a lock of ours.
func (d *Netlink) host() *netlink.Handle {
	d.once.Do(func() { d.handles = make(chan *netlink.Handle, keptHandles) })
	select {
	case h := <-d.handles:
		return h
	default:
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err == nil {
		// A lost reply must not hold the socket for ever.
		err = h.SetSocketTimeout(10 * time.Second)
	}
	if err != nil {
		d.log().Warn("netlink: no kept socket; a socket per request", "err", err)
		return perRequest
	}
	return h
}

// perRequest opens a socket per request, as the package-level calls do:
// the stand-in when a socket cannot be kept.
var perRequest = &netlink.Handle{}

// put returns a handle host lent, closing it if enough are kept (a
// socket-per-request stand-in is not kept).
func (d *Netlink) put(h *netlink.Handle) {
	if h == perRequest {
		return
	}
	select {
	case d.handles <- h:
	default:
		h.Close()
	}
}

func (d *Netlink) log() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.Default()
}

func (d *Netlink) sysctl(key, value string) error {
	root := d.ProcSys
	if root == "" {
		root = "/proc/sys"
	}
	p := filepath.Join(root, strings.ReplaceAll(key, ".", "/"))
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// RandomMAC is a random locally administered unicast MAC, as the kernel
// picks for a veth.
func RandomMAC() net.HardwareAddr {
	m := make(net.HardwareAddr, 6)
	_, _ = rand.Read(m)
	m[0] = m[0]&^0x01 | 0x02
	return m
}

// NetnsError reports a netns path that cannot be opened.
type NetnsError struct {
	Path string
	Err  error
}

func (e *NetnsError) Error() string { return fmt.Sprintf("netns %q: %v", e.Path, e.Err) }
func (e *NetnsError) Unwrap() error { return e.Err }

func openNetns(path string) (netns.NsHandle, *netlink.Handle, error) {
	nsh, err := netns.GetFromPath(path)
	if err != nil {
		return 0, nil, &NetnsError{Path: path, Err: err}
	}
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE) // not the XFRM and netfilter sockets too
	if err != nil {
		nsh.Close()
		return 0, nil, &NetnsError{Path: path, Err: err}
	}
	return nsh, h, nil
}

func hostPrefix(ip netip.Addr) netip.Prefix { return netip.PrefixFrom(ip, ip.BitLen()) }

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func family(ip netip.Addr) int {
	if ip.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

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
	links, err := netlink.LinkList()
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
		rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		out = append(out, rs...)
	}
	return out, nil
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

// WatchLinks calls gone with the name of every flock veth that disappears
// from the node until ctx ends (a pod's netns destroyed without a DEL takes
// its veth, and the kernel the routes through it, without telling anyone).
// When events may have been lost (the subscription broke and is renewed,
// or the kernel dropped notifications) it calls gone(""). Watching is best
// effort: the periodic repair is the safety net, so a failing
// subscription is retried, never fatal.
func (d *Netlink) WatchLinks(ctx context.Context, gone func(name string)) error {
	backoff := time.Second
	for first := true; ; first = false {
		err := watchDeletedLinks(ctx, !first, gone)
		if ctx.Err() != nil {
			return nil
		}
		d.log().Warn("link watch interrupted; renewing", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// watchDeletedLinks reads link notifications on a socket of its own and
// looks only at RTM_DELLINK: every ADD causes several RTM_NEWLINKs, and
// decoding each whole (as a generic link subscription does) was most of
// what the agent allocated in a burst of ADDs.
func watchDeletedLinks(ctx context.Context, renewed bool, gone func(string)) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("link watch: socket: %w", err)
	}
	// Through the runtime's poller: an idle node's watch costs nothing (a
	// receive timeout to notice ctx was ~0.1 % of a core).
	f := os.NewFile(uintptr(fd), "link-watch")
	defer f.Close()
	// A burst of ADDs must not overflow it (a drop costs a full re-read).
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_LINK - 1)}); err != nil {
		return fmt.Errorf("link watch: subscribe: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	if renewed {
		gone("")
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, unix.ENOBUFS):
			gone("") // the kernel dropped notifications
			continue
		case err != nil:
			return fmt.Errorf("link watch: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("link watch: %w", err)
		}
		for i := range msgs {
			if msgs[i].Header.Type != unix.RTM_DELLINK {
				continue
			}
			if name := deletedLinkName(&msgs[i]); strings.HasPrefix(name, VethPrefix) {
				gone(name)
			}
		}
	}
}

// deletedLinkName is the IFLA_IFNAME of an RTM_DELLINK message.
func deletedLinkName(m *syscall.NetlinkMessage) string {
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return ""
	}
	for _, a := range attrs {
		if a.Attr.Type == unix.IFLA_IFNAME {
			return strings.TrimRight(string(a.Value), "\x00")
		}
	}
	return ""
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
