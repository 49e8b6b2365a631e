package ipam

import (
	"math/bits"
	"math/rand/v2"
	"net/netip"
)

// u128 is an unsigned 128-bit integer used to do address arithmetic for
// both families. IPv4 addresses live in the low 32 bits.
type u128 struct{ hi, lo uint64 }

var u128One = u128{0, 1}

// addrToU128 converts an address to its integer value. IPv4 (not 4in6)
// addresses map to 0..2^32-1.
func addrToU128(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{0, uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	var v u128
	for i := 0; i < 8; i++ {
		v.hi = v.hi<<8 | uint64(b[i])
		v.lo = v.lo<<8 | uint64(b[i+8])
	}
	return v
}

// u128ToAddr converts an integer back to an address of the given family.
// For IPv4 only the low 32 bits are used.
func u128ToAddr(v u128, is4 bool) netip.Addr {
	if is4 {
		x := uint32(v.lo)
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	var b [16]byte
	for i := 7; i >= 0; i-- {
		b[i] = byte(v.hi >> (8 * (7 - i)))
		b[i+8] = byte(v.lo >> (8 * (7 - i)))
	}
	return netip.AddrFrom16(b)
}

func (v u128) isZero() bool { return v.hi == 0 && v.lo == 0 }

func (v u128) cmp(w u128) int {
	switch {
	case v.hi < w.hi:
		return -1
	case v.hi > w.hi:
		return 1
	case v.lo < w.lo:
		return -1
	case v.lo > w.lo:
		return 1
	}
	return 0
}

func (v u128) less(w u128) bool { return v.cmp(w) < 0 }

// add returns v+w modulo 2^128.
func (v u128) add(w u128) u128 {
	lo, c := bits.Add64(v.lo, w.lo, 0)
	hi, _ := bits.Add64(v.hi, w.hi, c)
	return u128{hi, lo}
}

// sub returns v-w modulo 2^128.
func (v u128) sub(w u128) u128 {
	lo, b := bits.Sub64(v.lo, w.lo, 0)
	hi, _ := bits.Sub64(v.hi, w.hi, b)
	return u128{hi, lo}
}

func (v u128) and(w u128) u128 { return u128{v.hi & w.hi, v.lo & w.lo} }
func (v u128) or(w u128) u128  { return u128{v.hi | w.hi, v.lo | w.lo} }
func (v u128) not() u128       { return u128{^v.hi, ^v.lo} }

// shl returns v<<n (n may be >= 128, giving 0).
func (v u128) shl(n uint) u128 {
	switch {
	case n >= 128:
		return u128{}
	case n >= 64:
		return u128{v.lo << (n - 64), 0}
	case n == 0:
		return v
	}
	return u128{v.hi<<n | v.lo>>(64-n), v.lo << n}
}

// bitLen is the number of bits needed to represent v (0 for 0).
func (v u128) bitLen() int {
	if v.hi != 0 {
		return 64 + bits.Len64(v.hi)
	}
	return bits.Len64(v.lo)
}

// lowMask returns a value with the low n bits set (n clamped to 0..128).
func lowMask(n int) u128 {
	switch {
	case n <= 0:
		return u128{}
	case n >= 128:
		return u128{^uint64(0), ^uint64(0)}
	case n >= 64:
		return u128{uint64(1)<<(n-64) - 1, ^uint64(0)}
	}
	return u128{0, uint64(1)<<n - 1}
}

// divmod divides v by d (d > 0) and returns quotient and remainder.
func (v u128) divmod(d uint64) (u128, uint64) {
	qhi := v.hi / d
	r := v.hi % d
	qlo, r := bits.Div64(r, v.lo, d)
	return u128{qhi, qlo}, r
}

// String renders v in decimal.
func (v u128) String() string {
	if v.isZero() {
		return "0"
	}
	var buf [40]byte
	i := len(buf)
	for !v.isZero() {
		var r uint64
		v, r = v.divmod(10)
		i--
		buf[i] = byte('0' + r)
	}
	return string(buf[i:])
}

// float64 returns an approximation of v.
func (v u128) float64() float64 {
	return float64(v.hi)*(1<<64) + float64(v.lo)
}

// randBelow returns a uniformly random value in [0, n). n must be > 0.
func randBelow(n u128) u128 {
	if n.hi == 0 {
		return u128{0, rand.Uint64N(n.lo)}
	}
	// Rejection sampling on the smallest power of two >= n: fewer than two
	// draws expected.
	m := lowMask(n.sub(u128One).bitLen())
	for {
		r := u128{rand.Uint64(), rand.Uint64()}.and(m)
		if r.less(n) {
			return r
		}
	}
}

// prefixBounds returns the first and last address of p as integers.
func prefixBounds(p netip.Prefix) (first, last u128) {
	first = addrToU128(p.Masked().Addr())
	host := lowMask(p.Addr().BitLen() - p.Bits())
	return first, first.or(host)
}
