// Package lbassign is the pure core of LoadBalancer address assignment: it
// decides which addresses of the loadBalancer AddressPools a Service of
// type LoadBalancer gets (status.loadBalancer.ingress). It holds no client,
// does no I/O and starts no goroutines; it is not safe for concurrent use
// (the leader-elected controller that feeds it serializes its calls).
//
// Modelled on MetalLB's allocator (internal/allocator) and on Kubernetes'
// rules for spec.ipFamilies and spec.ipFamilyPolicy:
//
//   - Families. SingleStack (or empty) gets the first family of
//     spec.ipFamilies; RequireDualStack both, or an error; PreferDualStack
//     the families of spec.ipFamilies (what the API server gave it: one
//     on a single-stack cluster, where kube-proxy serves no other), each
//     when a pool of that family is allowed to the namespace and has a
//     free address. Empty spec.ipFamilies (not yet filled in) means
//     Allocator.DefaultFamily (IPv6 unless set), plus the other family
//     for the dual-stack policies. Addresses come back primary family
//     first.
//   - Stability. A family's address is kept while it is still valid —
//     the Service's status (Service.Current) first, then what the
//     allocator recorded — so an unrelated edit, a restart or a new leader
//     never moves it. Valid: of a family the Service gets, in a pool
//     allowed to its namespace (and named by its address-pool annotation,
//     if any), equal to what it requests for that family (if it does),
//     not reserved, and shareable with every other holder.
//   - Requests. An address in loadBalancerIPs (or spec.loadBalancerIP)
//     pins its family; the families it does not name are kept or
//     allocated as above (like spec.clusterIPs, where Kubernetes fills in
//     a missing secondary; MetalLB instead refuses a request that does not
//     cover every family).
//   - Allocation. The first usable address in pool name order, then
//     address order. Usable: not reserved and free, or held only by
//     Services it may be shared with (MetalLB's getIPFromCIDR does the
//     same: first fit over free and shareable alike). Every address of a
//     prefix is handed out, network and broadcast-like ones included
//     (MetalLB only skips IPv4 addresses ending in .0 and .255 in pools
//     with avoidBuggyIPs, an opt-in for buggy CPE firmware, and flock
//     advertises each address as a host route, where they are not
//     special), but for IPv6 Subnet-Router anycast addresses (interface
//     identifier zero, RFC 4291 §2.6.1: routers answer them), which are
//     neither allocated nor granted on request; a Service that holds one
//     already keeps it.
//   - Sharing (MetalLB's allow-shared-ip). Services may hold one address
//     only if all are in one namespace, have the same non-empty sharing
//     key, no two use the same port (number and protocol), all have the
//     same externalTrafficPolicy and, when Local, the same selector.
//     MetalLB shares across namespaces; here a key, which anyone who can
//     read Services can copy, does not let another namespace join (and
//     then pin) an address. MetalLB's backend key lets a Local Service
//     with an empty selector share with Cluster ones; here the policies
//     must match. A sole holder may change its key in place (as in
//     MetalLB).
//   - Errors. A bad input (see Code) returns an *Error naming the field,
//     the value and why, and changes nothing: the Service keeps what it
//     had and nothing new is recorded. MetalLB instead clears a Service's
//     address before trying again, so a typo in an annotation takes it
//     away.
//
// A new leader calls Restore for every Service that has addresses before
// its first Assign, so that a Service assigned early cannot take the
// address of one not seen yet. Recorded returns a Service as last
// assigned or restored, for putting it back when what Assign gave it
// could not be carried out; Terms is what its sharing depends on, in a
// form a claim can record (ParseTerms reads it back).
package lbassign

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Annotations a Service may carry, and the fields errors name.
const (
	AnnotationLoadBalancerIPs = "flock.fritzlab.net/loadBalancerIPs"
	AnnotationAddressPool     = "flock.fritzlab.net/address-pool"
	AnnotationAllowSharedIP   = "flock.fritzlab.net/allow-shared-ip"

	FieldLoadBalancerIPs = "metadata.annotations[" + AnnotationLoadBalancerIPs + "]"
	FieldLoadBalancerIP  = "spec.loadBalancerIP" // deprecated
	FieldAddressPool     = "metadata.annotations[" + AnnotationAddressPool + "]"
	FieldIPFamilies      = "spec.ipFamilies"
	FieldIPFamilyPolicy  = "spec.ipFamilyPolicy"
)

// Pool is an AddressPool with use loadBalancer.
type Pool struct {
	Name string
	// Prefixes, IPv6 and/or IPv4. Overlapping ones count once.
	Prefixes []netip.Prefix
	// Allows says whether a namespace may use the pool; nil: none may
	// (an AddressPool with neither namespaces nor a selector).
	Allows func(namespace string) bool
}

// Port is one port of a Service.
type Port struct {
	Port     int32
	Protocol corev1.Protocol // empty: TCP, as in the API
}

func (p Port) String() string { return fmt.Sprintf("%s/%d", p.Protocol, p.Port) }

// Service is what the allocator needs of a Service of type LoadBalancer.
type Service struct {
	Key       string // namespace/name
	Namespace string
	// Families is spec.ipFamilies, in order; empty: the cluster default
	// (Allocator.DefaultFamily).
	Families []corev1.IPFamily
	// Policy is spec.ipFamilyPolicy; empty: SingleStack.
	Policy corev1.IPFamilyPolicy
	// Requested are the raw addresses asked for, at most one per family.
	Requested []string
	// RequestedField is where Requested came from, for errors:
	// FieldLoadBalancerIPs (when empty) or FieldLoadBalancerIP.
	RequestedField string
	// Pools are the raw pool names of the address-pool annotation; empty:
	// any pool allowed to the namespace.
	Pools      []string
	SharingKey string // the allow-shared-ip annotation
	Ports      []Port
	Local      bool // externalTrafficPolicy Local
	Selector   map[string]string
	// Current is what status.loadBalancer.ingress holds now.
	Current []netip.Addr
}

// Terms is everything sharing an address depends on, in a canonical
// form: the sharing key, the ports (protocol/port, sorted) and, when
// Local, the selector; "" for a Service that does not share. A Service
// whose terms changed since it got a shared address may no longer fit
// its sharers.
func Terms(s Service) string {
	if s.SharingKey == "" {
		return ""
	}
	var ports []string
	for _, p := range s.Ports {
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		ports = append(ports, p.String())
	}
	slices.Sort(ports)
	t := fmt.Sprintf("%q %s", s.SharingKey, strings.Join(slices.Compact(ports), ","))
	if s.Local {
		t += " Local " + selectorString(s.Selector)
	}
	return t
}

// MayShare tells whether two Services may hold one address: the same
// namespace, the same non-empty sharing key, the same externalTrafficPolicy and, when Local,
// the same selector, and no port (number and protocol) in common.
func MayShare(x, y Service) bool {
	if x.Namespace != y.Namespace || x.SharingKey == "" || x.SharingKey != y.SharingKey || x.Local != y.Local || x.Local && !maps.Equal(x.Selector, y.Selector) {
		return false
	}
	tcp := func(p Port) Port {
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		return p
	}
	for _, p := range x.Ports {
		if slices.ContainsFunc(y.Ports, func(q Port) bool { return tcp(p) == tcp(q) }) {
			return false
		}
	}
	return true
}

// ParseTerms reads what Terms wrote: a Service with only SharingKey,
// Ports, Local and Selector set. (Label keys and values hold no ',' or
// '=', so the selector reads back unambiguously.)
func ParseTerms(t string) (Service, error) {
	q, err := strconv.QuotedPrefix(t)
	if err != nil {
		return Service{}, fmt.Errorf("sharing terms %q: %w", t, err)
	}
	var s Service
	s.SharingKey, _ = strconv.Unquote(q)
	ports, sel, local := strings.Cut(strings.TrimPrefix(t[len(q):], " "), " Local ")
	s.Local = local
	for p := range strings.SplitSeq(ports, ",") {
		if p == "" {
			continue
		}
		proto, num, _ := strings.Cut(p, "/")
		n, err := strconv.ParseInt(num, 10, 32)
		if err != nil {
			return Service{}, fmt.Errorf("sharing terms %q: port %q: %w", t, p, err)
		}
		s.Ports = append(s.Ports, Port{Port: int32(n), Protocol: corev1.Protocol(proto)})
	}
	if local && sel != "{}" {
		s.Selector = map[string]string{}
		for kv := range strings.SplitSeq(sel, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return Service{}, fmt.Errorf("sharing terms %q: selector %q: not key=value", t, kv)
			}
			s.Selector[k] = v
		}
	}
	return s, nil
}

// Code classifies an Error, e.g. for an Event's reason.
type Code string

// Codes of Error.
const (
	CodeInvalid        Code = "Invalid"        // malformed value
	CodeWrongFamily    Code = "WrongFamily"    // requested address of a family the Service does not get, or two of one
	CodeNotInPool      Code = "NotInPool"      // requested address outside every usable pool
	CodeInUse          Code = "InUse"          // requested address held by a Service it may not be shared with
	CodeReserved       Code = "Reserved"       // requested address reserved by something else
	CodeUnknownPool    Code = "UnknownPool"    // address-pool names no loadBalancer pool
	CodePoolNotAllowed Code = "PoolNotAllowed" // address-pool names a pool the namespace may not use
	CodeNoPool         Code = "NoPool"         // no usable pool has a family the Service needs
	CodeExhausted      Code = "Exhausted"      // the usable pools of a family have no free address
)

// Error is a bad input: the field, its value, and why.
type Error struct {
	Code   Code
	Field  string
	Value  string
	Reason string
	Err    error // the underlying error, if any
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Allocator tracks the pools, the Services' addresses and the reserved
// addresses. The zero value is not usable: call New.
type Allocator struct {
	// DefaultFamily is the cluster's primary family, for Services with no
	// spec.ipFamilies; empty: IPv6.
	DefaultFamily corev1.IPFamily

	pools    []pool // by name
	byName   map[string]*pool
	svcs     map[string]*record
	holders  map[netip.Addr]map[string]struct{} // address → Service keys
	reserved map[netip.Addr]string              // address → holder
	used     map[string]uint64                  // pool → held addresses in it
}

type pool struct {
	name     string
	prefixes []netip.Prefix // disjoint, by address
	allows   func(string) bool
	size     uint64
}

// record is a Service's assignment and the attributes sharing depends on,
// as of its last successful Assign or Restore.
type record struct {
	ns       string
	addrs    []netip.Addr
	sharing  string
	ports    []Port
	local    bool
	selector map[string]string
	pools    []string // address-pool annotation; nil: any allowed
	in       Service  // the input, without Current
}

// New returns an Allocator of pools with no assignments.
func New(pools []Pool) *Allocator {
	a := &Allocator{
		svcs:     map[string]*record{},
		holders:  map[netip.Addr]map[string]struct{}{},
		reserved: map[netip.Addr]string{},
	}
	a.SetPools(pools)
	return a
}

// SetPools replaces the pools. Assignments stay: a Service whose address
// is no longer in a pool it may use is reported by Stale.
func (a *Allocator) SetPools(pools []Pool) {
	a.pools = make([]pool, 0, len(pools)) // byName points into it: never reuse the old one
	a.byName = map[string]*pool{}
	for _, p := range pools {
		if _, dup := a.byName[p.Name]; dup {
			continue // names are unique in the API; keep the first
		}
		a.pools = append(a.pools, pool{name: p.Name, prefixes: normalize(p.Prefixes), allows: p.Allows})
	}
	slices.SortFunc(a.pools, func(x, y pool) int { return strings.Compare(x.name, y.name) })
	for i := range a.pools {
		p := &a.pools[i]
		for _, pf := range p.prefixes {
			p.size = addSat(p.size, prefixSize(pf))
		}
		a.byName[p.name] = p
	}
	a.used = map[string]uint64{}
	for addr := range a.holders {
		a.count(addr, 1)
	}
}

// normalize masks the prefixes, drops invalid ones and those inside
// another, and sorts them by address, so that sizes count each address
// once and allocation walks addresses in order.
func normalize(in []netip.Prefix) []netip.Prefix {
	var ps []netip.Prefix
	for _, p := range in {
		if p.IsValid() {
			ps = append(ps, p.Masked())
		}
	}
	// Shorter first among equal addresses, so a covering prefix precedes
	// what it covers.
	slices.SortFunc(ps, func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(x.Bits(), y.Bits())
	})
	var out []netip.Prefix
	for _, p := range ps {
		covered := false
		for _, q := range out {
			if q.Addr().Is4() == p.Addr().Is4() && q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	return out
}

// prefixSize is how many addresses of p Assign may hand out: all but
// the Subnet-Router anycast ones (saturating at MaxUint64).
func prefixSize(p netip.Prefix) uint64 {
	n := p.Addr().BitLen() - p.Bits()
	if n >= 64 {
		return math.MaxUint64
	}
	if SubnetRouterAnycast(p.Addr()) {
		return 1<<n - 1 // longer than /64: its first address only
	}
	return 1 << n
}

// SubnetRouterAnycast tells whether addr is an IPv6 Subnet-Router anycast
// address: its /64's prefix with an interface identifier of zero (RFC
// 4291 §2.6.1; unicast interface identifiers are 64 bits, §2.5.1). Every
// router with an interface on that /64 answers it, so Assign never hands
// one out (a Service given one by an older release keeps it: an address
// in use never moves).
func SubnetRouterAnycast(addr netip.Addr) bool {
	if !addr.Is6() || addr.Is4In6() {
		return false
	}
	b := addr.As16()
	return binary.BigEndian.Uint64(b[8:]) == 0
}

func addSat(x, y uint64) uint64 {
	s, carry := bits.Add64(x, y, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

// count adds d (±1) to the used count of every pool holding addr.
func (a *Allocator) count(addr netip.Addr, d int) {
	for i := range a.pools {
		if a.pools[i].contains(addr) {
			if d > 0 {
				a.used[a.pools[i].name]++
			} else {
				a.used[a.pools[i].name]--
			}
		}
	}
}

func (p *pool) contains(addr netip.Addr) bool {
	for _, pf := range p.prefixes {
		if pf.Contains(addr) {
			return true
		}
	}
	return false
}

func (p *pool) hasFamily(f corev1.IPFamily) bool {
	for _, pf := range p.prefixes {
		if family(pf.Addr()) == f {
			return true
		}
	}
	return false
}

func (p *pool) allowed(ns string) bool { return p.allows != nil && p.allows(ns) }

func family(addr netip.Addr) corev1.IPFamily {
	if addr.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

func other(f corev1.IPFamily) corev1.IPFamily {
	if f == corev1.IPv4Protocol {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// InUse returns how many addresses of pool Services hold (an address in
// two pools counts in both; reserved ones do not count) and the pool's
// size, saturating at MaxUint64. An unknown pool: 0, 0.
func (a *Allocator) InUse(pool string) (used, size uint64) {
	p := a.byName[pool]
	if p == nil {
		return 0, 0
	}
	return a.used[pool], p.size
}

// Owners returns the keys of the Services holding ip, sorted.
func (a *Allocator) Owners(ip netip.Addr) []string {
	return slices.Sorted(maps.Keys(a.holders[ip]))
}

// Addrs returns what the allocator recorded for the Service key.
func (a *Allocator) Addrs(key string) []netip.Addr {
	if r := a.svcs[key]; r != nil {
		return slices.Clone(r.addrs)
	}
	return nil
}

// Recorded returns the Service key as of its last successful Assign or
// Restore, with its addresses as Current: Restore(Recorded(key)) after a
// Release puts it back as it was, e.g. when what Assign gave it could not
// be carried out.
func (a *Allocator) Recorded(key string) (Service, bool) {
	r := a.svcs[key]
	if r == nil {
		return Service{}, false
	}
	s := r.in
	s.Families, s.Requested, s.Pools, s.Ports = slices.Clone(s.Families), slices.Clone(s.Requested), slices.Clone(s.Pools), slices.Clone(s.Ports)
	s.Selector = maps.Clone(s.Selector)
	s.Current = slices.Clone(r.addrs)
	return s, true
}

// Reserve marks ip as taken by something other than a Service of this
// allocator (a pod's claim, another cluster object), named by: Assign
// never hands it out. Services holding it are reported by Stale.
func (a *Allocator) Reserve(ip netip.Addr, by string) { a.reserved[ip] = by }

// Unreserve undoes Reserve.
func (a *Allocator) Unreserve(ip netip.Addr) { delete(a.reserved, ip) }

// Reserved returns the reserved addresses and by whom (a copy).
func (a *Allocator) Reserved() map[netip.Addr]string { return maps.Clone(a.reserved) }

// Release forgets the Service key (deleted, or no longer a LoadBalancer)
// and frees its addresses that no other Service shares.
func (a *Allocator) Release(key string) {
	r := a.svcs[key]
	if r == nil {
		return
	}
	delete(a.svcs, key)
	for _, addr := range r.addrs {
		h := a.holders[addr]
		delete(h, key)
		if len(h) == 0 {
			delete(a.holders, addr)
			a.count(addr, -1)
		}
	}
}

func (a *Allocator) record(key string, r *record) {
	a.Release(key)
	a.svcs[key] = r
	for _, addr := range r.addrs {
		h := a.holders[addr]
		if h == nil {
			h = map[string]struct{}{}
			a.holders[addr] = h
			a.count(addr, 1)
		}
		h[key] = struct{}{}
	}
}

// Stale returns the keys, sorted, of the Services holding an address that
// is reserved, or no longer in a pool they may use (SetPools changed the
// pools or who may use them): the controller Assigns them again, and
// decides what to do (e.g. Release and clear the status) when that fails.
func (a *Allocator) Stale() []string {
	var out []string
	for key, r := range a.svcs {
		for _, addr := range r.addrs {
			if _, ok := a.reserved[addr]; ok || !a.inPools(addr, r.ns, r.pools) {
				out = append(out, key)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// inPools says whether addr is in a pool allowed to ns and, when names is
// not empty, named in it.
func (a *Allocator) inPools(addr netip.Addr, ns string, names []string) bool {
	for i := range a.pools {
		p := &a.pools[i]
		if p.allowed(ns) && (len(names) == 0 || slices.Contains(names, p.name)) && p.contains(addr) {
			return true
		}
	}
	return false
}
