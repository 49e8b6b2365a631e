package verdicts

import (
	"context"
	"fmt"
	"github.com/google/nftables"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// TestReviewKernelDifferentialV4Anycast: TestKernelDifferential's worlds
// with the anycast and `addresses` IPs made IPv4, so the IPv4 side of
// Group.Several (sets -sa4, -sp4, -s4) runs in the kernel too (the
// stock worlds hold IPv6 extra IPs only).
func TestReviewKernelDifferentialV4Anycast(t *testing.T) {
	l := probe.New(t)
	r := rand.New(rand.NewPCG(seed(t), 0x7634))
	dropped := 0
	for wi := range 60 {
		w := newWorld(r)
		// Re-address the extra IPs as IPv4.
		m := map[string]string{}
		n := 0
		v4 := func(ip string) string {
			if s, ok := m[ip]; ok {
				return s
			}
			n++
			m[ip] = fmt.Sprintf("203.0.113.%d", 100+n)
			return m[ip]
		}
		extra, holders := map[string][]string{}, map[string][]string{}
		for k, ips := range w.extra {
			for _, ip := range ips {
				extra[k] = append(extra[k], v4(ip))
			}
		}
		for ip, ks := range w.holders {
			holders[v4(ip)] = ks
		}
		w.extra, w.holders = extra, holders
		w.in.ExtraPodIPs = func(p *trim.Pod) []string { return w.extra[key(p)] }
		w.in.PodsForIP = func(ip string) []string { return w.holders[ip] }
		for _, ip := range m {
			w.addrs = append(w.addrs, mustAddr(ip))
		}
		ctrl := engine(t, w)
		prog := Compile(w.in)
		conn, err := NewConn(int(l.NS))
		if err != nil {
			t.Fatal(err)
		}
		if err := Load(conn, "flock-verdicts-test", reviewOutputHook, prog); err != nil {
			t.Fatal(err)
		}
		if err := conn.Flush(); err != nil {
			t.Fatal(err)
		}
		want := judged(t, ctrl)
		for range 300 {
			k := randPacket(r, w)
			if !k.Src.Is4() {
				continue
			}
			exp := true
			if want[k.Src] || want[k.Dst] {
				exp = ctrl.EvaluatePacket(context.Background(), net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), protoNames[k.Proto], int(k.SrcPort), int(k.DstPort))
			}
			if !exp {
				dropped++
			}
			if got := l.Allows(t, probe.Packet(k)); got != exp {
				t.Fatalf("world %d: %s → %s proto %d port %d: kernel %v, engine %v, program %v\n%s", wi, k.Src, k.Dst, k.Proto, k.DstPort, got, exp, prog.Allows(k), describe(w))
			}
		}
	}
	t.Logf("%d dropped", dropped)
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

var reviewOutputHook = Hook{Num: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter}
