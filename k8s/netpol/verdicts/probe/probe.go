// Package probe asks the kernel for its verdicts: a network namespace
// whose output hook runs a table, and raw sockets that send packets with
// any addresses through it. A packet the table drops makes sendto fail
// with EPERM. For tests (root).
package probe

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Packet is what a verdict depends on; ports only for TCP, UDP, SCTP.
type Packet struct {
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
}

// NeedRoot skips t without root, or fails it when FLOCK_REQUIRE_ROOT is set.
func NeedRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		if os.Getenv("FLOCK_REQUIRE_ROOT") != "" {
			t.Fatal("needs root (network namespaces, nftables)")
		}
		t.Skip("needs root (network namespaces, nftables)")
	}
}

// Lab is a network namespace and raw sockets in it.
type Lab struct {
	NS   netns.NsHandle
	raw4 int
	raw6 int
	// Sent counts the packets sent.
	Sent int
}

// New makes a Lab, removed when t ends.
func New(t testing.TB) *Lab {
	t.Helper()
	NeedRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // and switches this thread into it
	if err != nil {
		t.Fatal(err)
	}
	l := &Lab{NS: ns}
	t.Cleanup(func() { ns.Close() })
	defer netns.Set(orig)
	lo, _ := netlink.LinkByName("lo")
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	// This kernel has veth but no dummy: the far end stays down, and
	// nothing is ever delivered.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "out0"}, PeerName: "out1"}); err != nil {
		t.Fatal(err)
	}
	out, _ := netlink.LinkByName("out0")
	if err := netlink.LinkSetUp(out); err != nil {
		t.Fatal(err)
	}
	// Default routes through a neighbour that is always resolved: a
	// packet waiting for neighbour discovery would hold the socket's
	// buffer for seconds.
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 2}
	for _, gw := range []string{"169.254.0.2", "fe80::2"} {
		ip := net.ParseIP(gw)
		fam := netlink.FAMILY_V6
		if ip.To4() != nil {
			fam = netlink.FAMILY_V4
		}
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: out.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT, IP: ip, HardwareAddr: mac}); err != nil {
			t.Fatalf("neighbour %s: %v", gw, err)
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: out.Attrs().Index, Gw: ip, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
			t.Fatalf("default route via %s: %v", gw, err)
		}
	}
	if l.raw4, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW); err != nil {
		t.Fatal(err)
	}
	if l.raw6, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_RAW); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(l.raw4); unix.Close(l.raw6) })
	return l
}

// packetBytes is k as it leaves: an IP header and a transport header.
func packetBytes(k Packet) []byte {
	var l4 []byte
	switch k.Proto {
	case unix.IPPROTO_TCP:
		l4 = make([]byte, 20)
		l4[12], l4[13] = 5<<4, 0x02 // data offset 5, SYN
	case unix.IPPROTO_UDP:
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[4:], 8)
	case unix.IPPROTO_SCTP:
		l4 = make([]byte, 12)
	default: // ICMP, ICMPv6: an echo request
		l4 = make([]byte, 8)
		l4[0] = 8
		if k.Dst.Is6() {
			l4[0] = 128
		}
	}
	if k.Proto == unix.IPPROTO_TCP || k.Proto == unix.IPPROTO_UDP || k.Proto == unix.IPPROTO_SCTP {
		binary.BigEndian.PutUint16(l4[0:], k.SrcPort)
		binary.BigEndian.PutUint16(l4[2:], k.DstPort)
	}
	if k.Dst.Is4() {
		h := make([]byte, 20)
		h[0], h[8], h[9] = 0x45, 64, k.Proto
		binary.BigEndian.PutUint16(h[2:], uint16(20+len(l4)))
		s, d := k.Src.As4(), k.Dst.As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		return append(h, l4...)
	}
	h := make([]byte, 40)
	h[0], h[6], h[7] = 0x60, k.Proto, 64
	binary.BigEndian.PutUint16(h[4:], uint16(len(l4)))
	s, d := k.Src.As16(), k.Dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(h, l4...)
}

// Allows sends k: the kernel's verdict.
func (l *Lab) Allows(t testing.TB, k Packet) bool {
	t.Helper()
	var err error
	if k.Dst.Is4() {
		err = unix.Sendto(l.raw4, packetBytes(k), 0, &unix.SockaddrInet4{Addr: k.Dst.As4()})
	} else {
		err = unix.Sendto(l.raw6, packetBytes(k), 0, &unix.SockaddrInet6{Addr: k.Dst.As16()})
	}
	l.Sent++
	switch {
	case err == nil:
		return true
	case errors.Is(err, unix.EPERM):
		return false
	}
	t.Fatalf("send %v: %v", k, err)
	return false
}
