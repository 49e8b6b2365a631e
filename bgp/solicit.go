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

// SolicitNeighbors sends one ICMPv6 echo request to all nodes (ff02::1) on
// iface. The replies put the link's peers into the neighbour table, where
// GoBGP looks for an unnumbered peer's link-local address.
func SolicitNeighbors(iface string) error {
	c, err := icmp.ListenPacket("ip6:ipv6-icmp", "::")
	if err != nil {
		return fmt.Errorf("solicit on %s: %w", iface, err)
	}
	defer c.Close()
	msg := icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("flock")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: net.ParseIP("ff02::1"), Zone: iface}); err != nil {
		return fmt.Errorf("solicit on %s: %w", iface, err)
	}
	return nil
}

// pingOnce sends one ICMPv6 echo request to addr on iface and waits up to
// timeout for its reply.
func pingOnce(iface string, addr netip.Addr, timeout time.Duration) error {
	c, err := icmp.ListenPacket("ip6:ipv6-icmp", "::")
	if err != nil {
		return fmt.Errorf("ping %s%%%s: %w", addr, iface, err)
	}
	defer c.Close()
	id, seq := os.Getpid()&0xffff, int(time.Now().UnixNano()&0x7fff)
	b, err := (&icmp.Message{Type: ipv6.ICMPTypeEchoRequest, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("flock")}}).Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: addr.AsSlice(), Zone: iface}); err != nil {
		return fmt.Errorf("ping %s%%%s: %w", addr, iface, err)
	}
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
