// Package dataplane programs the kernel for flock over netlink: the routed
// veth of each pod, the host routes towards it, anycast ECMP routes and the
// node summary blackholes. It holds no state of its own: every call is
// idempotent and reads what it needs from the kernel, so the control logic
// (package agent) can be tested against a fake without root.
package dataplane

import (
	"cmp"
	"crypto/rand"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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
	Anycast     []netip.Addr // on the pod's eth0 (see podSide)
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
	rtnls   chan *rtnl           // the same for Setup's batches
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
	d.init()
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

func (d *Netlink) init() {
	d.once.Do(func() {
		d.handles = make(chan *netlink.Handle, keptHandles)
		d.rtnls = make(chan *rtnl, keptHandles)
	})
}

// rtnl lends a kept batch socket of the agent's namespace (see host);
// putRtnl gives it back.
func (d *Netlink) rtnl() (*rtnl, error) {
	d.init()
	select {
	case s := <-d.rtnls:
		return s, nil
	default:
	}
	return newRtnl()
}

// putRtnl keeps s unless enough are kept or it broke (a batch that
// timed out may still be answered on it).
func (d *Netlink) putRtnl(s *rtnl) {
	if !s.broken {
		select {
		case d.rtnls <- s:
			return
		default:
		}
	}
	s.close()
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
