package loadbalancers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/lbassign"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// TestAssignerModel drives leadership terms of the assigner (newState,
// pass) step by step against the fake claims (k8s/claims's rules) and a
// Services store, with random operations: Services created, edited
// (sharing keys, ports, traffic policy, selectors, requested addresses —
// often another Service's, to share it), deleted, and re-created under
// their name unseen; pods claiming free addresses and letting them go;
// full passes; status writes lost; leaders dying right after a claim or
// at the status write (between claim and status), dead leaders' claims
// for live Services; plain restarts. An edit the allocator refuses is put
// back (the user reads the Event): the Service keeps what it had, under
// the spec it was given it under. Once the marked Services are synced:
//
//   - every Service's status address is claimed for it (that
//     incarnation);
//   - an address in use moves only when its own Service is edited,
//     deleted or re-created: never because another asked to share it,
//     nor across a restart or a crash;
//   - no address is in the status of two Services unless both are its
//     owners in the allocator and the terms their claim records may
//     share (MetalLB's rules, read here from the terms);
//
// and after every full pass besides:
//
//   - every hold on a claim is backed: a live Service of that UID with
//     the address in its status (no orphans, of dead Services or live);
//   - the allocator gives each Service what its status says;
//   - the reservations are exactly the pods' claims (no leaked
//     reservations).
//
// (An edit whose claim waits for its sharers' to catch up is left out of
// the sharing check until they have.)
//
// FLOCK_SEED=<n> repeats a run.
func TestAssignerModel(t *testing.T) {
	seed := testutil.Seed(t)
	steps := 4000
	if testing.Short() {
		steps = 600
	}
	m := newAModel(t, rand.New(rand.NewPCG(uint64(seed), 0x1b)))
	m.restart()
	for m.step = range steps {
		m.do()
	}
	t.Logf("%d steps: %v", steps, m.stats)
	for _, must := range []string{"shared", "crash", "orphan of a live Service released", "reserve", "recreate", "status lost", "edit refused"} {
		if m.stats[must] == 0 && !testing.Short() {
			t.Errorf("no %q in %d steps: the model no longer reaches it", must, steps)
		}
	}
}

var aModelPools = []lbassign.Pool{
	{Name: "lb", Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8:1b::100/125"), netip.MustParsePrefix("203.0.113.128/30")},
		Allows: func(string) bool { return true }},
	{Name: "only-a", Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8:2b::/127")},
		Allows: func(ns string) bool { return ns == "a" }},
}

// crashAt says where the leader dies in the current operation.
type crashAt int

const (
	noCrash       crashAt = iota
	crashOnStatus         // claimed, status not written
	crashOnClaim          // right after a claim was written
)

type crashed struct{}

// aModel is the world: the Services' store, the claims, the pods, and
// the current leader's term.
type aModel struct {
	t      *testing.T
	r      *rand.Rand
	step   int
	inf    cache.SharedIndexInformer
	claims *modelClaims
	a      *Assigner
	st     *state
	ev     *modelEvents
	status *modelStatus
	uid    int
	univ   []netip.Addr
	stats  map[string]int
	op     string   // what this step does, for failures
	trace  []string // the last steps

	// lost: Services whose status lags (a lost write, or a claim waiting
	// for another Service's lagging status) until the next full pass.
	lost map[string]bool
}

// modelClaims is fakeClaims with a crash point after a write.
type modelClaims struct {
	*fakeClaims
	m *aModel
}

func (c *modelClaims) Claim(ctx context.Context, ip netip.Addr, pool string, s ServiceRef, key string) error {
	c.mu.Lock()
	w := c.writes
	c.mu.Unlock()
	err := c.fakeClaims.Claim(ctx, ip, pool, s, key)
	var held *HeldError
	switch {
	case errors.As(err, &held) && len(held.Services) == 0:
		c.m.stats["pod refused a claim"]++
	case errors.As(err, &held):
		c.m.stats["claim refused by Services"]++
	}
	c.mu.Lock()
	wrote := c.writes != w
	c.mu.Unlock()
	if wrote && c.m.status.crash == crashOnClaim {
		c.m.status.crash = noCrash
		panic(crashed{})
	}
	return err
}

type modelStatus struct {
	m     *aModel
	crash crashAt
	lose  bool // the next write fails (no crash)
}

func (s *modelStatus) SetIngress(_ context.Context, r ServiceRef, ips []netip.Addr) error {
	if s.crash == crashOnStatus {
		s.crash = noCrash
		panic(crashed{})
	}
	if s.lose {
		s.lose = false
		s.m.stats["status lost"]++
		return errors.New("the API server went away")
	}
	obj, ok, _ := s.m.inf.GetStore().GetByKey(r.String())
	if !ok || string(obj.(*corev1.Service).UID) != r.UID {
		return fmt.Errorf("Service %s (uid %s): not found", r, r.UID) // the patch carries the UID
	}
	svc := obj.(*corev1.Service).DeepCopy()
	svc.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	return s.m.inf.GetStore().Update(svc)
}

type modelEvents struct{ warnings map[string][]string }

func (e *modelEvents) Event(s ServiceRef, warning bool, reason, msg string) {
	if warning {
		e.warnings[s.String()] = append(e.warnings[s.String()], reason+": "+msg)
	}
}

type noLW struct{}

func (noLW) List(metav1.ListOptions) (runtime.Object, error)   { return &corev1.ServiceList{}, nil }
func (noLW) Watch(metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil }

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newAModel(t *testing.T, r *rand.Rand) *aModel {
	m := &aModel{t: t, r: r, stats: map[string]int{}, ev: &modelEvents{warnings: map[string][]string{}},
		lost: map[string]bool{}}
	// Never run: the model writes the store and marks as the handler would.
	m.inf = cache.NewSharedIndexInformer(&cache.ListWatch{ListFunc: noLW{}.List, WatchFunc: noLW{}.Watch}, &corev1.Service{}, 0, cache.Indexers{})
	m.claims = &modelClaims{fakeClaims: newFakeClaims(), m: m}
	m.status = &modelStatus{m: m}
	for _, p := range aModelPools {
		for _, pf := range p.Prefixes {
			for x := pf.Addr(); pf.Contains(x); x = x.Next() {
				m.univ = append(m.univ, x)
			}
		}
	}
	m.univ = append(m.univ, netip.MustParseAddr("2001:db8:99::1"))
	return m
}

func (m *aModel) fatalf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("step %d (%s): %s\n%s\nlast steps:\n  %s", m.step, m.op, fmt.Sprintf(format, args...), m.dump(), strings.Join(m.trace, "\n  "))
}

func (m *aModel) dump() string {
	var b strings.Builder
	for _, s := range m.svcs() {
		ws := m.ev.warnings[services.Key(s)]
		fmt.Fprintf(&b, "  %s %s: status %v alloc %v; last warnings %q\n", services.Key(s), brief(s), statusOf(s),
			m.st.alloc.Addrs(services.Key(s)), ws[max(0, len(ws)-2):])
	}
	for _, x := range slices.SortedFunc(maps.Keys(m.claims.svc), netip.Addr.Compare) {
		fmt.Fprintf(&b, "  claim %s key %q %v\n", x, m.claims.svc[x].key, m.claims.svc[x].holders)
	}
	fmt.Fprintf(&b, "  pods %v reserved %v\n", m.claims.pods, m.st.alloc.Reserved())
	return b.String()
}

func brief(s *corev1.Service) string {
	var ps []string
	for _, p := range s.Spec.Ports {
		ps = append(ps, fmt.Sprintf("%s/%d", p.Protocol, p.Port))
	}
	return fmt.Sprintf("uid %s %v key %q ports %v %s sel %v req %q", s.UID, s.Spec.IPFamilies, s.Annotations[lbassign.AnnotationAllowSharedIP],
		ps, s.Spec.ExternalTrafficPolicy, s.Spec.Selector, s.Annotations[lbassign.AnnotationLoadBalancerIPs])
}

func (m *aModel) svcs() []*corev1.Service {
	var out []*corev1.Service
	for _, o := range m.inf.GetStore().List() {
		out = append(out, o.(*corev1.Service))
	}
	slices.SortFunc(out, func(x, y *corev1.Service) int { return strings.Compare(services.Key(x), services.Key(y)) })
	return out
}

func (m *aModel) get(key string) *corev1.Service {
	obj, ok, _ := m.inf.GetStore().GetByKey(key)
	if !ok {
		return nil
	}
	return obj.(*corev1.Service)
}

func statusOf(s *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, i := range s.Status.LoadBalancer.Ingress {
		out = append(out, netip.MustParseAddr(i.IP))
	}
	return out
}

func (m *aModel) statuses() map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for _, s := range m.svcs() {
		out[services.Key(s)] = statusOf(s)
	}
	return out
}

// restart starts a new term (a new leader process: a new Assigner), whose
// first pass is a full one, and runs it to rest.
func (m *aModel) restart() {
	// Holds a dead leader left on live Services' claims.
	type hold struct {
		ip  netip.Addr
		ref ServiceRef
	}
	var orphans []hold
	for x, c := range m.claims.svc {
		for _, h := range c.holders {
			if s := m.get(h.String()); s != nil && string(s.UID) == h.UID && !slices.Contains(statusOf(s), x) {
				orphans = append(orphans, hold{x, h})
			}
		}
	}
	m.a = New(Config{Services: m.inf, Claims: m.claims, Status: m.status, Events: m.ev,
		Pools: func() []lbassign.Pool { return aModelPools }, Ours: (services.Options{}).Ours,
		Log: quietLog()})
	m.st = m.a.newState()
	if os.Getenv("FLOCK_DEBUG_STEP") == strconv.Itoa(m.step) {
		for _, s := range m.svcs() {
			r, _ := m.st.alloc.Recorded(services.Key(s))
			m.t.Logf("restored %s: %v (%s)", services.Key(s), r.Current, lbassign.Terms(r))
		}
	}
	m.a.Refresh()
	if !m.settle() {
		m.fatalf("a new term crashed")
	}
	for _, o := range orphans {
		c := m.claims.svc[o.ip]
		if (c == nil || !slices.ContainsFunc(c.holders, func(h ServiceRef) bool { return h == o.ref })) && m.get(o.ref.String()) != nil {
			m.stats["orphan of a live Service released"]++
		}
	}
}

// settle runs passes until nothing is marked, and checks the full pass's
// invariants if one ran; false if the leader crashed (the term is over).
func (m *aModel) settle() (alive bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			alive = false
		}
	}()
	full := false
	for range 20 {
		keys, all := m.a.take()
		if len(keys) == 0 && !all {
			if full {
				m.checkFull()
			}
			return true
		}
		if all {
			m.stats["full pass"]++
			full = true
			clear(m.lost) // it writes every lagging status first
		}
		m.st.pass(context.Background(), keys, all)
	}
	m.fatalf("still marked after 20 passes: a Service is retried for ever")
	return false
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// spec draws a Service's spec (on s, keeping its identity and status).
func (m *aModel) spec(s *corev1.Service) {
	r := m.r
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.LoadBalancerClass = ptr.To(services.Class)
	switch r.IntN(4) {
	case 0:
		s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}, ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	case 1:
		s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv4Protocol}, ptr.To(corev1.IPFamilyPolicySingleStack)
	default:
		s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv6Protocol}, ptr.To(corev1.IPFamilyPolicySingleStack)
	}
	s.Annotations = map[string]string{}
	if k := pick(r, "", "k1", "k1", "k1", "k2"); k != "" {
		s.Annotations[lbassign.AnnotationAllowSharedIP] = k
	}
	s.Spec.Ports = nil
	for _, p := range []int32{80, 443, 53, 8080} {
		if r.IntN(3) == 0 {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: p, Protocol: pick(r, corev1.ProtocolTCP, corev1.ProtocolTCP, corev1.ProtocolUDP)})
		}
	}
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	if r.IntN(4) == 0 {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	s.Spec.Selector = pick(r, map[string]string{"app": "x"}, map[string]string{"app": "x"}, map[string]string{"app": "y"})
	if r.IntN(3) == 0 {
		// Ask for an address: often one another Service holds (to share
		// it), else any.
		var held []netip.Addr
		for _, o := range m.svcs() {
			held = append(held, statusOf(o)...)
		}
		x := pick(r, m.univ...)
		if len(held) > 0 && r.IntN(3) > 0 {
			x = pick(r, held...)
		}
		s.Annotations[lbassign.AnnotationLoadBalancerIPs] = x.String()
	}
}

func (m *aModel) do() {
	r := m.r
	before := m.statuses()
	moving := maps.Clone(m.lost) // may move: their own edit waits
	for _, s := range m.svcs() {
		if m.pending(services.Key(s)) {
			moving[services.Key(s)] = true
		}
	}
	warned := map[string]int{}
	for k, ws := range m.ev.warnings {
		warned[k] = len(ws)
	}
	target := fmt.Sprintf("%s/s%d", pick(r, "a", "b"), r.IntN(7))
	alive := true
	m.op = "nothing"
	switch n := r.IntN(100); {
	case n < 45: // create or edit, maybe losing the status write or the leader
		switch k := r.IntN(20); {
		case k == 0:
			m.status.crash = crashOnStatus
		case k == 1:
			m.status.crash = crashOnClaim
		case k == 2:
			m.status.lose = true
		}
		s := &corev1.Service{}
		if old := m.get(target); old != nil {
			s = old.DeepCopy()
			m.stats["edit"]++
		} else {
			ns, name, _ := strings.Cut(target, "/")
			m.uid++
			s.Namespace, s.Name, s.UID = ns, name, types.UID(fmt.Sprintf("uid-%d", m.uid))
			m.stats["create"]++
		}
		m.spec(s)
		m.op = fmt.Sprintf("write %s %s crash %d lose %v", target, brief(s), m.status.crash, m.status.lose)
		m.write(s)
		alive = m.settle()
	case n < 52:
		if s := m.get(target); s != nil {
			m.stats["delete"]++
			m.op = "delete " + target
			_ = m.inf.GetStore().Delete(s)
			m.a.mark(target)
			alive = m.settle()
		}
	case n < 56: // deleted and re-created before the leader saw either
		if old := m.get(target); old != nil {
			m.stats["recreate"]++
			m.op = "recreate " + target
			_ = m.inf.GetStore().Delete(old)
			s := old.DeepCopy()
			m.uid++
			s.UID, s.Status = types.UID(fmt.Sprintf("uid-%d", m.uid)), corev1.ServiceStatus{}
			if r.IntN(2) == 0 {
				m.spec(s)
			}
			m.write(s)
			alive = m.settle()
		}
	case n < 72:
		m.op = "full pass"
		m.a.Refresh()
		alive = m.settle()
	case n < 80: // a pod claims a free address (the leader hears at its next full pass)
		x := pick(r, m.univ...)
		if _, held := m.claims.svc[x]; !held {
			if _, held := m.claims.pods[x]; !held {
				m.stats["pod claims"]++
				m.op = "pod claims " + x.String()
				m.claims.pods[x] = fmt.Sprintf("pod p/%d", m.step)
			}
		}
	case n < 86:
		if len(m.claims.pods) > 0 {
			m.stats["pod releases"]++
			x := pick(r, slices.SortedFunc(maps.Keys(m.claims.pods), netip.Addr.Compare)...)
			delete(m.claims.pods, x)
			m.op = "pod releases " + x.String()
		}
	case n < 89: // a leader died having claimed a free address for a live Service
		x := pick(r, m.univ...)
		svcs := m.svcs()
		if _, held := m.claims.svc[x]; !held && len(svcs) > 0 {
			if _, held := m.claims.pods[x]; !held {
				s := pick(r, svcs...)
				m.op = fmt.Sprintf("a dead leader's claim of %s for %s", x, services.Key(s))
				m.claims.svc[x] = &fakeClaim{key: s.Annotations[lbassign.AnnotationAllowSharedIP],
					holders: []ServiceRef{{Namespace: s.Namespace, Name: s.Name, UID: string(s.UID)}}}
				m.restart()
			}
		}
	case n < 92: // a leader dies at its next claim or status write, in a full pass
		m.status.crash = pick(r, crashOnClaim, crashOnStatus)
		m.op = fmt.Sprintf("full pass, crash %d", m.status.crash)
		m.a.Refresh()
		alive = m.settle()
	default:
		m.stats["restart"]++
		m.op = "restart"
		m.restart()
	}
	m.status.crash, m.status.lose = noCrash, false
	if !alive {
		m.op += ", crashed"
		m.stats["crash"]++
		m.restart()
	}
	no := map[string]bool{}
	for _, key := range slices.Sorted(maps.Keys(m.ev.warnings)) {
		ws := m.ev.warnings[key][min(warned[key], len(m.ev.warnings[key])):]
		if key == target && len(ws) > 0 {
			m.op += " warned (" + strings.Join(ws, "; ") + ")"
		}
		if slices.ContainsFunc(ws, refused) {
			m.stats["edit refused"]++
			no[key] = true
		}
		if slices.ContainsFunc(ws, waits) {
			m.lost[key] = true
		}
	}
	m.putBack(no)
	m.check(before, moving, target)
	if os.Getenv("FLOCK_DEBUG_STEP") == strconv.Itoa(m.step) {
		m.t.Logf("after step %d (%s):\n%s", m.step, m.op, m.dump())
	}
	m.trace = append(m.trace, fmt.Sprintf("%d: %s", m.step, m.op))
	if len(m.trace) > 3000 {
		m.trace = m.trace[1:]
	}
}

// putBack puts back the spec of every Service the allocator refused this
// step (no) and holds under another (the user, reading the Event, undoes
// the edit), as the allocator records it. (An edit not carried out for
// another reason — a status write or a claim that failed — is retried.)
func (m *aModel) putBack(no map[string]bool) {
	n := 0
	for _, s := range m.svcs() {
		key := services.Key(s)
		r, ok := m.st.alloc.Recorded(key)
		if !ok || !no[key] || !m.pending(key) {
			continue
		}
		b := s.DeepCopy()
		b.Spec.IPFamilies = slices.Clone(r.Families)
		b.Spec.IPFamilyPolicy = ptr.To(r.Policy)
		b.Annotations = map[string]string{}
		if r.SharingKey != "" {
			b.Annotations[lbassign.AnnotationAllowSharedIP] = r.SharingKey
		}
		if len(r.Requested) > 0 {
			b.Annotations[lbassign.AnnotationLoadBalancerIPs] = strings.Join(r.Requested, ",")
		}
		if len(r.Pools) > 0 {
			b.Annotations[lbassign.AnnotationAddressPool] = strings.Join(r.Pools, ",")
		}
		b.Spec.Ports = nil
		for _, p := range r.Ports {
			b.Spec.Ports = append(b.Spec.Ports, corev1.ServicePort{Port: p.Port, Protocol: p.Protocol})
		}
		b.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		if r.Local {
			b.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		b.Spec.Selector = maps.Clone(r.Selector)
		m.write(b)
		m.op += "; " + key + " put back"
		n++
	}
	if n > 0 && !m.settle() {
		m.fatalf("the leader crashed putting specs back")
	}
	for _, s := range m.svcs() {
		if key := services.Key(s); no[key] && m.pending(key) {
			m.fatalf("%s still not as the allocator holds it after being put back", key)
		}
	}
}

// pending tells whether key's spec is not carried out: the allocator
// holds it under another (its edit was refused, or waits).
func (m *aModel) pending(key string) bool {
	s := m.get(key)
	r, ok := m.st.alloc.Recorded(key)
	if s == nil || !ok {
		return false
	}
	in := m.st.input(s)
	norm := func(x lbassign.Service) string {
		if x.Policy == "" {
			x.Policy = corev1.IPFamilyPolicySingleStack
		}
		return fmt.Sprintf("%v %s %q %q %s", x.Families, x.Policy, x.Requested, x.Pools, lbassign.Terms(x))
	}
	return norm(in) != norm(r) || in.SharingKey != r.SharingKey
}

// waits: a warning that the Service's claim was refused by other
// Services' (their status lags, or they hold it under a key they are
// leaving): retried once they are synced.
func waits(w string) bool {
	return strings.HasPrefix(w, ReasonClaimFailed+":") && strings.Contains(w, "is claimed by Service")
}

// refused: a warning that the allocator refused the spec (not a claim
// lost to a racing pod or a status write, which are retried).
func refused(w string) bool {
	return slices.ContainsFunc([]lbassign.Code{lbassign.CodeInvalid, lbassign.CodeWrongFamily, lbassign.CodeNotInPool,
		lbassign.CodeInUse, lbassign.CodeReserved, lbassign.CodeUnknownPool, lbassign.CodePoolNotAllowed,
		lbassign.CodeNoPool, lbassign.CodeExhausted}, func(c lbassign.Code) bool { return strings.HasPrefix(w, string(c)+":") })
}

// write puts s in the store and marks it, as the informer's handler
// would.
func (m *aModel) write(s *corev1.Service) {
	if m.get(services.Key(s)) == nil {
		_ = m.inf.GetStore().Add(s)
	} else {
		_ = m.inf.GetStore().Update(s)
	}
	m.a.mark(services.Key(s))
}

// mayShare is MetalLB's rule, read independently of the allocator from
// the terms two holders' claim records (lbassign.Terms: the quoted key,
// the ports, and " Local " and the selector when Local).
func mayShare(tx, ty string) bool {
	parse := func(t string) (key string, ports []string, local string, ok bool) {
		q, err := strconv.QuotedPrefix(t)
		if err != nil {
			return "", nil, "", false
		}
		key, _ = strconv.Unquote(q)
		p, local, _ := strings.Cut(strings.TrimPrefix(t[len(q):], " "), " Local ")
		for _, x := range strings.Split(p, ",") {
			if x != "" {
				ports = append(ports, x)
			}
		}
		return key, ports, local, true
	}
	kx, px, lx, okx := parse(tx)
	ky, py, ly, oky := parse(ty)
	if !okx || !oky || kx == "" || kx != ky || lx != ly {
		return false
	}
	for _, p := range px {
		if slices.Contains(py, p) {
			return false
		}
	}
	return true
}

// check the invariants of a rested leader: claims behind every status,
// no address in use moved but by its own Service's change (moving: those
// whose own change was under way), sharing.
func (m *aModel) check(before map[string][]netip.Addr, moving map[string]bool, target string) {
	now := m.statuses()
	byIP := map[netip.Addr][]*corev1.Service{}
	for _, s := range m.svcs() {
		key := services.Key(s)
		for _, x := range now[key] {
			byIP[x] = append(byIP[x], s)
			c := m.claims.svc[x]
			if c == nil || !slices.ContainsFunc(c.holders, func(h ServiceRef) bool { return h.String() == key && h.UID == string(s.UID) }) {
				m.fatalf("%s (uid %s) has %s in its status, claim %+v", key, s.UID, x, c)
			}
		}
		// (A PreferDualStack Service may gain the family it lacked.)
		for _, x := range before[key] {
			if key != target && !moving[key] && !slices.Contains(now[key], x) {
				m.fatalf("%s moved from %v to %v, changing %s", key, before[key], now[key], target)
			}
		}
	}
	if len(m.lost) > 0 {
		return
	}
	for x, ss := range byIP {
		if len(ss) < 2 {
			continue
		}
		m.stats["shared"]++
		terms := make([]string, len(ss))
		for i, s := range ss {
			if !slices.Contains(m.st.alloc.Owners(x), services.Key(s)) {
				m.fatalf("%s in the status of %s, which the allocator does not give it (owners %v)", x, services.Key(s), m.st.alloc.Owners(x))
			}
			c := m.claims.svc[x]
			j := slices.IndexFunc(c.holders, func(h ServiceRef) bool { return h.String() == services.Key(s) && h.UID == string(s.UID) })
			terms[i] = c.holders[j].Terms
			for k := range i {
				if s.Namespace != ss[k].Namespace {
					m.fatalf("%s in the status of %s and %s: namespaces share no address", x, services.Key(s), services.Key(ss[k]))
				}
				if !mayShare(terms[i], terms[k]) {
					m.fatalf("%s in the status of %s (%s) and %s (%s), which may not share it", x, services.Key(s), terms[i], services.Key(ss[k]), terms[k])
				}
			}
		}
	}
}

// checkFull: after a full pass, every hold on a claim is its Service's
// status; the allocator gives each Service what its status says; the
// reservations are the pods' claims, nothing else.
func (m *aModel) checkFull() {
	m.t.Helper()
	for x, c := range m.claims.svc {
		for _, h := range c.holders {
			s := m.get(h.String())
			if s == nil || string(s.UID) != h.UID || !slices.Contains(statusOf(s), x) {
				m.fatalf("after a full pass the claim of %s is held by %s (uid %s) without its status", x, h, h.UID)
			}
		}
	}
	for _, s := range m.svcs() {
		key := services.Key(s)
		if got := m.st.alloc.Addrs(key); !slices.Equal(got, statusOf(s)) && !m.lost[key] {
			m.fatalf("after a full pass the allocator gives %s %v, its status says %v", key, got, statusOf(s))
		}
	}
	if res := m.st.alloc.Reserved(); !maps.Equal(res, m.claims.pods) {
		m.fatalf("after a full pass reserved %v, the pods hold %v", res, m.claims.pods)
	}
	if len(m.claims.pods) > 0 {
		m.stats["reserve"]++
	}
}
