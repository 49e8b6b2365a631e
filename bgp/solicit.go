package bgp

import (
	"fmt"
	"net"
	"os"

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
