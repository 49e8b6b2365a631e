package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// rtnl is a NETLINK_ROUTE socket that sends a batch of requests in one
// system call and reads their acknowledgements together. Setup's dozen
// requests per veth end cost a round trip each through vishvananda/netlink
// (and a getsockname each): the kernel runs a batch in order, so a request
// that needs an earlier one's result (a default route via the gateway's
// on-link route) finds it done. One goroutine uses a socket at a time.
type rtnl struct {
	fd     int
	seq    uint32
	buf    []byte
	broken bool // a send or receive failed: answers may be out of step
}

// rtnlTimeout bounds a wait for the kernel's answer: a lost one must not
// hold an ADD for ever.
const rtnlTimeout = 10 * time.Second

// newRtnl opens a socket in the calling thread's network namespace.
func newRtnl() (*rtnl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	s := &rtnl{fd: fd}
	tv := unix.NsecToTimeval(rtnlTimeout.Nanoseconds())
	for _, o := range []struct {
		level, opt, v int
	}{
		{unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1}, // the kernel's reason for an error
		{unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1}, // an error does not echo the request
	} {
		// Old kernels lack these; the errors are then the errno alone.
		_ = unix.SetsockoptInt(fd, o.level, o.opt, o.v)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		s.close()
		return nil, fmt.Errorf("netlink socket: receive timeout: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		s.close()
		return nil, fmt.Errorf("netlink socket: bind: %w", err)
	}
	return s, nil
}

// opened is a socket rtnlIn opened, or why it could not.
type opened struct {
	s   *rtnl
	err error
}

// rtnlIn opens a socket in the network namespace ns, on a goroutine of its
// own (the caller goes on meanwhile): a socket stays in the namespace it
// was created in, so that goroutine's thread is switched there and back.
// A thread that cannot be switched back is left locked, and ends with the
// goroutine.
func rtnlIn(ns netns.NsHandle) <-chan opened {
	ch := make(chan opened, 1)
	go func() {
		runtime.LockOSThread()
		own, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- opened{err: fmt.Errorf("own netns: %w", err)}
			return
		}
		defer own.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			ch <- opened{err: fmt.Errorf("enter netns: %w", err)}
			return
		}
		s, err := newRtnl()
		if rerr := netns.Set(own); rerr != nil {
			if s != nil {
				s.close()
			}
			ch <- opened{err: fmt.Errorf("leave netns: %w", rerr)}
			return // still locked: the thread goes with this goroutine
		}
		runtime.UnlockOSThread()
		ch <- opened{s, err}
	}()
	return ch
}

func (s *rtnl) close() { unix.Close(s.fd) }

// request is one message of a batch.
type request struct {
	msg  []byte // header first; run sets the length and sequence number
	what string // names the request in its error
	// reply, if set, gets the kernel's answer to a GET (the message's
	// type and payload).
	reply func(typ uint16, data []byte)
}

// run sends the batch and waits for every request's acknowledgement; the
// first failure (in batch order) is returned, naming its request and
// wrapping the errno. The kernel runs the requests after a failed one too:
// the caller undoes the whole batch's work on error.
func (s *rtnl) run(batch []request) error {
	var out []byte
	first := s.seq + 1
	for i := range batch {
		s.seq++
		m := batch[i].msg
		binary.NativeEndian.PutUint32(m[0:4], uint32(len(m)))
		binary.NativeEndian.PutUint32(m[8:12], s.seq)
		out = append(out, m...)
	}
	if err := unix.Sendto(s.fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		s.broken = true
		return fmt.Errorf("netlink send: %w", err)
	}
	errs := make([]error, len(batch))
	pending := len(batch)
	if s.buf == nil {
		s.buf = make([]byte, 64<<10)
	}
	for pending > 0 {
		n, from, err := unix.Recvfrom(s.fd, s.buf, 0)
		if err != nil {
			s.broken = true
			if errors.Is(err, unix.EAGAIN) {
				err = fmt.Errorf("no answer within %v: %w", rtnlTimeout, err)
			}
			return fmt.Errorf("netlink receive (%s): %w", batch[len(batch)-pending].what, err)
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not the kernel's
		}
		b := s.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				s.broken = true
				return fmt.Errorf("netlink receive: malformed message (length %d of %d)", l, len(b))
			}
			typ := binary.NativeEndian.Uint16(b[4:6])
			flags := binary.NativeEndian.Uint16(b[6:8])
			seq := binary.NativeEndian.Uint32(b[8:12])
			data := b[unix.NLMSG_HDRLEN:l]
			b = b[min(nlAlign(l), len(b)):]
			i := int(seq - first)
			if seq < first || i >= len(batch) {
				continue // an earlier batch's, or another's
			}
			switch typ {
			case unix.NLMSG_ERROR:
				if len(data) < 4 {
					return fmt.Errorf("netlink receive (%s): short error message", batch[i].what)
				}
				if errno := -int32(binary.NativeEndian.Uint32(data[0:4])); errno != 0 {
					errs[i] = ackError(batch[i].what, unix.Errno(errno), flags, data)
				}
				pending--
			case unix.NLMSG_DONE, unix.NLMSG_NOOP:
			default:
				if batch[i].reply != nil {
					batch[i].reply(typ, data)
				}
			}
		}
	}
	return firstErr(errs)
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ackError is a failed request's error: what, the errno, and the kernel's
// own words when it gave them (an extended ack).
func ackError(what string, errno unix.Errno, flags uint16, data []byte) error {
	msg := ""
	if flags&unix.NLM_F_ACK_TLVS != 0 {
		// struct nlmsgerr: the errno, the request's header, and its
		// payload unless capped; then the attributes.
		off := 4 + unix.NLMSG_HDRLEN
		if flags&unix.NLM_F_CAPPED == 0 && len(data) >= off {
			off = 4 + int(binary.NativeEndian.Uint32(data[4:8]))
		}
		if off <= len(data) {
			eachAttr(data[nlAlign(off):], func(typ uint16, v []byte) {
				if typ == unix.NLMSGERR_ATTR_MSG {
					msg = string(trimNul(v))
				}
			})
		}
	}
	if msg != "" {
		return fmt.Errorf("%s: %w (%s)", what, errno, msg)
	}
	return fmt.Errorf("%s: %w", what, errno)
}

func trimNul(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

// msg builds a netlink request: header, fixed part, attributes.
type msg struct {
	b     []byte
	nests []int // open nested attributes' offsets
}

// newMsg starts a request of type typ with flags (NLM_F_REQUEST and
// NLM_F_ACK added) and the fixed part fixed.
func newMsg(typ, flags uint16, fixed []byte) *msg {
	m := &msg{b: make([]byte, unix.NLMSG_HDRLEN, 256)}
	binary.NativeEndian.PutUint16(m.b[4:6], typ)
	binary.NativeEndian.PutUint16(m.b[6:8], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	m.b = append(m.b, fixed...)
	m.pad()
	return m
}

func (m *msg) pad() {
	for len(m.b)%4 != 0 {
		m.b = append(m.b, 0)
	}
}

func (m *msg) attr(typ uint16, v []byte) *msg {
	m.b = binary.NativeEndian.AppendUint16(m.b, uint16(unix.SizeofRtAttr+len(v)))
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	m.b = append(m.b, v...)
	m.pad()
	return m
}

func (m *msg) u8(typ uint16, v uint8) *msg { return m.attr(typ, []byte{v}) }
func (m *msg) u32(typ uint16, v uint32) *msg {
	return m.attr(typ, binary.NativeEndian.AppendUint32(nil, v))
}
func (m *msg) u64(typ uint16, v uint64) *msg {
	return m.attr(typ, binary.NativeEndian.AppendUint64(nil, v))
}
func (m *msg) str(typ uint16, v string) *msg { return m.attr(typ, append([]byte(v), 0)) }

// begin opens a nested attribute; end closes the last one opened.
func (m *msg) begin(typ uint16) *msg {
	m.nests = append(m.nests, len(m.b))
	return m.attr(typ, nil)
}

func (m *msg) end() *msg {
	at := m.nests[len(m.nests)-1]
	m.nests = m.nests[:len(m.nests)-1]
	binary.NativeEndian.PutUint16(m.b[at:], uint16(len(m.b)-at))
	return m
}

// raw appends bytes inside the current attribute (a nested fixed part).
func (m *msg) raw(v []byte) *msg {
	m.b = append(m.b, v...)
	m.pad()
	return m
}

func (m *msg) request(what string) request { return request{msg: m.b, what: what} }

// Fixed parts of the requests Setup sends.

func ifinfomsg(index int32, flags, change uint32) []byte {
	b := make([]byte, unix.SizeofIfInfomsg) // family AF_UNSPEC, type 0
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	binary.NativeEndian.PutUint32(b[8:12], flags)
	binary.NativeEndian.PutUint32(b[12:16], change)
	return b
}

func ifaddrmsg(ip netip.Addr, index int32, flags uint8) []byte {
	return binary.NativeEndian.AppendUint32([]byte{uint8(family(ip)), uint8(ip.BitLen()), flags, unix.RT_SCOPE_UNIVERSE}, uint32(index))
}

func rtmsg(dst netip.Prefix, proto, scope uint8) []byte {
	return []byte{uint8(family(dst.Addr())), uint8(dst.Bits()), 0, 0, unix.RT_TABLE_MAIN, proto, scope, unix.RTN_UNICAST, 0, 0, 0, 0}
}

func ndmsg(ip netip.Addr, index int32, state uint16) []byte {
	b := []byte{uint8(family(ip)), 0, 0, 0}
	b = binary.NativeEndian.AppendUint32(b, uint32(index))
	b = binary.NativeEndian.AppendUint16(b, state)
	return append(b, 0, 0) // flags, type
}

// infiniteLifetime is the kernel's "forever" for an address lifetime.
const infiniteLifetime = 0xffffffff

// Attribute numbers x/sys/unix does not name (linux/veth.h,
// linux/neighbour.h, linux/ip.h).
const (
	vethInfoPeer         = 1
	ndtaName             = 1
	ndtaParms            = 6
	ndtpaIfindex         = 1
	ndtpaProxyDelay      = 13
	ipv4DevconfProxyARP  = 3
	rtextFilterSkipStats = 1 << 3 // a lookup needs no counters
	addrGenModeNone      = 1      // IN6_ADDR_GEN_MODE_NONE
	createReplace        = unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	routeProtoPodDefault = unix.RTPROT_BOOT // what `ip route add` marks
)

// Requests.

// setAddrGen turns off the kernel's link-local address (before the link
// goes up) and, on a host end, answers ARP for the node (proxy ARP).
func setAddrGen(index int32, proxyARP bool) request {
	m := newMsg(unix.RTM_SETLINK, 0, ifinfomsg(index, 0, 0)).begin(unix.IFLA_AF_SPEC)
	if proxyARP {
		m.begin(unix.AF_INET).begin(unix.IFLA_INET_CONF).u32(ipv4DevconfProxyARP, 1).end().end()
	}
	m.begin(unix.AF_INET6).u8(unix.IFLA_INET6_ADDR_GEN_MODE, addrGenModeNone).end()
	what := "addr_gen_mode"
	if proxyARP {
		what += ", proxy_arp"
	}
	return m.end().request(what)
}

// setProxyDelay sets the link's ARP proxy_delay, in milliseconds.
func setProxyDelay(index int32, ms uint64) request {
	return newMsg(unix.RTM_SETNEIGHTBL, 0, []byte{unix.AF_INET, 0, 0, 0}).
		str(ndtaName, "arp_cache").
		begin(ndtaParms).u32(ndtpaIfindex, uint32(index)).u64(ndtpaProxyDelay, ms).end().
		request(fmt.Sprintf("proxy_delay %d", ms))
}

func setUp(index int32) request {
	return newMsg(unix.RTM_SETLINK, 0, ifinfomsg(index, unix.IFF_UP, unix.IFF_UP)).request("up")
}

// addAddr puts ip/bits on the link; deprecated (preferred lifetime 0)
// when asked.
func addAddr(ip netip.Addr, bits int, index int32, flags uint32, deprecated bool) request {
	m := newMsg(unix.RTM_NEWADDR, createReplace, ifaddrmsg(ip, index, uint8(flags)))
	m.b[unix.NLMSG_HDRLEN+1] = uint8(bits)
	m.attr(unix.IFA_LOCAL, ip.AsSlice()).attr(unix.IFA_ADDRESS, ip.AsSlice()).u32(unix.IFA_FLAGS, flags)
	if deprecated {
		ci := binary.NativeEndian.AppendUint32(nil, 0)              // preferred
		ci = binary.NativeEndian.AppendUint32(ci, infiniteLifetime) // valid
		m.attr(unix.IFA_CACHEINFO, append(ci, make([]byte, 8)...))  // cstamp, tstamp
	}
	return m.request(fmt.Sprintf("add %s", netip.PrefixFrom(ip, bits)))
}

// addRoute routes dst out of the link, via gw if it is valid.
func addRoute(dst netip.Prefix, gw netip.Addr, index int32, proto, scope uint8) request {
	m := newMsg(unix.RTM_NEWROUTE, createReplace, rtmsg(dst, proto, scope))
	if dst.Bits() > 0 {
		m.attr(unix.RTA_DST, dst.Addr().AsSlice())
	}
	if gw.IsValid() {
		m.attr(unix.RTA_GATEWAY, gw.AsSlice())
	}
	what := fmt.Sprintf("route %s", dst)
	if gw.IsValid() {
		what += " via " + gw.String()
	}
	return m.u32(unix.RTA_OIF, uint32(index)).request(what)
}

// pinNeigh is a permanent neighbour entry: ip is at mac on the link.
func pinNeigh(ip netip.Addr, mac net.HardwareAddr, index int32) request {
	return newMsg(unix.RTM_NEWNEIGH, createReplace, ndmsg(ip, index, unix.NUD_PERMANENT)).
		attr(unix.NDA_DST, ip.AsSlice()).attr(unix.NDA_LLADDR, mac).
		request(fmt.Sprintf("neighbour %s lladdr %s", ip, mac))
}

// getLink asks for the link called name; found gets its index and, for
// a veth, its peer's index (in the peer's namespace).
func getLink(name string, found func(index, peer int32)) request {
	r := newMsg(unix.RTM_GETLINK, 0, ifinfomsg(0, 0, 0)).
		u32(unix.IFLA_EXT_MASK, rtextFilterSkipStats).
		str(unix.IFLA_IFNAME, name).request("look up " + name)
	r.reply = func(typ uint16, data []byte) {
		if typ != unix.RTM_NEWLINK || len(data) < unix.SizeofIfInfomsg {
			return
		}
		index := int32(binary.NativeEndian.Uint32(data[4:8]))
		peer := index // IFLA_LINK is left out when it equals the index
		eachAttr(data[unix.SizeofIfInfomsg:], func(typ uint16, v []byte) {
			if typ == unix.IFLA_LINK && len(v) >= 4 {
				peer = int32(binary.NativeEndian.Uint32(v))
			}
		})
		found(index, peer)
	}
	return r
}

// newVeth creates the pair: the host end here, the pod end in the
// namespace nsFD, each with one queue each way and the MACs given.
func newVeth(host, pod string, hostMAC, podMAC net.HardwareAddr, nsFD int) request {
	m := newMsg(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, ifinfomsg(0, 0, 0)).
		str(unix.IFLA_IFNAME, host).u32(unix.IFLA_TXQLEN, 0).attr(unix.IFLA_ADDRESS, hostMAC).
		u32(unix.IFLA_NUM_TX_QUEUES, vethQueues).u32(unix.IFLA_NUM_RX_QUEUES, vethQueues).
		begin(unix.IFLA_LINKINFO).str(unix.IFLA_INFO_KIND, "veth").
		begin(unix.IFLA_INFO_DATA).begin(vethInfoPeer).raw(ifinfomsg(0, 0, 0)).
		str(unix.IFLA_IFNAME, pod).u32(unix.IFLA_TXQLEN, 0).
		u32(unix.IFLA_NUM_TX_QUEUES, vethQueues).u32(unix.IFLA_NUM_RX_QUEUES, vethQueues).
		attr(unix.IFLA_ADDRESS, podMAC).u32(unix.IFLA_NET_NS_FD, uint32(nsFD)).
		end().end().end()
	return m.request(fmt.Sprintf("create veth %s/%s", host, pod))
}
