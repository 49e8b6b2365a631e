package lbassign

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// TestModel drives an Allocator with random Assigns (edits and resyncs),
// Releases, Reserves, Unreserves, SetPools and restarts (a new Allocator
// restored from every Service's status in random order, then assigned),
// the way the controller will, and checks every result against an
// independent model of the rules and, after every step:
//
//   - the allocator's addresses are the Services' status, and Owners and
//     InUse equal a recount;
//   - no address is held by two Services that may not share it, lies
//     outside the pools its holder may use, or is reserved;
//   - a Service's address never changes while it is still valid (the
//     model decides validity before each Assign);
//   - a failed Assign changes nothing;
//   - a restored allocator agrees with the old one.
//
// FLOCK_SEED=<n> repeats a run.
func TestModel(t *testing.T) {
	seed := testutil.Seed(t)
	steps := 20000
	if testing.Short() {
		steps = 2000
	}
	m := newModel(t, rand.New(rand.NewPCG(uint64(seed), 0x1b)))
	for m.step = range steps {
		m.do()
		m.check()
	}
	t.Logf("%d steps: %v", steps, m.stats)
}

// Candidate pools: small, overlapping each other and themselves, and one
// too big to count.
var modelPools = []struct {
	name  string
	cidrs []string
}{
	{"p6a", []string{"2001:db8:a::/126"}},
	{"p6b", []string{"2001:db8:b::8/128", "2001:db8:b::/127"}},
	{"p4a", []string{"192.0.2.0/30"}},
	{"p4b", []string{"198.51.100.0/31", "198.51.100.0/32"}},
	{"mix", []string{"2001:db8:c::/127", "203.0.113.8/31"}},
	{"over", []string{"2001:db8:a::2/127", "192.0.2.3/32"}},
	{"big", []string{"2001:db8:f::/64"}},
}

var modelNamespaces = []string{"a", "b"}

type mSvc struct {
	want   Service      // the spec (Current unset)
	eff    Service      // the spec of the last successful Assign: what the allocator recorded
	status []netip.Addr // status.loadBalancer.ingress
}

type model struct {
	t     *testing.T
	r     *rand.Rand
	step  int
	a     *Allocator
	def   corev1.IPFamily
	pools []Pool
	svcs  map[string]*mSvc
	res   map[netip.Addr]string
	univ  []netip.Addr // addresses to request and check
	stats map[string]int
}

func newModel(t *testing.T, r *rand.Rand) *model {
	m := &model{t: t, r: r, svcs: map[string]*mSvc{}, res: map[netip.Addr]string{}, stats: map[string]int{}}
	m.def = v6
	if r.IntN(2) == 0 {
		m.def = v4
	}
	for _, p := range modelPools {
		for _, c := range p.cidrs {
			pf := netip.MustParsePrefix(c)
			for x, i := pf.Addr(), 0; pf.Contains(x) && i < 12; x, i = x.Next(), i+1 {
				if !slices.Contains(m.univ, x) {
					m.univ = append(m.univ, x)
				}
			}
		}
	}
	m.univ = append(m.univ, ips("2001:db8:99::1", "10.0.0.1")...)
	m.pools = m.randPools()
	m.a = New(m.pools)
	m.a.DefaultFamily = m.def
	return m
}

func (m *model) fatalf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("step %d: %s", m.step, fmt.Sprintf(format, args...))
}

func (m *model) randPools() []Pool {
	allows := []func(string) bool{everyone, everyone, only("a"), only("b"), nil}
	var out []Pool
	for _, p := range modelPools {
		if p.name == "big" && m.r.IntN(5) > 0 || m.r.IntN(4) == 0 {
			continue
		}
		out = append(out, mkpool(p.name, allows[m.r.IntN(len(allows))], p.cidrs...))
	}
	m.r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

func (m *model) randAddr() string {
	if m.r.IntN(20) == 0 {
		return pick(m.r, "bogus", "fe80::1%eth0", "::ffff:192.0.2.1", "2001:DB8:A::1", " 192.0.2.1")
	}
	return pick(m.r, m.univ...).String()
}

// mutate changes one thing of s, or all.
func (m *model) mutate(s *Service) {
	r := m.r
	all := r.IntN(4) == 0
	if all || r.IntN(10) == 0 {
		s.Families = pick(r, []corev1.IPFamily{}, []corev1.IPFamily{v6}, []corev1.IPFamily{v4},
			[]corev1.IPFamily{v6, v4}, []corev1.IPFamily{v4, v6})
		if r.IntN(30) == 0 {
			s.Families = pick(r, []corev1.IPFamily{"IPv5"}, []corev1.IPFamily{v4, v4})
		}
	}
	if all || r.IntN(10) == 0 {
		s.Policy = pick(r, "", single, prefer, prefer, require, require)
		if r.IntN(30) == 0 {
			s.Policy = "Sometimes"
		}
	}
	if all || r.IntN(6) == 0 {
		s.Requested = nil
		if r.IntN(3) == 0 {
			s.Requested = append(s.Requested, m.randAddr())
			if r.IntN(3) == 0 {
				s.Requested = append(s.Requested, m.randAddr())
			}
		}
	}
	if all || r.IntN(8) == 0 {
		s.Pools = nil
		if r.IntN(4) == 0 {
			for range 1 + r.IntN(2) {
				s.Pools = append(s.Pools, pick(r, "p6a", "p6b", "p4a", "p4b", "mix", "over", "big", "nope"))
			}
		}
	}
	if all || r.IntN(4) == 0 {
		s.SharingKey = pick(r, "", "k1", "k1", "k2")
	}
	if all || r.IntN(4) == 0 {
		s.Ports = nil
		for range 1 + r.IntN(2) {
			s.Ports = append(s.Ports, pick(r, tcp(80), tcp(443), udp(53), tcp(53), Port{Port: 80}))
		}
	}
	if all || r.IntN(6) == 0 {
		s.Local = r.IntN(3) == 0
	}
	if all || r.IntN(6) == 0 {
		s.Selector = pick(r, nil, map[string]string{"app": "x"}, map[string]string{"app": "y"})
	}
}

func (m *model) keys() []string { return slices.Sorted(maps.Keys(m.svcs)) }

func (m *model) do() {
	r := m.r
	switch n := r.IntN(100); {
	case n < 45: // create or edit a Service
		key := fmt.Sprintf("%s/s%d", pick(r, modelNamespaces...), r.IntN(6))
		ms := m.svcs[key]
		if ms == nil {
			ns, _, _ := strings.Cut(key, "/")
			ms = &mSvc{want: Service{Key: key, Namespace: ns}}
			m.mutate(&ms.want)
			m.svcs[key] = ms
			m.stats["create"]++
		} else {
			m.mutate(&ms.want)
			m.stats["edit"]++
		}
		was := ms.status
		if err := m.assign(m.a, key); err != nil && ms.status != nil {
			// The user fixes it after reading the Event.
			ms.want = ms.eff
		} else if err == nil && r.IntN(5) == 0 && !slices.Equal(was, ms.status) {
			// The status write was lost: the controller retries with
			// the old status as Current.
			m.stats["lost write"]++
			m.assignWith(m.a, key, was)
		}
	case n < 60: // resync, nothing changed
		if len(m.svcs) > 0 {
			m.stats["resync"]++
			m.assign(m.a, pick(r, m.keys()...))
		}
	case n < 70: // delete, or no longer a LoadBalancer
		if len(m.svcs) > 0 {
			m.stats["release"]++
			key := pick(r, m.keys()...)
			m.a.Release(key)
			delete(m.svcs, key)
		}
	case n < 80:
		x := pick(r, m.univ...)
		by := fmt.Sprintf("pod-%d", m.step)
		m.stats["reserve"]++
		m.a.Reserve(x, by)
		m.res[x] = by
		m.resyncStale()
	case n < 87:
		if len(m.res) > 0 {
			m.stats["unreserve"]++
			x := pick(r, slices.SortedFunc(maps.Keys(m.res), netip.Addr.Compare)...)
			m.a.Unreserve(x)
			delete(m.res, x)
		}
	case n < 95:
		m.stats["setpools"]++
		m.pools = m.randPools()
		m.a.SetPools(m.pools)
		m.resyncStale()
	default:
		m.stats["restart"]++
		m.restart()
	}
}

// resyncStale does what the controller does after SetPools or Reserve:
// Assign every stale Service again, and Release it (clearing its status)
// when that fails.
func (m *model) resyncStale() {
	stale := m.a.Stale()
	if want := m.stale(); !slices.Equal(stale, want) {
		m.fatalf("Stale = %v, want %v", stale, want)
	}
	for _, key := range stale {
		m.stats["stale"]++
		if err := m.assign(m.a, key); err != nil {
			m.stats["stale released"]++
			m.a.Release(key)
			m.svcs[key].status = nil
		}
	}
}

// restart restores a new allocator from the statuses, in random order,
// checks it agrees with the old one, then assigns every Service.
func (m *model) restart() {
	b := New(m.pools)
	b.DefaultFamily = m.def
	for x, by := range m.res {
		b.Reserve(x, by)
	}
	keys := m.keys()
	m.r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	for _, key := range keys {
		s := m.svcs[key].want
		s.Current = slices.Clone(m.svcs[key].status)
		if got := b.Restore(s); !slices.Equal(got, m.svcs[key].status) {
			m.fatalf("Restore(%s) = %v, want its status %v", key, got, m.svcs[key].status)
		}
	}
	if was, now := m.snapshot(m.a), m.snapshot(b); was != now {
		m.fatalf("restored allocator disagrees:\n%s\nold:\n%s", now, was)
	}
	m.a = b
	m.r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	for _, key := range keys {
		m.assign(b, key)
	}
}

func (m *model) snapshot(a *Allocator) string {
	var b strings.Builder
	for _, k := range m.keys() {
		fmt.Fprintf(&b, "%s %v\n", k, a.Addrs(k))
	}
	for _, x := range m.addrs() {
		fmt.Fprintf(&b, "%s %v\n", x, a.Owners(x))
	}
	for _, p := range modelPools {
		u, s := a.InUse(p.name)
		fmt.Fprintf(&b, "%s %d %d\n", p.name, u, s)
	}
	fmt.Fprintf(&b, "stale %v\n", a.Stale())
	return b.String()
}

// addrs: the universe and every held address.
func (m *model) addrs() []netip.Addr {
	xs := slices.Clone(m.univ)
	for _, ms := range m.svcs {
		xs = append(xs, ms.status...)
	}
	slices.SortFunc(xs, netip.Addr.Compare)
	return slices.Compact(xs)
}

// assign Assigns key's spec with its status as Current on a, and checks
// the result against the model's own reading of the rules.
func (m *model) assign(a *Allocator, key string) error {
	return m.assignWith(a, key, m.svcs[key].status)
}

// assignWith is assign with Current as the status, when that differs from
// what the allocator recorded (the model's status).
func (m *model) assignWith(a *Allocator, key string, current []netip.Addr) error {
	ms := m.svcs[key]
	s := ms.want
	s.Current = slices.Clone(current)
	valid := map[netip.Addr]bool{}
	for _, x := range current {
		valid[x] = m.valid(key, s, x)
	}
	want, wantErr := m.expect(key, s)
	before := m.snapshot(a)
	got, err := a.Assign(s)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(err.Error(), strconv.Quote(e.Value)) {
			m.fatalf("Assign(%+v): error %q is not an *Error quoting its value", s, err)
		}
		m.stats["error "+string(e.Code)]++
		if wantErr == "" {
			m.fatalf("Assign(%+v) = %v, want %v", s, err, want)
		}
		if e.Code != Code(wantErr) {
			m.fatalf("Assign(%+v) = %v (%s), want code %s", s, err, e.Code, wantErr)
		}
		if now := m.snapshot(a); now != before {
			m.fatalf("failed Assign(%+v) changed the state:\n%s\nwas:\n%s", s, now, before)
		}
		return err
	}
	m.stats["assign ok"]++
	if wantErr != "" {
		m.fatalf("Assign(%+v) = %v, want error %s", s, got, wantErr)
	}
	if !slices.Equal(got, want) {
		m.fatalf("Assign(%+v) = %v, want %v", s, got, want)
	}
	for x, ok := range valid {
		if ok && !slices.Contains(got, x) {
			m.fatalf("Assign(%+v) = %v dropped %s, still valid", s, got, x)
		}
	}
	if !slices.Equal(got, ms.status) {
		m.stats["moved or new"]++
	}
	for _, x := range got {
		if len(a.Owners(x)) > 1 {
			m.stats["shared"]++
			break
		}
	}
	if len(got) == 2 {
		m.stats["dual"]++
	}
	ms.status, ms.eff = got, ms.want
	return nil
}

// fams is the model's reading of the family rules: the candidates,
// primary first, and how many are required; ok false for a bad spec.
func (m *model) fams(s Service) (fs []corev1.IPFamily, required int, ok bool) {
	for i, f := range s.Families {
		if f != v4 && f != v6 || slices.Contains(s.Families[:i], f) {
			return nil, 0, false
		}
	}
	fs = slices.Clone(s.Families)
	if len(fs) == 0 {
		fs = []corev1.IPFamily{m.def}
	}
	switch s.Policy {
	case "", single:
		return fs[:1], 1, true
	case prefer, require:
		// PreferDualStack keeps the families the API server gave it; only
		// unresolved (empty) ones, or RequireDualStack, get both.
		if len(fs) == 1 && (len(s.Families) == 0 || s.Policy == require) {
			fs = append(fs, other(fs[0]))
		}
		if s.Policy == require {
			return fs, 2, true
		}
		return fs, 0, true
	}
	return nil, 0, false
}

func (m *model) pool(name string) *Pool {
	for i := range m.pools {
		if m.pools[i].Name == name {
			return &m.pools[i]
		}
	}
	return nil
}

func contains(p Pool, x netip.Addr) bool {
	return slices.ContainsFunc(p.Prefixes, func(pf netip.Prefix) bool { return pf.Contains(x) })
}

func allowed(p Pool, ns string) bool { return p.Allows != nil && p.Allows(ns) }

// usablePools: allowed to ns and named (trimmed names; empty: any), by name.
func (m *model) usablePools(ns string, names []string) []Pool {
	var out []Pool
	for _, p := range m.pools {
		if allowed(p, ns) && (len(names) == 0 || slices.Contains(names, p.Name)) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(x, y Pool) int { return strings.Compare(x.Name, y.Name) })
	return out
}

func trimmed(names []string) []string {
	var out []string
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func compatible(x, y Service) bool {
	if got, want := MayShare(x, y), compatibleRule(x, y); got != want {
		panic(fmt.Sprintf("MayShare(%+v, %+v) = %v, the model says %v", x, y, got, want))
	}
	return compatibleRule(x, y)
}

func compatibleRule(x, y Service) bool {
	if x.Namespace != y.Namespace || x.SharingKey == "" || x.SharingKey != y.SharingKey || x.Local != y.Local ||
		x.Local && !maps.Equal(x.Selector, y.Selector) {
		return false
	}
	norm := func(p Port) Port {
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		return p
	}
	for _, p := range x.Ports {
		for _, q := range y.Ports {
			if norm(p) == norm(q) {
				return false
			}
		}
	}
	return true
}

// shareable: x may be given to s as far as the other holders go.
func (m *model) shareable(key string, s Service, x netip.Addr) bool {
	for k, o := range m.svcs {
		if k != key && slices.Contains(o.status, x) && !compatible(s, o.eff) {
			return false
		}
	}
	return true
}

func (m *model) free(key string, s Service, x netip.Addr, pools []Pool) bool {
	_, reserved := m.res[x]
	return !reserved && m.shareable(key, s, x) && slices.ContainsFunc(pools, func(p Pool) bool { return contains(p, x) })
}

// valid: s may keep x (the model's reading of "still valid").
func (m *model) valid(key string, s Service, x netip.Addr) bool {
	fs, _, ok := m.fams(s)
	if !ok || !slices.Contains(fs, family(x)) {
		return false
	}
	for _, raw := range s.Requested {
		if r, err := netip.ParseAddr(strings.TrimSpace(raw)); err == nil && family(r) == family(x) && r != x {
			return false
		}
	}
	return m.free(key, s, x, m.usablePools(s.Namespace, trimmed(s.Pools)))
}

// expect is the model's answer to Assign(s): the addresses, or the code
// of the error.
func (m *model) expect(key string, s Service) ([]netip.Addr, string) {
	fs, required, ok := m.fams(s)
	if !ok {
		return nil, string(CodeInvalid)
	}
	names := trimmed(s.Pools)
	for _, n := range names {
		p := m.pool(n)
		if p == nil {
			return nil, string(CodeUnknownPool)
		}
		if !allowed(*p, s.Namespace) {
			return nil, string(CodePoolNotAllowed)
		}
	}
	pools := m.usablePools(s.Namespace, names)
	req := map[corev1.IPFamily]netip.Addr{}
	for _, raw := range s.Requested {
		x, err := netip.ParseAddr(strings.TrimSpace(raw))
		if err != nil || x.Zone() != "" || x.Is4In6() {
			return nil, string(CodeInvalid)
		}
		if _, dup := req[family(x)]; dup || !slices.Contains(fs, family(x)) {
			return nil, string(CodeWrongFamily)
		}
		req[family(x)] = x
	}
	for _, f := range fs {
		x, ok := req[f]
		if !ok {
			continue
		}
		if !slices.ContainsFunc(pools, func(p Pool) bool { return contains(p, x) }) {
			return nil, string(CodeNotInPool)
		}
		if _, ok := m.res[x]; ok {
			return nil, string(CodeReserved)
		}
		if !m.shareable(key, s, x) {
			return nil, string(CodeInUse)
		}
		if routerAnycast(x) && !slices.Contains(append(slices.Clone(s.Current), m.svcs[key].status...), x) {
			return nil, string(CodeReserved)
		}
	}
	var out []netip.Addr
	for i, f := range fs {
		if x, ok := req[f]; ok {
			out = append(out, x)
			continue
		}
		// Kept: Current, then what the allocator recorded.
		had := append(slices.Clone(s.Current), m.svcs[key].status...)
		if j := slices.IndexFunc(had, func(x netip.Addr) bool { return family(x) == f && m.valid(key, s, x) }); j >= 0 {
			out = append(out, had[j])
			continue
		}
		// First fit: pools by name, then addresses in order.
		var got, any bool
		for _, p := range pools {
			var xs []netip.Addr
			for _, pf := range p.Prefixes {
				if family(pf.Addr()) != f {
					continue
				}
				any = true
				for x, n := pf.Addr(), 0; pf.Contains(x) && n < 64; x, n = x.Next(), n+1 {
					xs = append(xs, x)
				}
			}
			slices.SortFunc(xs, netip.Addr.Compare)
			if j := slices.IndexFunc(xs, func(x netip.Addr) bool { return !routerAnycast(x) && m.free(key, s, x, pools) }); j >= 0 {
				out, got = append(out, xs[j]), true
				break
			}
		}
		if got {
			continue
		}
		if i < required {
			if !any {
				return nil, string(CodeNoPool)
			}
			return nil, string(CodeExhausted)
		}
	}
	if len(out) == 0 {
		// Every family missing: NoPool only if none has a pool.
		for _, f := range fs {
			for _, p := range pools {
				if slices.ContainsFunc(p.Prefixes, func(pf netip.Prefix) bool { return family(pf.Addr()) == f }) {
					return nil, string(CodeExhausted)
				}
			}
		}
		return nil, string(CodeNoPool)
	}
	return out, ""
}

// stale: the Services holding a reserved address or one outside the pools
// they may use.
func (m *model) stale() []string {
	var out []string
	for _, key := range m.keys() {
		ms := m.svcs[key]
		pools := m.usablePools(ms.eff.Namespace, trimmed(ms.eff.Pools))
		for _, x := range ms.status {
			_, reserved := m.res[x]
			if reserved || !slices.ContainsFunc(pools, func(p Pool) bool { return contains(p, x) }) {
				out = append(out, key)
				break
			}
		}
	}
	return out
}

// check the invariants.
func (m *model) check() {
	a := m.a
	holders := map[netip.Addr][]string{}
	for _, key := range m.keys() {
		ms := m.svcs[key]
		if got := a.Addrs(key); !slices.Equal(got, ms.status) {
			m.fatalf("Addrs(%s) = %v, status %v", key, got, ms.status)
		}
		// Recorded is the Service as last assigned, and puts it back.
		if r, ok := a.Recorded(key); ok != (len(ms.status) > 0) || ok && (!slices.Equal(r.Current, ms.status) || Terms(r) != Terms(ms.eff)) {
			m.fatalf("Recorded(%s) = %+v, %v; status %v, terms %q", key, r, ok, ms.status, Terms(ms.eff))
		} else if ok {
			was := m.snapshot(a)
			a.Release(key)
			if got := a.Restore(r); !slices.Equal(got, ms.status) {
				m.fatalf("Restore(Recorded(%s)) = %v, want %v", key, got, ms.status)
			}
			if now := m.snapshot(a); now != was {
				m.fatalf("Release and Restore(Recorded(%s)) changed the state:\n%s\nwas:\n%s", key, now, was)
			}
		}
		fs, _, _ := m.fams(ms.eff)
		seen := map[corev1.IPFamily]bool{}
		for _, x := range ms.status {
			if !slices.Contains(fs, family(x)) || seen[family(x)] {
				m.fatalf("%s holds %v: not one per family of %v", key, ms.status, fs)
			}
			seen[family(x)] = true
			holders[x] = append(holders[x], key)
		}
	}
	for _, x := range m.addrs() {
		if got := a.Owners(x); !slices.Equal(got, holders[x]) {
			m.fatalf("Owners(%s) = %v, want %v", x, got, holders[x])
		}
		if len(holders[x]) == 0 {
			continue
		}
		if by, ok := m.res[x]; ok {
			m.fatalf("%s reserved by %s, held by %v", x, by, holders[x])
		}
		for i, k := range holders[x] {
			e := m.svcs[k].eff
			if !slices.ContainsFunc(m.usablePools(e.Namespace, trimmed(e.Pools)), func(p Pool) bool { return contains(p, x) }) {
				m.fatalf("%s holds %s, outside the pools it may use", k, x)
			}
			for _, l := range holders[x][:i] {
				if !compatible(e, m.svcs[l].eff) {
					m.fatalf("%s held by %s and %s, which may not share", x, l, k)
				}
			}
		}
	}
	for _, p := range modelPools {
		var used uint64
		for x := range holders {
			if q := m.pool(p.name); q != nil && contains(*q, x) {
				used++
			}
		}
		var size uint64
		if m.pool(p.name) != nil {
			size = modelSize(p.cidrs)
		}
		if u, s := a.InUse(p.name); u != used || s != size {
			m.fatalf("InUse(%s) = %d, %d; want %d, %d", p.name, u, s, used, size)
		}
	}
	if s := a.Stale(); s != nil {
		m.fatalf("Stale = %v after the resync", s)
	}
}

// modelSize counts distinct addresses, saturating for a /64 or more.
func modelSize(cidrs []string) uint64 {
	seen := map[netip.Addr]bool{}
	for _, c := range cidrs {
		pf := netip.MustParsePrefix(c)
		if pf.Addr().BitLen()-pf.Bits() >= 64 {
			return math.MaxUint64
		}
		for x := pf.Addr(); pf.Contains(x); x = x.Next() {
			seen[x] = !routerAnycast(x)
		}
	}
	n := uint64(0)
	for _, ok := range seen {
		if ok {
			n++
		}
	}
	return n
}

// routerAnycast: an IPv6 address whose last 64 bits are zero (RFC 4291
// §2.6.1's Subnet-Router anycast), never handed out.
func routerAnycast(x netip.Addr) bool {
	b := x.As16()
	return x.Is6() && !x.Is4In6() && string(b[8:]) == string(make([]byte, 8))
}
