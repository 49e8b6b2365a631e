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

// TestReaderDumpsOnlyAfterAChange: a Reader answers from its last
// reading while no nftables transaction was committed in the namespace,
// and reads again after any (kube-proxy's or another process's): what it
// answers is always what Read would.
func TestReaderDumpsOnlyAfterAChange(t *testing.T) {
	ns, conn := testNS(t)
	h := nsHandle(t, ns)
	r := &Reader{NetNS: int(h)}
	defer r.Close()
	lb := Key{Addr: netip.MustParseAddr("2001:db8:1b::1"), Proto: unix.IPPROTO_TCP, Port: 80}

	check := func(what string, wantDumps int, wantDelivers, wantKnown bool) {
		t.Helper()
		s, err := r.Read()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if r.dumps != wantDumps {
			t.Errorf("%s: %d dumps, want %d", what, r.dumps, wantDumps)
		}
		d, known := s.Delivers(lb)
		if d != wantDelivers || known != wantKnown {
			t.Errorf("%s: delivers %v, known %v; want %v, %v", what, d, known, wantDelivers, wantKnown)
		}
		// What Read says, read now.
		direct, err := Read(conn)
		if err != nil {
			t.Fatal(err)
		}
		if dd, dk := direct.Delivers(lb); dd != d || dk != known {
			t.Errorf("%s: the Reader says %v, %v; Read %v, %v", what, d, known, dd, dk)
		}
	}
	// A change is dumped twice (the second confirms what the first read
	// at that generation), then answered from the snapshot.
	check("no kube-proxy", 1, false, false)
	check("again, nothing changed: confirmed", 2, false, false)
	check("again: kept", 2, false, false)
	nft(t, ns, kubeProxyTable("ip6", "ipv6_addr"))
	check("kube-proxy's table made", 3, false, true)
	check("again", 4, false, true)
	check("again", 4, false, true)
	nft(t, ns, `add element ip6 kube-proxy service-ips { 2001:db8:1b::1 . tcp . 80 : goto external-X }`)
	check("the address added", 5, true, true)
	check("again", 6, true, true)
	check("again", 6, true, true)
	// Another process's transaction, in another table: read again (the
	// generation is the namespace's), the same answer.
	nft(t, ns, "table inet other { }")
	check("another table made", 7, true, true)
	nft(t, ns, `add element ip6 kube-proxy no-endpoint-services { 2001:db8:1b::1 . tcp . 80 : drop }`)
	check("no endpoint", 8, false, true)
	check("again", 9, false, true)
	check("again", 9, false, true)
	// Closed: starts over.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	check("after Close", 10, false, true)
	check("again", 11, false, true)
	nft(t, ns, `delete element ip6 kube-proxy no-endpoint-services { 2001:db8:1b::1 . tcp . 80 }`)
	check("an endpoint again", 12, true, true)
	check("again", 13, true, true)
	// A snapshot is answered for maxAge at most.
	defer func(d time.Duration) { maxAge = d }(maxAge)
	maxAge = 0
	check("past maxAge", 14, true, true)
	check("past maxAge again", 15, true, true)
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
			s, err := r.Read()
			if err != nil {
				t.Error(err)
				return
			}
			if gd, gk := s.Delivers(lb); gd != hd || gk != hk {
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
				if _, err := r.Read(); err != nil {
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
		s, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		direct, err := Read(conn)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			d, known := s.Delivers(k)
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
