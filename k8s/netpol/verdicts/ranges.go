package verdicts

import (
	"net/netip"
	"slices"
)

// Range is the addresses From through To (one family, From ≤ To).
type Range struct{ From, To netip.Addr }

// Addrs is a set of addresses of both families as sorted, disjoint,
// non-adjacent ranges: what an nftables interval set holds.
type Addrs struct {
	r []Range
	// id, if not 0, is the set's in its program's peer sets
	// (Program.peerSets), which a patch may change.
	id int32
}

// Ranges lists the set's ranges in order (IPv4 first).
func (a *Addrs) Ranges() []Range { return a.r }

// Len is the number of ranges.
func (a *Addrs) Len() int { return len(a.r) }

// Contains tells whether ip is in the set.
func (a *Addrs) Contains(ip netip.Addr) bool {
	_, found := contains(a.r, ip)
	return found
}

// addrsBuilder collects ranges, then normalizes them once.
type addrsBuilder struct{ r []Range }

func (b *addrsBuilder) addAddr(ip netip.Addr) { b.r = append(b.r, Range{ip, ip}) }

func (b *addrsBuilder) addPrefix(p netip.Prefix) { b.r = append(b.r, prefixRange(p)) }

func (b *addrsBuilder) addRanges(a *Addrs) { b.r = append(b.r, a.r...) }

func (b *addrsBuilder) build() *Addrs { return &Addrs{r: normalize(b.r)} }

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

// family is the part of rs (normalized: IPv4 first) of one family.
func family(rs []Range, v4 bool) []Range {
	i, _ := slices.BinarySearchFunc(rs, false, func(r Range, _ bool) int {
		if r.From.Is4() {
			return -1
		}
		return 0
	})
	if v4 {
		return rs[:i]
	}
	return rs[i:]
}

// contains tells whether rs (normalized) holds ip, and where: the index
// of the range holding it, or else of the first range after it.
func contains(rs []Range, ip netip.Addr) (int, bool) {
	return slices.BinarySearchFunc(rs, ip, func(r Range, ip netip.Addr) int {
		switch {
		case r.To.Less(ip):
			return -1
		case ip.Less(r.From):
			return 1
		}
		return 0
	})
}

// edited is rs (normalized; not changed) with the addresses of add (none
// of them in rs) in it and those of cut (all in rs) out of it, normalized
// as a build of the same addresses would be: one pass, as a set of a
// large cluster's pods takes a few of them at a time.
func edited(rs []Range, add, cut []netip.Addr) []Range {
	add, cut = slices.Clone(add), slices.Clone(cut)
	slices.SortFunc(add, netip.Addr.Compare)
	slices.SortFunc(cut, netip.Addr.Compare)
	out := make([]Range, 0, len(rs)+len(add)+len(cut))
	// push appends r, joining it to the last range if they touch (they
	// come in order of From, and do not overlap).
	push := func(r Range) {
		if n := len(out); n > 0 && out[n-1].To.BitLen() == r.From.BitLen() && out[n-1].To.Next() == r.From {
			out[n-1].To = r.To
			return
		}
		out = append(out, r)
	}
	i, j := 0, 0
	for i < len(rs) || j < len(add) {
		if j == len(add) || (i < len(rs) && rs[i].From.Less(add[j])) {
			push(rs[i])
			i++
			continue
		}
		push(Range{add[j], add[j]})
		j++
	}
	if len(cut) == 0 {
		return out
	}
	split := make([]Range, 0, len(out)+len(cut))
	k := 0
	for _, r := range out {
		for k < len(cut) && !r.To.Less(cut[k]) {
			a := cut[k] // in r: cut holds addresses of the set
			k++
			if r.From != a {
				split = append(split, Range{r.From, a.Prev()})
			}
			if r.To == a {
				r.From = netip.Addr{}
				break
			}
			r.From = a.Next()
		}
		if r.From.IsValid() {
			split = append(split, r)
		}
	}
	return split
}
