package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// The full repair reads every flock route of the node (10,000 on a loaded
// one) every 30 s. Decoding each into a netlink.Route, with its slices and
// IPNets, was most of what an idle agent spent and allocated; this reads
// the dump in place and allocates nothing per route.

// hop is one next hop of a dumped route.
type hop struct {
	idx int
	gw  netip.Addr
}

// errDumpInterrupted: the routes changed during the dump, which may have
// missed or repeated some.
var errDumpInterrupted = errors.New("route dump interrupted by a change")

// dumpGatewayRoutes calls f for every unicast route of the main table with
// protocol RouteProtocol and at least one next hop through a gateway or a
// multipath set, in family (unix.AF_INET or AF_INET6). The hops slice is
// reused between calls. The kernel filters by protocol, type and table
// when it checks dump requests strictly (Linux 4.20 and later); the same
// checks run here for older ones.
func dumpGatewayRoutes(family int, f func(dst netip.Prefix, hops []hop)) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("route dump: socket: %w", err)
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("route dump: bind: %w", err)
	}
	ne := binary.NativeEndian
	const reqLen = unix.SizeofNlMsghdr + unix.SizeofRtMsg + unix.SizeofRtAttr + 4
	req := make([]byte, reqLen)
	ne.PutUint32(req[0:], reqLen)
	ne.PutUint16(req[4:], unix.RTM_GETROUTE)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(req[8:], 1) // sequence
	rt := req[unix.SizeofNlMsghdr:]
	rt[0], rt[4], rt[5], rt[7] = byte(family), unix.RT_TABLE_MAIN, byte(RouteProtocol), unix.RTN_UNICAST
	attr := rt[unix.SizeofRtMsg:]
	ne.PutUint16(attr[0:], unix.SizeofRtAttr+4)
	ne.PutUint16(attr[2:], unix.RTA_TABLE)
	ne.PutUint32(attr[4:], unix.RT_TABLE_MAIN)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("route dump: send: %w", err)
	}

	buf := make([]byte, 64<<10) // a dump's datagrams are at most 32 KiB
	hops := make([]hop, 0, 8)
	interrupted := false
	for {
		n, _, rflags, from, err := unix.Recvmsg(fd, buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("route dump: receive: %w", err)
		}
		if rflags&unix.MSG_TRUNC != 0 {
			return fmt.Errorf("route dump: a datagram longer than %d bytes", len(buf))
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not the kernel's
		}
		for b := buf[:n]; len(b) >= unix.SizeofNlMsghdr; {
			l := int(ne.Uint32(b[0:]))
			if l < unix.SizeofNlMsghdr || l > len(b) {
				return fmt.Errorf("route dump: malformed message (length %d of %d)", l, len(b))
			}
			typ, flags, seq, body := ne.Uint16(b[4:]), ne.Uint16(b[6:]), ne.Uint32(b[8:]), b[unix.SizeofNlMsghdr:l]
			b = b[min(nlAlign(l), len(b)):]
			if seq != 1 {
				continue // not an answer to this request
			}
			if flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch typ {
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				if len(body) >= 4 {
					if errno := -int32(ne.Uint32(body)); errno > 0 {
						return fmt.Errorf("route dump: %w", unix.Errno(errno))
					}
				}
				if interrupted {
					return errDumpInterrupted
				}
				return nil
			case unix.RTM_NEWROUTE:
				if dst, ok := parseGatewayRoute(family, body, &hops); ok {
					f(dst, hops)
				}
			}
		}
	}
}

// parseGatewayRoute reads an RTM_NEWROUTE body into its destination and
// next hops; ok is false for a route dumpGatewayRoutes does not report (a
// kernel without IPv6 answers an IPv6 dump with every family's routes; a
// cached route is not one flock installed).
func parseGatewayRoute(family int, b []byte, hops *[]hop) (netip.Prefix, bool) {
	if len(b) < unix.SizeofRtMsg {
		return netip.Prefix{}, false
	}
	dstLen, table, proto, typ := int(b[1]), uint32(b[4]), b[5], b[7]
	if int(b[0]) != family || proto != byte(RouteProtocol) || typ != unix.RTN_UNICAST ||
		binary.NativeEndian.Uint32(b[8:])&unix.RTM_F_CLONED != 0 {
		return netip.Prefix{}, false
	}
	*hops = (*hops)[:0]
	var dst, gw []byte
	oif := 0
	whole := eachAttr(b[unix.SizeofRtMsg:], func(t uint16, v []byte) {
		switch t {
		case unix.RTA_DST:
			dst = v
		case unix.RTA_TABLE:
			if len(v) == 4 {
				table = binary.NativeEndian.Uint32(v)
			}
		case unix.RTA_OIF:
			if len(v) == 4 {
				oif = int(int32(binary.NativeEndian.Uint32(v)))
			}
		case unix.RTA_GATEWAY:
			gw = v
		case unix.RTA_MULTIPATH:
			parseMultipath(v, hops)
		}
	})
	if !whole {
		return netip.Prefix{}, false
	}
	addr, ok := netip.AddrFromSlice(dst)
	if table != unix.RT_TABLE_MAIN || !ok {
		return netip.Prefix{}, false
	}
	if g, ok := netip.AddrFromSlice(gw); ok {
		*hops = append(*hops, hop{oif, g.Unmap()})
	}
	if len(*hops) == 0 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(addr.Unmap(), dstLen), true
}

// parseMultipath appends the next hops of an RTA_MULTIPATH value (struct
// rtnexthop, each followed by its attributes); one without a gateway has
// an invalid gw.
func parseMultipath(v []byte, hops *[]hop) {
	const sizeofRtNexthop = 8
	for len(v) >= sizeofRtNexthop {
		l := int(binary.NativeEndian.Uint16(v[0:]))
		if l < sizeofRtNexthop || l > len(v) {
			return
		}
		h := hop{idx: int(int32(binary.NativeEndian.Uint32(v[4:])))}
		eachAttr(v[sizeofRtNexthop:l], func(t uint16, a []byte) {
			if t == unix.RTA_GATEWAY {
				h.gw, _ = netip.AddrFromSlice(a)
				h.gw = h.gw.Unmap()
			}
		})
		*hops = append(*hops, h)
		v = v[min(nlAlign(l), len(v)):]
	}
}

// eachAttr calls f with the type and value of each route attribute in a,
// up to a malformed one (then it returns false).
func eachAttr(a []byte, f func(typ uint16, v []byte)) bool {
	for len(a) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(a[0:]))
		if l < unix.SizeofRtAttr || l > len(a) {
			return false
		}
		f(binary.NativeEndian.Uint16(a[2:])&nlaTypeMask, a[unix.SizeofRtAttr:l])
		a = a[min(nlAlign(l), len(a)):]
	}
	return true
}

func nlAlign(n int) int { return (n + 3) &^ 3 }

// nlaTypeMask clears an attribute type's nested and byte-order flags.
const nlaTypeMask = 0x3fff
