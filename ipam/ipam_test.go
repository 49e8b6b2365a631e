package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

func mustNew(t testing.TB, pools ...Pool) *Allocator {
	t.Helper()
	a, err := New(pools)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

func summary(s string) Pool { return Pool{Prefix: pfx(s), Summary: true} }

func mustAlloc(t testing.TB, a *Allocator, req Request) netip.Addr {
	t.Helper()
	got, err := a.Allocate(req)
	if err != nil {
		t.Fatalf("Allocate(%+v): %v", req, err)
	}
	return got
}

var allAlgos = []Algo{{Kind: Random}, {Kind: Sequential}, {Kind: Embed}}

func TestNew(t *testing.T) {
	good := [][]Pool{
		nil,
		{summary("10.0.0.0/30"), summary("fd00::/126")},
		{summary("fd00:1::/64"), {Prefix: pfx("fd00:2::/64")}, summary("10.1.0.0/24"), {Prefix: pfx("10.2.0.0/16"), Namespaces: []string{"a"}}},
	}
	for i, pools := range good {
		if _, err := New(pools); err != nil {
			t.Errorf("good #%d: %v", i, err)
		}
	}

	bad := []struct {
		name  string
		pools []Pool
		msg   string
	}{
		{"invalid", []Pool{summary("10.0.0.0/24"), {}}, `ipam: pool #2: invalid prefix "invalid Prefix"`},
		{"non-canonical v4", []Pool{summary("10.0.0.1/24")}, "ipam: pool 10.0.0.1/24 is not canonical (host bits set; want 10.0.0.0/24)"},
		{"non-canonical v6", []Pool{summary("fd00::1/64")}, "ipam: pool fd00::1/64 is not canonical (host bits set; want fd00::/64)"},
		{"v4 /31", []Pool{summary("10.0.0.0/31")}, "ipam: pool 10.0.0.0/31 has no usable address (the all-zeros and all-ones host addresses are never handed out; use at most /30)"},
		{"v4 /32", []Pool{summary("10.0.0.7/32")}, "ipam: pool 10.0.0.7/32 has no usable address (the all-zeros and all-ones host addresses are never handed out; use at most /30)"},
		{"v6 /127", []Pool{summary("fd00::/127")}, "ipam: pool fd00::/127 has no usable address (the all-zeros and all-ones host addresses are never handed out; use at most /126)"},
		{"v6 /128", []Pool{summary("fd00::1/128")}, "ipam: pool fd00::1/128 has no usable address (the all-zeros and all-ones host addresses are never handed out; use at most /126)"},
		{"overlap v4", []Pool{summary("10.0.0.0/16"), summary("fd00::/64"), {Prefix: pfx("10.0.5.0/24")}}, "ipam: pool 10.0.5.0/24 overlaps pool 10.0.0.0/16"},
		{"overlap v6", []Pool{summary("fd00::/120"), {Prefix: pfx("fd00::/64")}}, "ipam: pool fd00::/64 overlaps pool fd00::/120"},
		{"duplicate", []Pool{summary("fd00::/64"), summary("fd00::/64")}, "ipam: pool fd00::/64 overlaps pool fd00::/64"},
		{"4in6", []Pool{summary("::ffff:10.0.0.0/120")}, "ipam: pool ::ffff:10.0.0.0/120: IPv4-mapped IPv6 prefixes are not supported (use a plain IPv4 prefix)"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.pools)
			if err == nil {
				t.Fatal("New succeeded")
			}
			if err.Error() != tc.msg {
				t.Errorf("error text\n got: %s\nwant: %s", err, tc.msg)
			}
		})
	}
}

func TestExhaustion(t *testing.T) {
	tests := []struct {
		pool   string
		family int
		usable int
	}{
		{"10.0.0.0/30", 4, 2},
		{"10.0.0.0/29", 4, 6},
		{"10.9.8.0/28", 4, 14},
		{"fd00::/126", 6, 2},
		{"fd00::/125", 6, 6},
	}
	for _, tc := range tests {
		for _, algo := range allAlgos {
			if algo.Kind == Embed && tc.family == 6 {
				continue // too few host bits for embed; covered in TestEmbed
			}
			t.Run(tc.pool+"/"+algo.String(), func(t *testing.T) {
				a := mustNew(t, summary(tc.pool))
				p := pfx(tc.pool)
				seen := map[netip.Addr]bool{}
				for i := 0; i < tc.usable; i++ {
					got := mustAlloc(t, a, Request{Owner: fmt.Sprint("c", i), Family: tc.family, Algo: algo})
					if seen[got] || !p.Contains(got) {
						t.Fatalf("allocation %d: %s duplicate or outside %s", i, got, p)
					}
					seen[got] = true
				}
				_, err := a.Allocate(Request{Owner: "one-too-many", Family: tc.family, Algo: algo})
				if !errors.Is(err, ErrExhausted) {
					t.Fatalf("want ErrExhausted, got %v", err)
				}
				want := fmt.Sprintf("ipam: pool %s exhausted (%d of %d usable addresses in use)", tc.pool, tc.usable, tc.usable)
				if err.Error() != want {
					t.Errorf("error text\n got: %s\nwant: %s", err, want)
				}
				// Releasing one makes exactly that one available again.
				var freed netip.Addr
				for ad := range seen {
					freed = ad
					break
				}
				owner, _ := a.Owner(freed)
				if !a.Release(freed, owner) {
					t.Fatalf("Release(%s, %s) = false", freed, owner)
				}
				if got := mustAlloc(t, a, Request{Owner: "again", Family: tc.family, Algo: algo}); got != freed {
					t.Errorf("after release got %s, want %s", got, freed)
				}
			})
		}
	}
}

func TestRandomDistinctUntilFull(t *testing.T) {
	for _, pool := range []string{"fd00:5::/120", "10.4.0.0/24"} {
		t.Run(pool, func(t *testing.T) {
			p := pfx(pool)
			a := mustNew(t, summary(pool))
			fam := 6
			if p.Addr().Is4() {
				fam = 4
			}
			usable := 1<<(p.Addr().BitLen()-p.Bits()) - 2
			first, last := prefixBounds(p)
			seen := map[netip.Addr]bool{}
			for i := 0; i < usable; i++ {
				got := mustAlloc(t, a, Request{Owner: fmt.Sprint("c", i), Family: fam})
				if seen[got] {
					t.Fatalf("allocation %d: duplicate %s", i, got)
				}
				if !p.Contains(got) {
					t.Fatalf("allocation %d: %s outside %s", i, got, p)
				}
				if v := addrToU128(got); v == first || v == last {
					t.Fatalf("allocation %d: boundary address %s handed out", i, got)
				}
				seen[got] = true
			}
			if _, err := a.Allocate(Request{Owner: "x", Family: fam}); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), pool) {
				t.Fatalf("want ErrExhausted naming %s, got %v", pool, err)
			}
			st := a.Stats()[0]
			if st.Used != uint64(usable) || st.Free != "0" || st.FreeApprox != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestRandomNearlyFullFindsLast(t *testing.T) {
	a := mustNew(t, summary("fd00::/118")) // 1022 usable
	var last netip.Addr
	for i := 1; i <= 1022; i++ {
		ad := u128ToAddr(addrToU128(addr("fd00::")).add(u128{0, uint64(i)}), false)
		if i == 777 {
			last = ad
			continue
		}
		if err := a.Reserve(ad, fmt.Sprint("r", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, algo := range []Algo{{Kind: Random}, {Kind: Sequential}} {
		got := mustAlloc(t, a, Request{Owner: "last", Family: 6, Algo: algo})
		if got != last {
			t.Fatalf("%s: got %s, want %s", algo, got, last)
		}
		if _, err := a.Allocate(Request{Owner: "none", Family: 6, Algo: algo}); !errors.Is(err, ErrExhausted) {
			t.Fatalf("%s: want ErrExhausted, got %v", algo, err)
		}
		a.Release(last, "last")
	}
}

func TestBoundaries(t *testing.T) {
	a := mustNew(t, summary("10.0.0.0/29"), summary("fd00::/125"))
	for _, tc := range []struct {
		fam         int
		first, last string
	}{{4, "10.0.0.0", "10.0.0.7"}, {6, "fd00::", "fd00::7"}} {
		for _, algo := range allAlgos {
			var got []netip.Addr
			for i := 0; i < 10; i++ {
				ad, err := a.Allocate(Request{Owner: "o", Family: tc.fam, Algo: algo})
				if err != nil {
					if tc.fam == 6 && algo.Kind == Embed && errors.Is(err, ErrBadAlgo) {
						break
					}
					if errors.Is(err, ErrExhausted) {
						break
					}
					t.Fatal(err)
				}
				if ad.String() == tc.first || ad.String() == tc.last {
					t.Fatalf("%s handed out boundary %s", algo, ad)
				}
				got = append(got, ad)
			}
			if algo.Kind != Embed || tc.fam == 4 {
				if len(got) != 6 {
					t.Fatalf("%s: %d allocations, want 6", algo, len(got))
				}
			}
			for _, ad := range got {
				a.Release(ad, "o")
			}
		}
		for _, b := range []string{tc.first, tc.last} {
			err := a.Reserve(addr(b), "o")
			if !errors.Is(err, ErrNotInPool) || !strings.Contains(err.Error(), b) {
				t.Errorf("Reserve(%s): want ErrNotInPool naming it, got %v", b, err)
			}
		}
	}
	// Sub-ranges touching the pool's boundaries keep them excluded.
	got := mustAlloc(t, a, Request{Owner: "r", Family: 4, Range: pfx("10.0.0.0/30"), Algo: Algo{Kind: Sequential}})
	if got != addr("10.0.0.1") {
		t.Errorf("got %s, want 10.0.0.1", got)
	}
	for _, r := range []string{"10.0.0.0/32", "10.0.0.7/32", "fd00::/128", "fd00::7/128", "10.0.0.6/31"} {
		fam := 6
		if pfx(r).Addr().Is4() {
			fam = 4
		}
		_, err := a.Allocate(Request{Owner: "r", Family: fam, Range: pfx(r)})
		if r == "10.0.0.6/31" {
			if err != nil {
				t.Errorf("%s: %v", r, err)
			}
			continue
		}
		if !errors.Is(err, ErrNotInPool) || !strings.Contains(err.Error(), r) {
			t.Errorf("range %s: want ErrNotInPool naming it, got %v", r, err)
		}
	}
}

func TestReserveRelease(t *testing.T) {
	a := mustNew(t, summary("10.0.0.0/29"), summary("fd00::/64"))
	ad := addr("10.0.0.3")
	if err := a.Reserve(ad, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve(ad, "alice"); err != nil {
		t.Fatalf("idempotent reserve: %v", err)
	}
	if st := a.Stats()[0]; st.Used != 1 {
		t.Fatalf("used after double reserve = %d", st.Used)
	}
	err := a.Reserve(ad, "bob")
	if !errors.Is(err, ErrConflict) || err.Error() != `ipam: cannot reserve 10.0.0.3 for "bob": held by "alice"` {
		t.Fatalf("conflict: %v", err)
	}
	err = a.Reserve(addr("192.168.0.1"), "bob")
	if !errors.Is(err, ErrNotInPool) || err.Error() != `ipam: cannot reserve 192.168.0.1 for "bob": not inside any pool of this node (pools: 10.0.0.0/29, fd00::/64)` {
		t.Fatalf("outside: %v", err)
	}
	if err := a.Reserve(netip.Addr{}, "bob"); err == nil {
		t.Fatal("invalid address reserved")
	}
	if err := a.Reserve(addr("10.0.0.4"), ""); err == nil {
		t.Fatal("empty owner reserved")
	}
	if o, ok := a.Owner(ad); !ok || o != "alice" {
		t.Fatalf("Owner = %q, %v", o, ok)
	}
	if a.Release(ad, "bob") {
		t.Fatal("release by other owner freed")
	}
	if o, _ := a.Owner(ad); o != "alice" {
		t.Fatalf("owner changed to %q", o)
	}
	if !a.Release(ad, "alice") {
		t.Fatal("release by owner did not free")
	}
	if a.Release(ad, "alice") {
		t.Fatal("double release freed")
	}
	if _, ok := a.Owner(ad); ok {
		t.Fatal("still owned")
	}
	if err := a.Reserve(ad, "bob"); err != nil {
		t.Fatalf("reserve after release: %v", err)
	}
	// 4in6 form is the same address.
	if o, ok := a.Owner(addr("::ffff:10.0.0.3")); !ok || o != "bob" {
		t.Fatalf("4in6 owner: %q %v", o, ok)
	}

	// Allocation skips reserved addresses.
	for _, s := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.6"} {
		if err := a.Reserve(addr(s), "r"); err != nil {
			t.Fatal(err)
		}
	}
	if got := mustAlloc(t, a, Request{Owner: "n", Family: 4}); got != addr("10.0.0.5") {
		t.Fatalf("got %s, want the only free 10.0.0.5", got)
	}

	// PoolOf and Pools.
	if p, ok := a.PoolOf(addr("fd00::1234")); !ok || p.Prefix != pfx("fd00::/64") || !p.Summary {
		t.Fatalf("PoolOf = %+v %v", p, ok)
	}
	if p, ok := a.PoolOf(addr("10.0.0.7")); !ok || p.Prefix != pfx("10.0.0.0/29") {
		t.Fatalf("PoolOf boundary = %+v %v", p, ok)
	}
	if _, ok := a.PoolOf(addr("fd01::1")); ok {
		t.Fatal("PoolOf outside")
	}
	if ps := a.Pools(); len(ps) != 2 || ps[0].Prefix != pfx("10.0.0.0/29") || ps[1].Prefix != pfx("fd00::/64") {
		t.Fatalf("Pools = %+v", ps)
	}
}

func TestPoolsAreCopies(t *testing.T) {
	ns := []string{"a", "b"}
	a := mustNew(t, Pool{Prefix: pfx("fd00::/64"), Namespaces: ns})
	ns[0] = "evil"
	ps := a.Pools()
	ps[0].Namespaces[1] = "evil"
	if _, err := a.Allocate(Request{Owner: "o", Family: 6, Range: pfx("fd00::/64"), Identity: Identity{Namespace: "b"}}); err != nil {
		t.Fatalf("pool config was aliased: %v", err)
	}
}

func TestStats(t *testing.T) {
	a := mustNew(t, summary("fd00::/64"), summary("10.0.0.0/24"), Pool{Prefix: pfx("2001:db8::/32")})
	for i := 0; i < 3; i++ {
		mustAlloc(t, a, Request{Owner: "o", Family: 6})
	}
	mustAlloc(t, a, Request{Owner: "o", Family: 4})
	st := a.Stats()
	want := []struct {
		used uint64
		free string
	}{
		{3, "18446744073709551611"},
		{1, "253"},
		{0, "79228162514264337593543950334"},
	}
	for i, w := range want {
		if st[i].Used != w.used || st[i].Free != w.free {
			t.Errorf("stats[%d] = %+v, want used %d free %s", i, st[i], w.used, w.free)
		}
	}
	if st[0].FreeApprox < 1.8e19 || st[0].FreeApprox > 1.9e19 || st[1].FreeApprox != 253 {
		t.Errorf("approx: %v %v", st[0].FreeApprox, st[1].FreeApprox)
	}
}

// SetPools keeps every owner; usage is recounted; an address whose pool
// went stays held.
func TestSetPools(t *testing.T) {
	sum := netip.MustParsePrefix("fd00:10:1::/64")
	shared := netip.MustParsePrefix("2001:db8:100::/120")
	a, err := New([]Pool{{Prefix: sum, Summary: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(Request{Owner: "c1", Family: 6, Range: shared}); !errors.Is(err, ErrNotInPool) {
		t.Fatalf("range of a pool not yet there: %v", err)
	}
	if err := a.SetPools([]Pool{{Prefix: sum, Summary: true}, {Prefix: shared}}); err != nil {
		t.Fatal(err)
	}
	ip, err := a.Allocate(Request{Owner: "c1", Family: 6, Range: shared})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(Request{Owner: "c2", Family: 6}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetPools([]Pool{{Prefix: sum, Summary: true}, {Prefix: shared}, {Prefix: netip.MustParsePrefix("2001:db8:100::80/121")}}); err == nil {
		t.Error("overlapping pools accepted")
	}
	stats := a.Stats()
	if len(stats) != 2 || stats[0].Used != 1 || stats[1].Used != 1 {
		t.Errorf("stats after a refused SetPools: %+v", stats)
	}
	if err := a.SetPools([]Pool{{Prefix: sum, Summary: true}}); err != nil {
		t.Fatal(err)
	}
	if owner, ok := a.Owner(ip); !ok || owner != "c1" {
		t.Errorf("address of a removed pool: owner %q %v, want still c1", owner, ok)
	}
	if err := a.SetPools([]Pool{{Prefix: sum, Summary: true}, {Prefix: shared}}); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st[1].Used != 1 {
		t.Errorf("pool back: used %d, want 1 (c1 kept its address)", st[1].Used)
	}
	if !a.Release(ip, "c1") {
		t.Error("release of c1's address failed")
	}
}
