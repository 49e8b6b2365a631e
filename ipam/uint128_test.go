package ipam

import (
	"net/netip"
	"testing"
)

func TestU128AddrRoundTrip(t *testing.T) {
	for _, s := range []string{"0.0.0.0", "10.1.2.3", "255.255.255.255", "::", "::1", "fd00:10:1::ff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db8::8000:0:0:1"} {
		a := netip.MustParseAddr(s)
		v := addrToU128(a)
		if got := u128ToAddr(v, a.Is4()); got != a {
			t.Errorf("round trip %s -> %+v -> %s", a, v, got)
		}
	}
	if v := addrToU128(netip.MustParseAddr("10.0.0.1")); v != (u128{0, 0x0a000001}) {
		t.Errorf("10.0.0.1 = %+v", v)
	}
	if v := addrToU128(netip.MustParseAddr("1::2")); v != (u128{1 << 48, 2}) {
		t.Errorf("1::2 = %+v", v)
	}
}

func TestU128Arith(t *testing.T) {
	max := u128{^uint64(0), ^uint64(0)}
	if got := (u128{0, ^uint64(0)}).add(u128One); got != (u128{1, 0}) {
		t.Errorf("carry: %+v", got)
	}
	if got := (u128{1, 0}).sub(u128One); got != (u128{0, ^uint64(0)}) {
		t.Errorf("borrow: %+v", got)
	}
	if got := max.add(u128One); !got.isZero() {
		t.Errorf("wrap: %+v", got)
	}
	if (u128{1, 0}).cmp(u128{0, ^uint64(0)}) != 1 || (u128{0, 5}).cmp(u128{0, 5}) != 0 || !(u128{0, 4}).less(u128{0, 5}) {
		t.Error("cmp")
	}
	strs := []struct {
		v    u128
		want string
	}{
		{u128{}, "0"},
		{u128{0, 42}, "42"},
		{u128{1, 0}, "18446744073709551616"},
		{lowMask(64).sub(u128One), "18446744073709551614"},
		{max, "340282366920938463463374607431768211455"},
	}
	for _, tc := range strs {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("String(%+v) = %s, want %s", tc.v, got, tc.want)
		}
	}
	masks := []struct {
		n    int
		want u128
	}{{0, u128{}}, {1, u128{0, 1}}, {64, u128{0, ^uint64(0)}}, {65, u128{1, ^uint64(0)}}, {128, max}, {200, max}}
	for _, tc := range masks {
		if got := lowMask(tc.n); got != tc.want {
			t.Errorf("lowMask(%d) = %+v", tc.n, got)
		}
	}
	if got := (u128{0, 3}).shl(64); got != (u128{3, 0}) {
		t.Errorf("shl 64: %+v", got)
	}
	if got := (u128{0, 3 << 62}).shl(1); got != (u128{1, 1 << 63}) {
		t.Errorf("shl 1: %+v", got)
	}
	if got := (u128{0, 1}).shl(128); !got.isZero() {
		t.Errorf("shl 128: %+v", got)
	}
	if f := (u128{1, 0}).float64(); f != 18446744073709551616.0 {
		t.Errorf("float64 = %v", f)
	}
	if max.bitLen() != 128 || (u128{0, 1}).bitLen() != 1 || (u128{}).bitLen() != 0 {
		t.Error("bitLen")
	}
}

func TestRandBelow(t *testing.T) {
	for _, n := range []u128{{0, 1}, {0, 7}, {1, 0}, {1, 5}, {^uint64(0), ^uint64(0) - 1}} {
		for i := 0; i < 200; i++ {
			if r := randBelow(n); !r.less(n) {
				t.Fatalf("randBelow(%v) = %v", n, r)
			}
		}
	}
	if r := randBelow(u128{0, 1}); !r.isZero() {
		t.Fatalf("randBelow(1) = %v", r)
	}
}
