package verdicts

import (
	"net/netip"
	"slices"
)

// Range is the addresses From through To (one family, From ≤ To).
type Range struct{ From, To netip.Addr }

// Addrs is a set of addresses of both families as sorted, disjoint,
// non-adjacent ranges: what an nftables interval set holds.
type Addrs struct{ r []Range }

// Ranges lists the set's ranges in order (IPv4 first).
func (a *Addrs) Ranges() []Range { return a.r }

// Len is the number of ranges.
func (a *Addrs) Len() int { return len(a.r) }

// Contains tells whether ip is in the set.
func (a *Addrs) Contains(ip netip.Addr) bool {
	i, found := slices.BinarySearchFunc(a.r, ip, func(r Range, ip netip.Addr) int {
		switch {
		case r.To.Less(ip):
			return -1
		case ip.Less(r.From):
			return 1
		}
		return 0
	})
	_ = i
	return found
}

// addrsBuilder collects ranges, then normalizes them once.
type addrsBuilder struct{ r []Range }

func (b *addrsBuilder) addAddr(ip netip.Addr) { b.r = append(b.r, Range{ip, ip}) }

func (b *addrsBuilder) addPrefix(p netip.Prefix) { b.r = append(b.r, prefixRange(p)) }

func (b *addrsBuilder) addRanges(a *Addrs) { b.r = append(b.r, a.r...) }

func (b *addrsBuilder) build() *Addrs { return &Addrs{normalize(b.r)} }

func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	first := p.Addr()
	last := first.AsSlice()
	bits := p.Bits()
	for i := range last {
		for bit := 0; bit < 8; bit++ {
			if i*8+bit >= bits {
				last[i] |= 0x80 >> bit
			}
		}
	}
	to, _ := netip.AddrFromSlice(last)
	return Range{first, to}
}

// normalize sorts rs and merges overlapping and adjacent ranges.
func normalize(rs []Range) []Range {
	slices.SortFunc(rs, func(a, b Range) int { return a.From.Compare(b.From) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].To.BitLen() == r.From.BitLen() && (!out[n-1].To.Less(r.From) || out[n-1].To.Next() == r.From) {
			if out[n-1].To.Less(r.To) {
				out[n-1].To = r.To
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// subtract removes the ranges of cut from rs (both normalized).
func subtract(rs, cut []Range) []Range {
	var out []Range
	for _, r := range rs {
		pieces := []Range{r}
		for _, c := range cut {
			var next []Range
			for _, p := range pieces {
				if p.From.BitLen() != c.From.BitLen() || c.To.Less(p.From) || p.To.Less(c.From) {
					next = append(next, p)
					continue
				}
				if p.From.Less(c.From) {
					next = append(next, Range{p.From, c.From.Prev()})
				}
				if c.To.Less(p.To) {
					next = append(next, Range{c.To.Next(), p.To})
				}
			}
			pieces = next
		}
		out = append(out, pieces...)
	}
	return out
}
