package anycast

import (
	"fmt"
	"net/netip"
	"testing"

	"code.fritzlab.net/fritzlab/flock/dataplane"
)

type fakeRoutes struct {
	calls  int
	routes map[netip.Prefix][]dataplane.Nexthop
}

func (f *fakeRoutes) SetRoute(dst netip.Prefix, nhs []dataplane.Nexthop) error {
	f.calls++
	if len(nhs) == 0 {
		delete(f.routes, dst)
	} else {
		f.routes[dst] = nhs
	}
	return nil
}

var (
	any6 = netip.MustParseAddr("2001:db8:a::1")
	any4 = netip.MustParseAddr("203.0.113.1")
	p6   = netip.PrefixFrom(any6, 128)
	p4   = netip.PrefixFrom(any4, 32)
)

func member(id string, n int, ready bool) Member {
	return Member{
		ContainerID: id, HostVeth: "flock" + id, Ready: ready,
		IPs:     []netip.Addr{netip.MustParseAddr(fmt.Sprintf("fd00::%d", n)), netip.MustParseAddr(fmt.Sprintf("10.0.0.%d", n))},
		Anycast: []netip.Addr{any6, any4},
	}
}

func TestECMPReplicaCounting(t *testing.T) {
	f := &fakeRoutes{routes: map[netip.Prefix][]dataplane.Nexthop{}}
	r := New(f)
	changes := 0
	r.OnChange = func() { changes++ }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.Update(member("a", 1, true)))
	must(r.Update(member("b", 2, true)))
	if got := f.routes[p6]; len(got) != 2 || got[0].Gateway.String() != "fd00::1" || got[1].Dev != "flockb" {
		t.Fatalf("IPv6 ECMP: %v", got)
	}
	if got := f.routes[p4]; len(got) != 2 || got[0].Gateway.String() != "10.0.0.1" {
		t.Fatalf("IPv4 ECMP uses IPv4 next hops: %v", got)
	}
	calls := f.calls
	must(r.Update(member("b", 2, true))) // unchanged: no kernel call
	if f.calls != calls {
		t.Errorf("unchanged update reprogrammed routes (%d calls)", f.calls-calls)
	}
	must(r.Update(member("a", 1, false))) // a not Ready
	if got := f.routes[p6]; len(got) != 1 || got[0].Dev != "flockb" {
		t.Errorf("after a went NotReady: %v", got)
	}
	must(r.Remove("b"))
	if _, ok := f.routes[p6]; ok {
		t.Errorf("route kept with no Ready replica: %v", f.routes)
	}
	must(r.Remove("a"))
	must(r.Remove("never"))
	if len(r.Routes()) != 0 || len(f.routes) != 0 {
		t.Errorf("leftovers: %v %v", r.Routes(), f.routes)
	}
	if changes == 0 {
		t.Error("OnChange never called")
	}
}

func TestResyncPrunesStale(t *testing.T) {
	stale := netip.MustParsePrefix("2001:db8:dead::1/128")
	f := &fakeRoutes{routes: map[netip.Prefix][]dataplane.Nexthop{stale: {{Dev: "x"}}}}
	r := New(f)
	if err := r.Update(member("a", 1, true)); err != nil {
		t.Fatal(err)
	}
	if err := r.Resync([]netip.Prefix{stale, p6}); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.routes[stale]; ok {
		t.Error("stale route survived Resync")
	}
	if len(f.routes[p6]) != 1 {
		t.Errorf("claimed route lost in Resync: %v", f.routes)
	}
}
