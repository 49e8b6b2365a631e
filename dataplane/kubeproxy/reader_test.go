package kubeproxy

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestReaderDumpsOnlyAfterAChange: a Reader answers from its last
// reading while no nftables transaction was committed in the namespace,
// and reads again after any (kube-proxy's or another process's): what it
// answers is always what Read would.
func TestReaderDumpsOnlyAfterAChange(t *testing.T) {
	ns, conn := testNS(t)
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
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
	check("no kube-proxy", 1, false, false)
	check("again, nothing changed", 1, false, false)
	nft(t, ns, kubeProxyTable("ip6", "ipv6_addr"))
	check("kube-proxy's table made", 2, false, true)
	check("again", 2, false, true)
	nft(t, ns, `add element ip6 kube-proxy service-ips { 2001:db8:1b::1 . tcp . 80 : goto external-X }`)
	check("the address added", 3, true, true)
	check("again", 3, true, true)
	// Another process's transaction, in another table: read again (the
	// generation is the namespace's), the same answer.
	nft(t, ns, "table inet other { }")
	check("another table made", 4, true, true)
	nft(t, ns, `add element ip6 kube-proxy no-endpoint-services { 2001:db8:1b::1 . tcp . 80 : drop }`)
	check("no endpoint", 5, false, true)
	// The generation's socket lost: dialed again, read again.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	check("after Close", 5, false, true)
	nft(t, ns, `delete element ip6 kube-proxy no-endpoint-services { 2001:db8:1b::1 . tcp . 80 }`)
	check("an endpoint again", 6, true, true)
}
