package bgp

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

// echo opens an ICMPv6 socket and sends one echo request (id, seq) to dst
// on iface; the caller reads any reply from the socket and closes it.
func echo(iface string, dst netip.Addr, id, seq int) (*icmp.PacketConn, error) {
	c, err := icmp.ListenPacket("ip6:ipv6-icmp", "::")
	if err != nil {
		return nil, fmt.Errorf("ping %s%%%s: %w", dst, iface, err)
	}
	b, err := (&icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("flock")}}).Marshal(nil)
	if err == nil {
		_, err = c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice(), Zone: iface})
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("ping %s%%%s: %w", dst, iface, err)
	}
	return c, nil
}

// SolicitNeighbors sends one ICMPv6 echo request to all nodes (ff02::1) on
// iface. The replies put the link's peers into the neighbour table, where
// GoBGP looks for an unnumbered peer's link-local address.
func SolicitNeighbors(iface string) error {
	c, err := echo(iface, netip.MustParseAddr("ff02::1"), os.Getpid()&0xffff, 1)
	if err != nil {
		return fmt.Errorf("solicit: %w", err)
	}
	return c.Close()
}

// pingOnce sends one ICMPv6 echo request to addr on iface and waits up to
// timeout for its reply.
func pingOnce(iface string, addr netip.Addr, timeout time.Duration) error {
	id, seq := os.Getpid()&0xffff, int(time.Now().UnixNano()&0x7fff)
	c, err := echo(iface, addr, id, seq)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("ping %s%%%s: %w", addr, iface, err)
		}
		m, err := icmp.ParseMessage(58, buf[:n])
		if err != nil || m.Type != ipv6.ICMPTypeEchoReply {
			continue
		}
		e, ok := m.Body.(*icmp.Echo)
		src, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if ok && e.ID == id && e.Seq == seq && src == addr {
			return nil
		}
	}
}
