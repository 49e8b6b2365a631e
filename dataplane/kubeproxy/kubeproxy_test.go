package kubeproxy

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// testNS is a named network namespace, removed when t ends, and an
// nftables connection into it.
func testNS(t *testing.T) (string, *nftables.Conn) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("FLOCK_REQUIRE_ROOT") != "" {
			t.Fatal("needs root (network namespaces, nftables)")
		}
		t.Skip("needs root (network namespaces, nftables)")
	}
	name := fmt.Sprintf("flock-kp-%d", os.Getpid())
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	orig.Close()
	runtime.UnlockOSThread()
	t.Cleanup(func() {
		ns.Close()
		_ = netns.DeleteNamed(name)
	})
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	return name, conn
}

// nft runs the nft command line in the namespace: the ruleset is written
// as kube-proxy's nftables proxier writes it, by a parser other than
// ours.
func nft(t *testing.T, ns, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s\n%s", err, out, script)
	}
}

// kubeProxyTable is the skeleton of kube-proxy's table of one family
// (pkg/proxy/nftables/proxier.go, setupNFTables), with the chains the
// maps' verdicts go to.
func kubeProxyTable(fam, addrType string) string {
	return fmt.Sprintf(`table %[1]s kube-proxy {
	comment "rules for kube-proxy"
	chain external-X { }
	chain service-Y { }
	map service-ips {
		type %[2]s . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
	}
	map no-endpoint-services {
		type %[2]s . inet_proto . inet_service : verdict
		comment "vmap to drop or reject packets to services with no endpoints"
	}
}
`, fam, addrType)
}

func TestRead(t *testing.T) {
	ns, conn := testNS(t)
	k := func(a string, proto uint8, port uint16) Key {
		return Key{Addr: netip.MustParseAddr(a), Proto: proto, Port: port}
	}
	lb6, lb4 := k("2001:db8:1b::1", unix.IPPROTO_TCP, 80), k("203.0.113.129", unix.IPPROTO_TCP, 80)

	// No kube-proxy in nftables mode: nothing is known.
	s, err := Read(conn)
	if err != nil {
		t.Fatalf("without kube-proxy's tables: %v", err)
	}
	if _, known := s.Delivers(lb6); known {
		t.Fatal("without kube-proxy's tables, an IPv6 address is known")
	}

	// An IPv6-only kube-proxy, not synced yet: known, not delivered; the
	// IPv4 family stays unknown.
	nft(t, ns, kubeProxyTable("ip6", "ipv6_addr"))
	s, err = Read(conn)
	if err != nil {
		t.Fatal(err)
	}
	if d, known := s.Delivers(lb6); !known || d {
		t.Errorf("an empty ip6 table: delivers %v, known %v; want false, true", d, known)
	}
	if _, known := s.Delivers(lb4); known {
		t.Error("no ip table, and an IPv4 address is known")
	}

	// Synced with endpoints (Local, one of them here): delivered, on
	// that port and protocol only.
	nft(t, ns, kubeProxyTable("ip", "ipv4_addr")+`
add element ip6 kube-proxy service-ips { 2001:db8:1b::1 . tcp . 80 : goto external-X }
add element ip6 kube-proxy service-ips { fd00:96::10 . udp . 53 : goto service-Y }
add element ip kube-proxy service-ips { 203.0.113.129 . tcp . 80 : goto external-X }
add element ip kube-proxy no-endpoint-services { 203.0.113.129 . tcp . 80 : drop }
`)
	s, err = Read(conn)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		k               Key
		delivers, known bool
	}{
		{lb6, true, true},
		{k("2001:db8:1b::1", unix.IPPROTO_TCP, 81), false, true},
		{k("2001:db8:1b::1", unix.IPPROTO_UDP, 80), false, true},
		{k("2001:db8:1b::2", unix.IPPROTO_TCP, 80), false, true},
		{k("fd00:96::10", unix.IPPROTO_UDP, 53), true, true},
		// Endpoints, none for external traffic here (Local): dropped.
		{lb4, false, true},
	} {
		if d, known := s.Delivers(c.k); d != c.delivers || known != c.known {
			t.Errorf("%v: delivers %v, known %v; want %v, %v", c.k, d, known, c.delivers, c.known)
		}
	}

	// A local endpoint comes: kube-proxy takes the drop away.
	nft(t, ns, `delete element ip kube-proxy no-endpoint-services { 203.0.113.129 . tcp . 80 }`)
	if s, err = Read(conn); err != nil {
		t.Fatal(err)
	}
	if d, known := s.Delivers(lb4); !d || !known {
		t.Errorf("after the drop went: delivers %v, known %v", d, known)
	}

	// A map of another layout is an error naming it, not a guess.
	nft(t, ns, "delete table ip6 kube-proxy\n"+`table ip6 kube-proxy {
	chain c { }
	map service-ips { type ipv6_addr . inet_service : verdict; }
}
add element ip6 kube-proxy service-ips { 2001:db8:1b::1 . 80 : goto c }
`)
	if _, err := Read(conn); err == nil || !strings.Contains(err.Error(), "ip6 kube-proxy service-ips") {
		t.Errorf("a map of another layout: %v", err)
	}
}
