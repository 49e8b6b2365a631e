package verdicts

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// TestDifferentialEveryPair: random worlds (newWorld), with the extra IPs
// doubled into IPv4 (anycast held by local and remote pods in both
// families), every ordered pair of addresses one of which is judged,
// every protocol and a set of ports: program vs engine. The groups of an
// address the program does not judge are built for judged peers alone;
// this asks them of every judged peer there is.
func TestDifferentialEveryPair(t *testing.T) {
	s := seed(t)
	n := scaled(t, 15)
	r := rand.New(rand.NewPCG(s, 0x3333))
	checked, drops := 0, 0
	for wi := range n {
		w := newWorld(r)
		// v4 twins of the extra IPs.
		twin := map[string]string{}
		k := 0
		v4 := func(ip string) string {
			if s, ok := twin[ip]; ok {
				return s
			}
			k++
			twin[ip] = fmt.Sprintf("203.0.113.%d", 100+k)
			return twin[ip]
		}
		extra, holders := map[string][]string{}, map[string][]string{}
		for pk, ips := range w.extra {
			for _, ip := range ips {
				extra[pk] = append(extra[pk], ip, v4(ip))
			}
		}
		for ip, ks := range w.holders {
			holders[ip] = ks
			holders[v4(ip)] = ks
		}
		w.extra, w.holders = extra, holders
		w.in.ExtraPodIPs = func(p *trim.Pod) []string { return w.extra[key(p)] }
		w.in.PodsForIP = func(ip string) []string { return w.holders[ip] }
		for _, ip := range twin {
			w.addrs = append(w.addrs, netip.MustParseAddr(ip))
		}
		ctrl := engine(t, w)
		prog := Compile(w.in)
		want := judged(t, ctrl)
		for a := range want {
			if !prog.Selected[a] {
				t.Fatalf("world %d: engine judges %s, program not", wi, a)
			}
		}
		for a := range prog.Selected {
			if !want[a] {
				t.Fatalf("world %d: program judges %s, engine not", wi, a)
			}
		}
		for _, src := range w.addrs {
			for _, dst := range w.addrs {
				if src == dst || src.Is4() != dst.Is4() || (!want[src] && !want[dst]) {
					continue
				}
				for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, 0} {
					ports := []uint16{0, 53, 80, 81, 1000, 1001, 1020, 1049, 1099, 8080, 9090, 9091}
					if proto == 0 {
						proto, ports = unix.IPPROTO_ICMPV6, []uint16{0}
						if src.Is4() {
							proto = unix.IPPROTO_ICMP
						}
					}
					for _, dp := range ports {
						pk := Packet{Src: src, Dst: dst, Proto: proto, DstPort: dp}
						if dp != 0 || proto == unix.IPPROTO_TCP || proto == unix.IPPROTO_UDP || proto == unix.IPPROTO_SCTP {
							pk.SrcPort = 40000
						}
						got := prog.Allows(pk)
						exp := ctrl.EvaluatePacket(context.Background(), net.IP(src.AsSlice()), net.IP(dst.AsSlice()), protoNames[proto], int(pk.SrcPort), int(dp))
						checked++
						if !exp {
							drops++
						}
						if got != exp {
							t.Fatalf("world %d: %s → %s proto %d port %d: program %v, engine %v\n%s", wi, src, dst, proto, dp, got, exp, describe(w))
						}
					}
				}
			}
		}
	}
	t.Logf("%d packets, %d dropped", checked, drops)
}
