package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestSequential(t *testing.T) {
	seq := Algo{Kind: Sequential}
	a := mustNew(t, summary("fd00:1::/120"), summary("10.0.0.0/28"))
	base := addrToU128(addr("fd00:1::"))
	for i := 1; i <= 5; i++ {
		got := mustAlloc(t, a, Request{Owner: fmt.Sprint("c", i), Family: 6, Algo: seq})
		if want := u128ToAddr(base.add(u128{0, uint64(i)}), false); got != want {
			t.Fatalf("allocation %d = %s, want %s", i, got, want)
		}
	}

	// IPv4 /28: 14 usable (.1 .. .14).
	v4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }
	for i := 1; i <= 5; i++ {
		if got := mustAlloc(t, a, Request{Owner: fmt.Sprint("c", i), Family: 4, Algo: seq}); got != v4(i) {
			t.Fatalf("allocation %d = %s, want %s", i, got, v4(i))
		}
	}
	if !a.Release(v4(2), "c2") {
		t.Fatal("release")
	}
	// Continues forward after the cursor instead of reusing .2.
	for i := 6; i <= 14; i++ {
		if got := mustAlloc(t, a, Request{Owner: fmt.Sprint("c", i), Family: 4, Algo: seq}); got != v4(i) {
			t.Fatalf("allocation %d = %s, want %s", i, got, v4(i))
		}
	}
	// Wraps and finds the released .2.
	if got := mustAlloc(t, a, Request{Owner: "wrap", Family: 4, Algo: seq}); got != v4(2) {
		t.Fatalf("after wrap got %s, want 10.0.0.2", got)
	}
	if _, err := a.Allocate(Request{Owner: "full", Family: 4, Algo: seq}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("want ErrExhausted, got %v", err)
	}
	// Release two; next continues after the cursor (.2): .9 before .4.
	a.Release(v4(4), "c4")
	a.Release(v4(9), "c9")
	for _, want := range []int{4, 9} {
		if got := mustAlloc(t, a, Request{Owner: "again", Family: 4, Algo: seq}); got != v4(want) {
			t.Fatalf("got %s, want %s", got, v4(want))
		}
	}
}

func TestSequentialSubRange(t *testing.T) {
	seq := Algo{Kind: Sequential}
	a := mustNew(t, summary("fd00:2::/64"))
	// A /120 in the middle of the pool: its first address is not a pool
	// boundary, so it is handed out.
	r := pfx("fd00:2::1:0/120")
	want := []string{"fd00:2::1:0", "fd00:2::1:1", "fd00:2::1:2"}
	for _, w := range want {
		if got := mustAlloc(t, a, Request{Owner: w, Family: 6, Range: r, Algo: seq}); got != addr(w) {
			t.Fatalf("got %s, want %s", got, w)
		}
	}
	// Cursors are per range: the pool default starts at its own beginning.
	if got := mustAlloc(t, a, Request{Owner: "d", Family: 6, Algo: seq}); got != addr("fd00:2::1") {
		t.Fatalf("default range got %s, want fd00:2::1", got)
	}
	// The first /120 of the pool excludes the pool's network address.
	if got := mustAlloc(t, a, Request{Owner: "e", Family: 6, Range: pfx("fd00:2::/120"), Algo: seq}); got != addr("fd00:2::2") {
		t.Fatalf("first /120 got %s, want fd00:2::2", got)
	}
	// Sub-range exhaustion names the range and the pool.
	small := pfx("fd00:2::2:0/126")
	for i := 0; i < 4; i++ {
		mustAlloc(t, a, Request{Owner: "s", Family: 6, Range: small, Algo: seq})
	}
	_, err := a.Allocate(Request{Owner: "s", Family: 6, Range: small, Algo: seq})
	const msg = "ipam: range fd00:2::2:0/126 of pool fd00:2::/64 exhausted (4 of 4 usable addresses in use; 9 in use in the pool)"
	if !errors.Is(err, ErrExhausted) || err.Error() != msg {
		t.Fatalf("got %v\nwant %s", err, msg)
	}
}

func TestRange(t *testing.T) {
	a := mustNew(t,
		summary("fd00:1::/64"),
		summary("10.1.0.0/24"),
		Pool{Prefix: pfx("2001:db8:1::/112"), Namespaces: []string{"prod", "web"}},
		Pool{Prefix: pfx("10.2.0.0/24")},
	)
	for _, algo := range allAlgos {
		t.Run("sub120/"+algo.String(), func(t *testing.T) {
			r := pfx("fd00:1::ab00/120")
			for i := 0; i < 50; i++ {
				got, err := a.Allocate(Request{Owner: "x", Family: 6, Range: r, Algo: algo})
				if algo.Kind == Embed {
					if !errors.Is(err, ErrBadAlgo) {
						t.Fatalf("embed in /120: want ErrBadAlgo, got %v", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !r.Contains(got) {
					t.Fatalf("%s outside %s", got, r)
				}
			}
		})
	}

	// A /128 range gives exactly that address, once.
	for _, algo := range allAlgos[:2] {
		one := pfx("fd00:1::beef/128")
		if algo.Kind == Sequential {
			one = pfx("fd00:1::cafe/128")
		}
		got := mustAlloc(t, a, Request{Owner: "p1", Family: 6, Range: one, Algo: algo})
		if got != one.Addr() {
			t.Fatalf("%s: /128 range gave %s", algo, got)
		}
		_, err := a.Allocate(Request{Owner: "p2", Family: 6, Range: one, Algo: algo})
		want := fmt.Sprintf("ipam: range %s of pool fd00:1::/64 exhausted (1 of 1 usable addresses in use;", one)
		if !errors.Is(err, ErrExhausted) || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("%s: second /128: got %v", algo, err)
		}
	}
	// IPv4 /32 range.
	if got := mustAlloc(t, a, Request{Owner: "v4", Family: 4, Range: pfx("10.2.0.77/32")}); got != addr("10.2.0.77") {
		t.Fatalf("/32 range gave %s", got)
	}
	// Non-canonical ranges are masked.
	if got := mustAlloc(t, a, Request{Owner: "v4", Family: 4, Range: pfx("10.2.0.91/30")}); !pfx("10.2.0.88/30").Contains(got) {
		t.Fatalf("masked range gave %s", got)
	}

	errs := []struct {
		name string
		req  Request
		is   error
		msg  string
	}{
		{"outside", Request{Owner: "o", Family: 6, Range: pfx("fd00:9::/64")}, ErrNotInPool,
			"ipam: cidr6 range fd00:9::/64 is not inside any pool of this node (pools: fd00:1::/64, 10.1.0.0/24, 2001:db8:1::/112, 10.2.0.0/24)"},
		{"larger than pool", Request{Owner: "o", Family: 4, Range: pfx("10.0.0.0/8")}, ErrNotInPool,
			"ipam: cidr4 range 10.0.0.0/8 is not inside any pool of this node (pools: fd00:1::/64, 10.1.0.0/24, 2001:db8:1::/112, 10.2.0.0/24)"},
		{"straddles pools", Request{Owner: "o", Family: 4, Range: pfx("10.0.0.0/14")}, ErrNotInPool,
			"ipam: cidr4 range 10.0.0.0/14 is not inside any pool of this node (pools: fd00:1::/64, 10.1.0.0/24, 2001:db8:1::/112, 10.2.0.0/24)"},
		{"wrong family", Request{Owner: "o", Family: 6, Range: pfx("10.1.0.0/28")}, ErrNotInPool,
			"ipam: cidr6 range 10.1.0.0/28 is not an IPv6 prefix"},
		{"forbidden", Request{Owner: "o", Family: 6, Range: pfx("2001:db8:1::/120"), Identity: Identity{Namespace: "dev"}}, ErrForbidden,
			`ipam: namespace "dev" may not use pool 2001:db8:1::/112 (allowed: prod, web)`},
		{"forbidden whole pool", Request{Owner: "o", Family: 6, Range: pfx("2001:db8:1::/112")}, ErrForbidden,
			`ipam: namespace "" may not use pool 2001:db8:1::/112 (allowed: prod, web)`},
		{"embed too big", Request{Owner: "o", Family: 6, Range: pfx("fd00:1::/100"), Algo: Algo{Kind: Embed}}, ErrBadAlgo,
			`ipam: ip-algo "embed:ns/8,app/16,image/8" needs at least 36 host bits (32 for fields + 4 instance bits) but range fd00:1::/100 has 28`},
		{"bad layout", Request{Owner: "o", Family: 6, Algo: Algo{Kind: Embed, Layout: []Field{{"foo", 8}}}}, ErrBadAlgo,
			`ipam: ip-algo "embed:foo/8": unknown field "foo" (want ns, app or image)`},
	}
	for _, tc := range errs {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Allocate(tc.req)
			if !errors.Is(err, tc.is) {
				t.Fatalf("want %v, got %v", tc.is, err)
			}
			if err.Error() != tc.msg {
				t.Errorf("error text\n got: %s\nwant: %s", err, tc.msg)
			}
		})
	}

	// Allowed namespaces may use the restricted pool.
	for _, ns := range []string{"prod", "web"} {
		got := mustAlloc(t, a, Request{Owner: ns, Family: 6, Range: pfx("2001:db8:1::/112"), Identity: Identity{Namespace: ns}})
		if !pfx("2001:db8:1::/112").Contains(got) {
			t.Fatalf("%s: %s", ns, got)
		}
	}
}

func TestDefaultPool(t *testing.T) {
	a := mustNew(t,
		Pool{Prefix: pfx("fd00:9::/64")}, // not a summary
		Pool{Prefix: pfx("fd00:1::/64"), Summary: true, Namespaces: []string{"prod"}},
		summary("fd00:2::/64"),
	)
	// First summary pool in config order; its Namespaces only restrict
	// explicit requests.
	got := mustAlloc(t, a, Request{Owner: "o", Family: 6, Identity: Identity{Namespace: "dev"}})
	if !pfx("fd00:1::/64").Contains(got) {
		t.Fatalf("default pool gave %s", got)
	}
	_, err := a.Allocate(Request{Owner: "o", Family: 4})
	const msg = "ipam: this node has no IPv4 summary pool (pools: fd00:9::/64, fd00:1::/64, fd00:2::/64)"
	if !errors.Is(err, ErrNotInPool) || err.Error() != msg {
		t.Fatalf("got %v\nwant %s", err, msg)
	}
	if _, err := a.Allocate(Request{Family: 6}); err == nil || !strings.Contains(err.Error(), "owner") {
		t.Fatalf("missing owner: %v", err)
	}
	if _, err := a.Allocate(Request{Owner: "o", Family: 5}); err == nil || !strings.Contains(err.Error(), "family 5") {
		t.Fatalf("bad family: %v", err)
	}
}

// embedWant computes the expected sub-prefix by hand (independent of the
// allocator's bit shuffling) for a range of length 64 and layout
// ns/8,app/16,image/8: bits 64..71 ns, 72..87 app, 88..95 image.
func embedWant(t *testing.T, rng netip.Prefix, ns, app, image string) netip.Prefix {
	t.Helper()
	if rng.Bits() != 64 {
		t.Fatal("embedWant needs a /64")
	}
	b := rng.Addr().As16()
	n := fnv32a(ns) & 0xff
	ap := fnv32a(app) & 0xffff
	im := fnv32a(image) & 0xff
	b[8] = byte(n)
	b[9] = byte(ap >> 8)
	b[10] = byte(ap)
	b[11] = byte(im)
	return netip.PrefixFrom(netip.AddrFrom16(b), 96)
}

func TestEmbed(t *testing.T) {
	pool := pfx("fd00:10:1::/64")
	a := mustNew(t, Pool{Prefix: pool, Summary: true}, summary("10.7.0.0/16"))
	embed := Algo{Kind: Embed}
	id := Identity{Namespace: "prod", App: "web", Image: "nginx:1.27"}

	alloc := func(owner string, id Identity) netip.Addr {
		id.ContainerID = owner
		return mustAlloc(t, a, Request{Owner: owner, Family: 6, Algo: embed, Identity: id})
	}
	masked := func(ad netip.Addr) netip.Prefix { return netip.PrefixFrom(ad, 96).Masked() }

	r1, r2 := alloc("c1", id), alloc("c2", id)
	if r1 == r2 {
		t.Fatal("replicas got the same address")
	}
	want := embedWant(t, pool, "prod", "web", "nginx:1.27")
	if masked(r1) != want || masked(r2) != want {
		t.Fatalf("replicas %s, %s not in %s", r1, r2, want)
	}

	other := id
	other.App = "api"
	if fnv32a("api")&0xffff == fnv32a("web")&0xffff {
		t.Fatal("test apps collide")
	}
	if o := alloc("c3", other); masked(o) == want {
		t.Fatalf("different app shares sub-prefix %s", want)
	} else if masked(o) != embedWant(t, pool, "prod", "api", "nginx:1.27") {
		t.Fatalf("other app: %s", o)
	}

	// Empty image: the container ID's hash is used instead.
	noImg := Identity{Namespace: "prod", App: "web"}
	for _, cid := range []string{"0123abcd", "ffee9988"} {
		got := alloc(cid, noImg)
		if w := embedWant(t, pool, "prod", "web", cid); masked(got) != w {
			t.Fatalf("empty image, container %s: %s not in %s", cid, got, w)
		}
	}

	// Custom layout and range: embed:app/4 in a /120 leaves 4 instance bits.
	rng := pfx("fd00:10:1::5:0/120")
	small := Algo{Kind: Embed, Layout: []Field{{"app", 4}}}
	appNib := fnv32a("web") & 0xf
	sub := netip.PrefixFrom(netip.AddrFrom16(func() [16]byte {
		b := rng.Addr().As16()
		b[15] = byte(appNib << 4)
		return b
	}()), 124)
	for i := 0; i < 16; i++ {
		got := mustAlloc(t, a, Request{Owner: fmt.Sprint("s", i), Family: 6, Range: rng, Algo: small, Identity: id})
		if !sub.Contains(got) {
			t.Fatalf("%s not in %s", got, sub)
		}
	}
	_, err := a.Allocate(Request{Owner: "s", Family: 6, Range: rng, Algo: small, Identity: id})
	wantMsg := fmt.Sprintf(`ipam: embed sub-prefix %s of pool fd00:10:1::/64 exhausted (16 of 16 usable addresses in use; ip-algo "embed:app/4", namespace "prod", app "web"`, sub)
	if !errors.Is(err, ErrExhausted) || !strings.HasPrefix(err.Error(), wantMsg) {
		t.Fatalf("got %v\nwant prefix %s", err, wantMsg)
	}
	// The minimum: exactly layout + 4 host bits is enough.
	if _, err := a.Allocate(Request{Owner: "m", Family: 6, Range: pfx("fd00:10:1::/92"), Algo: embed, Identity: id}); err != nil {
		t.Fatalf("/92 with 36 host bits: %v", err)
	}
	_, err = a.Allocate(Request{Owner: "m", Family: 6, Range: pfx("fd00:10:1::/93"), Algo: embed, Identity: id})
	if !errors.Is(err, ErrBadAlgo) || !strings.Contains(err.Error(), "fd00:10:1::/93 has 35") {
		t.Fatalf("/93: %v", err)
	}

	// IPv4: embed is served as random.
	seen := map[netip.Addr]bool{}
	for i := 0; i < 20; i++ {
		got := mustAlloc(t, a, Request{Owner: "v4", Family: 4, Algo: embed, Identity: id})
		if !pfx("10.7.0.0/16").Contains(got) || seen[got] {
			t.Fatalf("v4 embed gave %s", got)
		}
		seen[got] = true
	}
	// Even a /28 range, far too small for the layout, works for IPv4.
	if _, err := a.Allocate(Request{Owner: "v4", Family: 4, Range: pfx("10.7.3.0/28"), Algo: embed, Identity: id}); err != nil {
		t.Fatalf("v4 embed in /28: %v", err)
	}
}

func TestEmbedSubPrefixAtPoolStart(t *testing.T) {
	// All field values 0 would put the sub-prefix at the pool's network
	// address; it must stay excluded. Force this with a /122 pool and
	// fields whose low bit is 0.
	var ns string
	for i := 0; ; i++ {
		ns = fmt.Sprint("ns", i)
		if fnv32a(ns)&1 == 0 {
			break
		}
	}
	a := mustNew(t, summary("fd00::/122")) // 6 host bits: ns/1 + 5 instance bits
	algo := Algo{Kind: Embed, Layout: []Field{{"ns", 1}}}
	for i := 0; i < 31; i++ { // 32 in the lower /123 minus the network address
		got := mustAlloc(t, a, Request{Owner: "o", Family: 6, Algo: algo, Identity: Identity{Namespace: ns}})
		if got == addr("fd00::") || !pfx("fd00::/123").Contains(got) {
			t.Fatalf("got %s", got)
		}
	}
	if _, err := a.Allocate(Request{Owner: "o", Family: 6, Algo: algo, Identity: Identity{Namespace: ns}}); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "31 of 31") {
		t.Fatalf("got %v", err)
	}
}

// Addresses held elsewhere (another node's claim) are skipped by every
// algorithm, and a range whose free addresses are all held elsewhere is
// exhausted, not handed out.
func TestAvoid(t *testing.T) {
	rng := netip.MustParsePrefix("2001:db8:100::/124") // 14 usable
	a, err := New([]Pool{{Prefix: rng}})
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := map[netip.Addr]bool{}
	for i := 1; i <= 12; i++ {
		elsewhere[netip.MustParseAddr(fmt.Sprintf("2001:db8:100::%x", i))] = true
	}
	avoid := func(ip netip.Addr) bool { return elsewhere[ip] }
	for _, algo := range []Algo{{Kind: Random}, {Kind: Sequential}} {
		got := map[netip.Addr]bool{}
		for i := range 2 {
			ip, err := a.Allocate(Request{Owner: fmt.Sprintf("%s-%d", algo.String(), i), Family: 6, Range: rng, Algo: algo, Avoid: avoid})
			if err != nil {
				t.Fatalf("%s #%d: %v", algo.String(), i, err)
			}
			if elsewhere[ip] || got[ip] {
				t.Fatalf("%s handed out %s (held elsewhere or twice)", algo.String(), ip)
			}
			got[ip] = true
		}
		if _, err := a.Allocate(Request{Owner: "one-more", Family: 6, Range: rng, Algo: algo, Avoid: avoid}); !errors.Is(err, ErrExhausted) {
			t.Errorf("%s: range with every free address held elsewhere: %v, want ErrExhausted", algo.String(), err)
		}
		for i := range 2 {
			for ip := range got {
				a.Release(ip, fmt.Sprintf("%s-%d", algo.String(), i))
			}
		}
	}
}
