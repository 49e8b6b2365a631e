package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
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

// Pinger sends an ICMP echo request from inside a namespace every interval
// and counts the replies: the traffic a ToR forwards to a pod while
// something restarts.
type Pinger struct {
	Dst      netip.Addr
	conn     *icmp.PacketConn
	interval time.Duration
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	sent     map[int]time.Time
	got      map[int]bool
}

// StartPinger opens the raw socket inside ns and starts sending.
func StartPinger(ns *NS, dst netip.Addr, interval time.Duration) (*Pinger, error) {
	network, listen := "ip4:icmp", "0.0.0.0"
	if dst.Is6() {
		network, listen = "ip6:ipv6-icmp", "::"
	}
	p := &Pinger{Dst: dst, interval: interval, stop: make(chan struct{}), done: make(chan struct{}), sent: map[int]time.Time{}, got: map[int]bool{}}
	if err := ns.InNS(func() error {
		var err error
		p.conn, err = icmp.ListenPacket(network, listen)
		return err
	}); err != nil {
		return nil, fmt.Errorf("pinger %s from %s: %w", dst, ns.Name, err)
	}
	go p.read()
	go p.send()
	return p, nil
}

func (p *Pinger) send() {
	defer close(p.done)
	reqType := icmp.Type(ipv4.ICMPTypeEcho)
	if p.Dst.Is6() {
		reqType = ipv6.ICMPTypeEchoRequest
	}
	id := (os.Getpid() + 1) & 0xffff
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for seq := 1; ; seq++ {
		b, _ := (&icmp.Message{Type: reqType, Body: &icmp.Echo{ID: id, Seq: seq & 0xffff, Data: []byte("flock")}}).Marshal(nil)
		p.mu.Lock()
		p.sent[seq&0xffff] = time.Now()
		p.mu.Unlock()
		_, _ = p.conn.WriteTo(b, &net.IPAddr{IP: p.Dst.AsSlice()})
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

func (p *Pinger) read() {
	proto, replyType := 1, icmp.Type(ipv4.ICMPTypeEchoReply)
	if p.Dst.Is6() {
		proto, replyType = 58, ipv6.ICMPTypeEchoReply
	}
	buf := make([]byte, 1500)
	for {
		n, peer, err := p.conn.ReadFrom(buf)
		if err != nil {
			return // closed by Stop
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type != replyType {
			continue
		}
		echo, ok := m.Body.(*icmp.Echo)
		pa, _ := netip.AddrFromSlice(peer.(*net.IPAddr).IP)
		if ok && pa.Unmap() == p.Dst {
			p.mu.Lock()
			p.got[echo.Seq] = true
			p.mu.Unlock()
		}
	}
}

// Stop ends the pings, waits for the last replies and reports how many
// were sent and lost, and the longest run of consecutive losses as time.
func (p *Pinger) Stop() (sent, lost int, longest time.Duration) {
	close(p.stop)
	<-p.done
	time.Sleep(500 * time.Millisecond) // the last replies
	p.conn.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	type ping struct {
		at time.Time
		ok bool
	}
	var all []ping
	for seq, at := range p.sent {
		all = append(all, ping{at, p.got[seq]})
	}
	slices.SortFunc(all, func(a, b ping) int { return a.at.Compare(b.at) })
	var runStart time.Time
	for i, x := range all {
		if x.ok {
			runStart = time.Time{}
			continue
		}
		lost++
		if runStart.IsZero() {
			runStart = x.at
		}
		end := x.at.Add(p.interval)
		if i+1 < len(all) {
			end = all[i+1].at
		}
		longest = max(longest, end.Sub(runStart))
	}
	return len(all), lost, longest
}
