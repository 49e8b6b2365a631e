package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
)

// Sentinel errors. Every error returned by this package that belongs to one
// of these classes wraps it, so callers can test with errors.Is; the error
// text itself always names the values involved.
var (
	// ErrExhausted: the range (pool, sub-range or embed sub-prefix) has no
	// free address left.
	ErrExhausted = errors.New("ipam: address range exhausted")
	// ErrNotInPool: a requested range or address is not inside (the usable
	// part of) any configured pool, or the node has no summary pool for the
	// requested family.
	ErrNotInPool = errors.New("ipam: not inside any pool")
	// ErrForbidden: the namespace may not use the pool.
	ErrForbidden = errors.New("ipam: namespace not allowed to use pool")
	// ErrBadAlgo: the ip-algo value is invalid or does not fit the range.
	ErrBadAlgo = errors.New("ipam: bad ip-algo")
	// ErrConflict: the address is held by another owner.
	ErrConflict = errors.New("ipam: address held by another owner")
)

// ipamError carries a fully formatted message and the sentinel it wraps.
type ipamError struct {
	msg  string
	kind error
}

func (e *ipamError) Error() string { return e.msg }
func (e *ipamError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &ipamError{msg: fmt.Sprintf(format, args...), kind: kind}
}

// Pool is one CIDR the node allocates from (from the NodeConfig).
type Pool struct {
	Prefix netip.Prefix // canonical (masked)
	// Summary marks the node summary: the default pool for its family;
	// allocations inside are covered by the aggregate route.
	Summary bool
	// Namespaces allowed to request this pool (or a sub-range of it)
	// explicitly by annotation; empty = every namespace.
	Namespaces []string
}

// Identity describes the pod an address is allocated for.
type Identity struct {
	Namespace, App, Image, ContainerID string
}

// Request is one allocation request.
type Request struct {
	Owner  string // container ID that will own the address (required)
	Family int    // 4 or 6
	// Range optionally restricts the allocation to this prefix (from a
	// cidr6/cidr4 annotation); the zero value means the family's default
	// (first summary) pool. A non-canonical Range is masked.
	Range    netip.Prefix
	Algo     Algo
	Identity Identity // Namespace is always checked against Pool.Namespaces when Range is set
	// Avoid, if set, marks addresses held elsewhere (another node's claim
	// on a cluster-wide pool): they are skipped like owned ones.
	Avoid func(netip.Addr) bool
}

// PoolStats is the usage of one pool.
type PoolStats struct {
	Pool Pool
	Used uint64
	// Held counts the pool's addresses in use outside IPAM (Hold): never
	// handed out, not free.
	Held       uint64
	Free       string  // usable - used - held, decimal (may exceed uint64)
	FreeApprox float64 // same as Free, approximately
}

// pool is the internal state of one configured pool.
type pool struct {
	cfg   Pool
	is4   bool
	first u128 // network (all-zeros host) address, never handed out
	last  u128 // all-ones host address, never handed out
	used  uint64
	held  uint64 // held (Hold) usable addresses nobody owns
}

// usable is the number of addresses that can be handed out.
func (p *pool) usable() u128 { return p.last.sub(p.first).sub(u128One) }

func (p *pool) family() int {
	if p.is4 {
		return 4
	}
	return 6
}

// Allocator hands out pod addresses from a fixed set of pools. It is safe
// for concurrent use.
type Allocator struct {
	mu     sync.Mutex
	pools  []*pool
	owners map[netip.Addr]string
	// held are addresses in use outside IPAM (held.go): never handed out
	// or reserved, whatever pool comes to cover them.
	held    map[netip.Addr]struct{}
	cursors map[netip.Prefix]u128 // Sequential: last address handed out per range
}

// randomTries is the number of random candidates tried before Random falls
// back to a bounded linear scan.
const randomTries = 32

// New validates the pools and returns an empty allocator. Each prefix must
// be valid and canonical (masked), plain IPv4 or IPv6 (not IPv4-mapped),
// not overlap any other pool, and contain at least one usable address
// (so IPv4 /31 and /32 and IPv6 /127 and /128 pools are rejected).
func New(pools []Pool) (*Allocator, error) {
	a := &Allocator{
		owners:  map[netip.Addr]string{},
		held:    map[netip.Addr]struct{}{},
		cursors: map[netip.Prefix]u128{},
	}
	ps, err := buildPools(pools)
	if err != nil {
		return nil, err
	}
	a.pools = ps
	return a, nil
}

// SetPools replaces the pools (an AddressPool appeared or went) and keeps
// every owner: an address whose pool went stays held (Release still frees
// it), it is just counted in no pool. Held addresses (Hold) a new pool
// covers are counted as such: never free. The new pools obey New's rules.
func (a *Allocator) SetPools(pools []Pool) error {
	ps, err := buildPools(pools)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pools = ps
	for addr := range a.owners {
		if p := a.poolOfLocked(addr); p != nil {
			p.used++
		}
	}
	for addr := range a.held {
		if p := a.heldInLocked(addr); p != nil {
			p.held++
		}
	}
	return nil
}

func buildPools(pools []Pool) ([]*pool, error) {
	var out []*pool
	for i, pc := range pools {
		pfx := pc.Prefix
		if !pfx.IsValid() {
			return nil, fmt.Errorf("ipam: pool #%d: invalid prefix %q", i+1, pfx.String())
		}
		if pfx.Addr().Zone() != "" {
			return nil, fmt.Errorf("ipam: pool %s: prefix must not carry a zone", pfx)
		}
		if pfx.Addr().Is4In6() {
			return nil, fmt.Errorf("ipam: pool %s: IPv4-mapped IPv6 prefixes are not supported (use a plain IPv4 prefix)", pfx)
		}
		if m := pfx.Masked(); m != pfx {
			return nil, fmt.Errorf("ipam: pool %s is not canonical (host bits set; want %s)", pfx, m)
		}
		if host := pfx.Addr().BitLen() - pfx.Bits(); host < 2 {
			return nil, fmt.Errorf("ipam: pool %s has no usable address (the all-zeros and all-ones host addresses are never handed out; use at most /%d)", pfx, pfx.Addr().BitLen()-2)
		}
		for _, q := range out {
			if q.cfg.Prefix.Overlaps(pfx) {
				return nil, fmt.Errorf("ipam: pool %s overlaps pool %s", pfx, q.cfg.Prefix)
			}
		}
		first, last := prefixBounds(pfx)
		out = append(out, &pool{
			cfg:   Pool{Prefix: pfx, Summary: pc.Summary, Namespaces: append([]string(nil), pc.Namespaces...)},
			is4:   pfx.Addr().Is4(),
			first: first,
			last:  last,
		})
	}
	return out, nil
}

// normAddr strips zones and unmaps IPv4-mapped IPv6 addresses.
func normAddr(addr netip.Addr) netip.Addr {
	return addr.WithZone("").Unmap()
}

// poolOfLocked returns the pool containing addr, or nil.
func (a *Allocator) poolOfLocked(addr netip.Addr) *pool {
	for _, p := range a.pools {
		if p.cfg.Prefix.Contains(addr) {
			return p
		}
	}
	return nil
}

func (a *Allocator) poolList() string {
	if len(a.pools) == 0 {
		return "none"
	}
	s := make([]string, len(a.pools))
	for i, p := range a.pools {
		s[i] = p.cfg.Prefix.String()
	}
	return strings.Join(s, ", ")
}

func familyName(family int) string {
	if family == 4 {
		return "IPv4"
	}
	return "IPv6"
}

// Allocate picks a free address for req.Owner according to req.
func (a *Allocator) Allocate(req Request) (netip.Addr, error) {
	if req.Owner == "" {
		return netip.Addr{}, errors.New("ipam: allocation request without owner")
	}
	if req.Family != 4 && req.Family != 6 {
		return netip.Addr{}, fmt.Errorf("ipam: allocation for %q: invalid address family %d (want 4 or 6)", req.Owner, req.Family)
	}
	if err := req.Algo.check(); err != nil {
		return netip.Addr{}, err
	}

	a.mu.Lock()
	defer a.mu.Unlock()

	p, rng, err := a.resolveRange(req)
	if err != nil {
		return netip.Addr{}, err
	}

	// The candidate interval: the range minus the pool's boundary addresses.
	// Since rng lies inside the pool, this is one contiguous interval.
	lo, hi := prefixBounds(rng)
	if !p.first.less(lo) {
		lo = p.first.add(u128One)
	}
	if !hi.less(p.last) {
		hi = p.last.sub(u128One)
	}
	if hi.less(lo) {
		return netip.Addr{}, errorf(ErrNotInPool, "ipam: cidr%d range %s holds only the reserved all-zeros/all-ones address(es) of pool %s", req.Family, rng, p.cfg.Prefix)
	}

	var (
		v  u128
		ok bool
	)
	switch {
	case req.Algo.Kind == Sequential:
		start := lo
		if c, found := a.cursors[rng]; found {
			start = c.add(u128One)
			if start.less(lo) || hi.less(start) {
				start = lo
			}
		}
		v, ok = a.scan(p, start, lo, hi, req.Avoid)
		if !ok {
			return netip.Addr{}, a.exhausted(p, rng, lo, hi, "")
		}
		a.cursors[rng] = v
	case req.Algo.Kind == Embed && req.Family == 6:
		sub, err := embedPrefix(rng, req)
		if err != nil {
			return netip.Addr{}, err
		}
		slo, shi := prefixBounds(sub)
		if slo.less(lo) {
			slo = lo
		}
		if hi.less(shi) {
			shi = hi
		}
		v, ok = a.pickRandom(p, slo, shi, req.Avoid)
		if !ok {
			return netip.Addr{}, a.exhausted(p, sub, slo, shi, fmt.Sprintf("; ip-algo %q, namespace %q, app %q", req.Algo.String(), req.Identity.Namespace, req.Identity.App))
		}
	default: // Random, and Embed for IPv4
		v, ok = a.pickRandom(p, lo, hi, req.Avoid)
		if !ok {
			return netip.Addr{}, a.exhausted(p, rng, lo, hi, "")
		}
	}

	addr := u128ToAddr(v, p.is4)
	a.owners[addr] = req.Owner
	p.used++
	return addr, nil
}

// resolveRange finds the pool and the (masked) range for a request.
func (a *Allocator) resolveRange(req Request) (*pool, netip.Prefix, error) {
	if req.Range == (netip.Prefix{}) {
		for _, p := range a.pools {
			if p.cfg.Summary && p.family() == req.Family {
				return p, p.cfg.Prefix, nil
			}
		}
		return nil, netip.Prefix{}, errorf(ErrNotInPool, "ipam: this node has no %s summary pool (pools: %s)", familyName(req.Family), a.poolList())
	}
	if !req.Range.IsValid() {
		return nil, netip.Prefix{}, errorf(ErrNotInPool, "ipam: cidr%d range %q is not a valid prefix", req.Family, req.Range.String())
	}
	rng := netip.PrefixFrom(req.Range.Addr().WithZone(""), req.Range.Bits()).Masked()
	if (req.Family == 4) != rng.Addr().Is4() {
		return nil, netip.Prefix{}, errorf(ErrNotInPool, "ipam: cidr%d range %s is not an %s prefix", req.Family, rng, familyName(req.Family))
	}
	var p *pool
	for _, q := range a.pools {
		if q.family() == req.Family && q.cfg.Prefix.Bits() <= rng.Bits() && q.cfg.Prefix.Contains(rng.Addr()) {
			p = q
			break
		}
	}
	if p == nil {
		return nil, netip.Prefix{}, errorf(ErrNotInPool, "ipam: cidr%d range %s is not inside any pool of this node (pools: %s)", req.Family, rng, a.poolList())
	}
	if !nsAllowed(p.cfg.Namespaces, req.Identity.Namespace) {
		return nil, netip.Prefix{}, errorf(ErrForbidden, "ipam: namespace %q may not use pool %s (allowed: %s)", req.Identity.Namespace, p.cfg.Prefix, strings.Join(p.cfg.Namespaces, ", "))
	}
	return p, rng, nil
}

func nsAllowed(allowed []string, ns string) bool {
	if len(allowed) == 0 {
		return true
	}
	for _, n := range allowed {
		if n == ns {
			return true
		}
	}
	return false
}

// embedPrefix returns the sub-prefix of rng selected by the identity
// fields of req.Algo.
func embedPrefix(rng netip.Prefix, req Request) (netip.Prefix, error) {
	layout := req.Algo.layout()
	sum := 0
	for _, f := range layout {
		sum += f.Bits
	}
	total := rng.Addr().BitLen()
	host := total - rng.Bits()
	if host < sum+minInstanceBits {
		return netip.Prefix{}, errorf(ErrBadAlgo, "ipam: ip-algo %q needs at least %d host bits (%d for fields + %d instance bits) but range %s has %d",
			req.Algo.String(), sum+minInstanceBits, sum, minInstanceBits, rng, host)
	}
	base, _ := prefixBounds(rng)
	off := rng.Bits() // position of the next field, counted from the MSB
	for _, f := range layout {
		val := u128{0, fieldValue(f, req.Identity, req.Owner)}
		base = base.or(val.shl(uint(total - off - f.Bits)))
		off += f.Bits
	}
	return netip.PrefixFrom(u128ToAddr(base, false), off), nil
}

// isFree reports whether the address with integer value v is neither
// owned nor held.
func (a *Allocator) isFree(p *pool, v u128) bool {
	addr := u128ToAddr(v, p.is4)
	_, taken := a.owners[addr]
	_, held := a.held[addr]
	return !taken && !held
}

func avoided(p *pool, v u128, avoid func(netip.Addr) bool) bool {
	return avoid != nil && avoid(u128ToAddr(v, p.is4))
}

// pickRandom tries random candidates in [lo, hi] and then falls back to a
// bounded linear scan from a random start.
func (a *Allocator) pickRandom(p *pool, lo, hi u128, avoid func(netip.Addr) bool) (u128, bool) {
	n := hi.sub(lo).add(u128One)
	for i := 0; i < randomTries; i++ {
		v := lo.add(randBelow(n))
		if a.isFree(p, v) && !avoided(p, v, avoid) {
			return v, true
		}
	}
	return a.scan(p, lo.add(randBelow(n)), lo, hi, avoid)
}

// scan walks forward from start through [lo, hi], wrapping, and returns
// the first free address. It inspects at most min(hi-lo+1, used+held+1)
// candidates: since at most that many addresses of the pool are taken,
// that many consecutive candidates always contain a free one unless the
// whole interval is in use.
func (a *Allocator) scan(p *pool, start, lo, hi u128, avoid func(netip.Addr) bool) (u128, bool) {
	n := hi.sub(lo).add(u128One)
	bound := p.used + p.held + 1
	small := n.hi == 0 && n.lo != 0
	if small && n.lo < bound {
		bound = n.lo
	}
	v := start
	for i := uint64(0); i < bound; i++ {
		if a.isFree(p, v) {
			if !avoided(p, v, avoid) {
				return v, true
			}
			// Held elsewhere: one more candidate to look at.
			if !small || bound < n.lo {
				bound++
			}
		}
		if v == hi {
			v = lo
		} else {
			v = v.add(u128One)
		}
	}
	return u128{}, false
}

// exhausted builds the ErrExhausted error for range rng (the pool itself,
// a sub-range or an embed sub-prefix) whose candidates are [lo, hi]. It is
// only called after a scan covered the whole interval, so all of it is in
// use.
func (a *Allocator) exhausted(p *pool, rng netip.Prefix, lo, hi u128, extra string) error {
	n := hi.sub(lo).add(u128One)
	held := ""
	if p.held > 0 {
		held = fmt.Sprintf(", %d of them as anycast or addresses IPs of this node", p.held)
	}
	if rng == p.cfg.Prefix {
		return errorf(ErrExhausted, "ipam: pool %s exhausted (%d of %s usable addresses in use%s%s)", p.cfg.Prefix, p.used+p.held, p.usable(), held, extra)
	}
	what := "range"
	if extra != "" {
		what = "embed sub-prefix"
	}
	return errorf(ErrExhausted, "ipam: %s %s of pool %s exhausted (%s of %s usable addresses in use%s; %d in use in the pool%s)", what, rng, p.cfg.Prefix, n, n, extra, p.used+p.held, held)
}

// Reserve records that owner holds addr, e.g. when re-loading committed
// allocations at agent start. It is idempotent for the same owner. It fails
// (ErrNotInPool) when addr is outside every pool or is a pool's all-zeros or
// all-ones address, and (ErrConflict) when another owner holds it.
func (a *Allocator) Reserve(addr netip.Addr, owner string) error {
	if owner == "" {
		return fmt.Errorf("ipam: reserve %s: empty owner", addr)
	}
	if !addr.IsValid() {
		return fmt.Errorf("ipam: reserve for %q: invalid address", owner)
	}
	addr = normAddr(addr)

	a.mu.Lock()
	defer a.mu.Unlock()

	p := a.poolOfLocked(addr)
	if p == nil {
		return errorf(ErrNotInPool, "ipam: cannot reserve %s for %q: not inside any pool of this node (pools: %s)", addr, owner, a.poolList())
	}
	switch v := addrToU128(addr); v {
	case p.first:
		return errorf(ErrNotInPool, "ipam: cannot reserve %s for %q: it is the all-zeros (network) address of pool %s", addr, owner, p.cfg.Prefix)
	case p.last:
		return errorf(ErrNotInPool, "ipam: cannot reserve %s for %q: it is the all-ones address of pool %s", addr, owner, p.cfg.Prefix)
	}
	if cur, taken := a.owners[addr]; taken {
		if cur == owner {
			return nil
		}
		return errorf(ErrConflict, "ipam: cannot reserve %s for %q: held by %q", addr, owner, cur)
	}
	if _, held := a.held[addr]; held {
		return errorf(ErrConflict, "ipam: cannot reserve %s for %q: in use on this node as an anycast or addresses IP", addr, owner)
	}
	a.owners[addr] = owner
	p.used++
	return nil
}

// Release frees addr if owner holds it and reports whether it did.
func (a *Allocator) Release(addr netip.Addr, owner string) bool {
	addr = normAddr(addr)
	a.mu.Lock()
	defer a.mu.Unlock()
	cur, taken := a.owners[addr]
	if !taken || cur != owner {
		return false
	}
	delete(a.owners, addr)
	if p := a.poolOfLocked(addr); p != nil {
		p.used--
	}
	if _, held := a.held[addr]; held {
		if p := a.heldInLocked(addr); p != nil {
			p.held++ // owned and held at once (a restore's leftover): held now
		}
	}
	return true
}

// Owner returns the owner of addr, if it is allocated.
func (a *Allocator) Owner(addr netip.Addr) (string, bool) {
	addr = normAddr(addr)
	a.mu.Lock()
	defer a.mu.Unlock()
	o, ok := a.owners[addr]
	return o, ok
}

// PoolOf returns the configured pool containing addr (boundary addresses
// included).
func (a *Allocator) PoolOf(addr netip.Addr) (Pool, bool) {
	addr = normAddr(addr)
	a.mu.Lock()
	defer a.mu.Unlock()
	if p := a.poolOfLocked(addr); p != nil {
		return copyPool(p.cfg), true
	}
	return Pool{}, false
}

// Pools returns the configured pools in config order.
func (a *Allocator) Pools() []Pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Pool, len(a.pools))
	for i, p := range a.pools {
		out[i] = copyPool(p.cfg)
	}
	return out
}

// Stats returns the usage of every pool in config order.
func (a *Allocator) Stats() []PoolStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]PoolStats, len(a.pools))
	for i, p := range a.pools {
		free := p.usable().sub(u128{0, p.used}).sub(u128{0, p.held})
		out[i] = PoolStats{
			Pool:       copyPool(p.cfg),
			Used:       p.used,
			Held:       p.held,
			Free:       free.String(),
			FreeApprox: free.float64(),
		}
	}
	return out
}

func copyPool(p Pool) Pool {
	p.Namespaces = append([]string(nil), p.Namespaces...)
	return p
}
