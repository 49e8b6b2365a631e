package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Ping sends ICMP echo requests from inside ns to dst until one is answered
// or timeout passes. The raw socket is opened inside the namespace and keeps
// belonging to it, so the I/O needs no thread switching.
func Ping(ns *NS, dst netip.Addr, timeout time.Duration) error {
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var reqType, replyType icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if dst.Is6() {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		reqType, replyType = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	var conn *icmp.PacketConn
	if err := ns.InNS(func() error {
		var err error
		conn, err = icmp.ListenPacket(network, listen)
		return err
	}); err != nil {
		return fmt.Errorf("ping %s from %s: %w", dst, ns.Name, err)
	}
	defer conn.Close()

	id := os.Getpid() & 0xffff
	deadline := time.Now().Add(timeout)
	var lastErr error
	for seq := 1; time.Now().Before(deadline); seq++ {
		msg := icmp.Message{Type: reqType, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("flock")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := conn.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			lastErr = err
			time.Sleep(100 * time.Millisecond)
			continue
		}
		wait := time.Now().Add(300 * time.Millisecond)
		if wait.After(deadline) {
			wait = deadline
		}
		_ = conn.SetReadDeadline(wait)
		buf := make([]byte, 1500)
		for {
			n, peer, err := conn.ReadFrom(buf)
			if err != nil {
				lastErr = err
				break
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != replyType {
				continue
			}
			echo, ok := m.Body.(*icmp.Echo)
			pa, _ := netip.AddrFromSlice(peer.(*net.IPAddr).IP)
			if ok && echo.ID == id && echo.Seq == seq && pa.Unmap() == dst {
				return nil
			}
		}
	}
	if lastErr == nil {
		lastErr = errors.New("no reply")
	}
	return fmt.Errorf("ping %s from netns %s: %w", dst, ns.Name, lastErr)
}
