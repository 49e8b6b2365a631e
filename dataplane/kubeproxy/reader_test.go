package kubeproxy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestReaderAnswersAsADump: a Reader asks the kernel for the one key
// (two or three requests, whatever the maps hold) and answers what a
// dump of kube-proxy's maps (Read) answers, through kube-proxy's table
// being made, its maps filled and emptied, and both families.
func TestReaderAnswersAsADump(t *testing.T) {
	ns, conn := testNS(t)
	h := nsHandle(t, ns)
	r := &Reader{NetNS: int(h)}
	defer r.Close()
	k := func(a string, proto uint8, port uint16) Key {
		return Key{Addr: netip.MustParseAddr(a), Proto: proto, Port: port}
	}
	keys := []Key{
		k("2001:db8:1b::1", unix.IPPROTO_TCP, 80),
		k("2001:db8:1b::1", unix.IPPROTO_UDP, 80),
		k("2001:db8:1b::1", unix.IPPROTO_TCP, 8443), // both bytes of the port
		k("2001:db8:1b::2", unix.IPPROTO_SCTP, 80),
		k("203.0.113.129", unix.IPPROTO_TCP, 80),
		k("203.0.113.129", unix.IPPROTO_TCP, 443),
	}
	check := func(what string, want map[Key][2]bool) {
		t.Helper()
		direct, err := Read(conn)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range keys {
			before := r.requests
			d, known, err := r.Delivers(key)
			if err != nil {
				t.Fatalf("%s: %v: %v", what, key, err)
			}
			if n := r.requests - before; n < 2 || n > 3 {
				t.Errorf("%s: %v: %d requests", what, key, n)
			}
			dd, dk := direct.Delivers(key)
			if d != dd || known != dk {
				t.Errorf("%s: %v: the Reader says %v, %v; a dump %v, %v", what, key, d, known, dd, dk)
			}
			if w, ok := want[key]; ok && (d != w[0] || known != w[1]) {
				t.Errorf("%s: %v: %v, %v; want %v, %v", what, key, d, known, w[0], w[1])
			}
		}
	}
	unknown, no, yes := [2]bool{false, false}, [2]bool{false, true}, [2]bool{true, true}
	check("no kube-proxy", map[Key][2]bool{keys[0]: unknown, keys[4]: unknown})
	nft(t, ns, kubeProxyTable("ip6", "ipv6_addr"))
	check("kube-proxy's ip6 table", map[Key][2]bool{keys[0]: no, keys[4]: unknown})
	nft(t, ns, `add element ip6 kube-proxy service-ips { 2001:db8:1b::1 . tcp . 8443 : goto external-X, 2001:db8:1b::2 . sctp . 80 : goto service-Y }`)
	check("addresses added", map[Key][2]bool{keys[0]: no, keys[1]: no, keys[2]: yes, keys[3]: yes})
	nft(t, ns, kubeProxyTable("ip", "ipv4_addr")+`add element ip kube-proxy service-ips { 203.0.113.129 . tcp . 80 : goto external-X }
add element ip kube-proxy no-endpoint-services { 203.0.113.129 . tcp . 443 : drop }`)
	check("kube-proxy's ip table", map[Key][2]bool{keys[4]: yes, keys[5]: no})
	nft(t, ns, `add element ip6 kube-proxy no-endpoint-services { 2001:db8:1b::1 . tcp . 8443 : drop }`)
	check("no endpoint", map[Key][2]bool{keys[2]: no, keys[3]: yes})
	// A lost socket: dialled again.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	check("after Close", map[Key][2]bool{keys[2]: no})
	nft(t, ns, `delete element ip6 kube-proxy no-endpoint-services { 2001:db8:1b::1 . tcp . 8443 }
delete map ip6 kube-proxy no-endpoint-services`)
	check("no map no-endpoint-services", map[Key][2]bool{keys[2]: yes})
	nft(t, ns, `delete table ip kube-proxy`)
	check("the ip table deleted", map[Key][2]bool{keys[4]: unknown})
}

// TestReaderReadsTheProcesssNamespace: without NetNS, a Reader reads the
// process's network namespace even when its first Read runs on a thread
// in another (a socket kept from that thread would follow the wrong
// namespace for good).
func TestReaderReadsTheProcesssNamespace(t *testing.T) {
	ns, conn := testNS(t)
	nft(t, ns, kubeProxyTable("ip6", "ipv6_addr")+`add element ip6 kube-proxy service-ips { 2001:db8:1b::7 . tcp . 80 : goto external-X }`)
	lb := Key{Addr: netip.MustParseAddr("2001:db8:1b::7"), Proto: unix.IPPROTO_TCP, Port: 80}
	inNS, err := Read(conn)
	if err != nil {
		t.Fatal(err)
	}
	host, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	inHost, err := Read(host)
	if err != nil {
		t.Fatal(err)
	}
	d, k := inNS.Delivers(lb)
	hd, hk := inHost.Delivers(lb)
	if d == hd && k == hk {
		t.Fatalf("the host and the test's namespace answer alike (%v, %v): the test cannot tell them apart", d, k)
	}
	r := &Reader{}
	defer r.Close()
	h := nsHandle(t, ns)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // not unlocked: the thread ends with the goroutine
		if err := netns.Set(h); err != nil {
			t.Error(err)
			return
		}
		for i := range 3 {
			gd, gk, err := r.Delivers(lb)
			if err != nil {
				t.Error(err)
				return
			}
			if gd != hd || gk != hk {
				t.Errorf("read %d from a thread in another namespace: %v, %v; the process's namespace says %v, %v", i, gd, gk, hd, hk)
			}
		}
	}()
	<-done
}

// TestReaderInvariantUnderChurn: readers on many goroutines (some
// closing the Reader, a lost socket) while random kube-proxy changes
// are committed; at each quiescent point the Reader answers, for every
// key, what a dump of the namespace answers. Seeded: FLOCK_SEED=
// replays a run.
func TestReaderInvariantUnderChurn(t *testing.T) {
	ns, conn := testNS(t)
	h := nsHandle(t, ns)
	sd := uint64(time.Now().UnixNano())
	if s := os.Getenv("FLOCK_SEED"); s != "" {
		var err error
		if sd, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("FLOCK_SEED=%q: %v", s, err)
		}
	}
	t.Logf("FLOCK_SEED=%d", sd)
	rng := rand.New(rand.NewPCG(sd, 0x6b70))
	nft(t, ns, kubeProxyTable("ip6", "ipv6_addr"))
	keys := make([]Key, 6)
	for i := range keys {
		keys[i] = Key{Addr: netip.MustParseAddr(fmt.Sprintf("2001:db8:1b::%d", i+1)), Proto: unix.IPPROTO_TCP, Port: 80}
	}
	r := &Reader{NetNS: int(h)}
	defer r.Close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				if _, _, err := r.Delivers(keys[(g+n)%len(keys)]); err != nil {
					t.Error(err)
					return
				}
				if g == 0 && n%7 == 0 {
					_ = r.Close()
				}
			}
		})
	}
	in := map[string]map[Key]bool{ServiceIPs: {}, NoEndpointServices: {}}
	for round := range 25 {
		for range 1 + rng.IntN(4) {
			m := []string{ServiceIPs, NoEndpointServices}[rng.IntN(2)]
			k := keys[rng.IntN(len(keys))]
			verdict := ": goto external-X"
			if m == NoEndpointServices {
				verdict = ": drop"
			}
			op := "add"
			if in[m][k] {
				op, verdict = "delete", ""
			}
			nft(t, ns, fmt.Sprintf("%s element ip6 kube-proxy %s { %s . tcp . 80 %s }", op, m, k.Addr, verdict))
			in[m][k] = op == "add"
		}
		// Quiescent: nothing is committed until the next round.
		direct, err := Read(conn)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			d, known, err := r.Delivers(k)
			if err != nil {
				t.Fatal(err)
			}
			dd, dk := direct.Delivers(k)
			if d != dd || known != dk || d != (in[ServiceIPs][k] && !in[NoEndpointServices][k]) {
				t.Fatalf("FLOCK_SEED=%d round %d: %v: the Reader says %v, %v; a dump %v, %v", sd, round, k.Addr, d, known, dd, dk)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
}

// nsHandle opens the named namespace for t's duration.
func nsHandle(t *testing.T, name string) netns.NsHandle {
	t.Helper()
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}
