package loadbalancers

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/lbassign"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// fakeStatus writes the status through the fake API (so the informer sees
// it, as with a real API server) and counts the writes.
type fakeStatus struct {
	cs     *fake.Clientset
	mu     sync.Mutex
	writes int
}

func (f *fakeStatus) SetIngress(ctx context.Context, r ServiceRef, ips []netip.Addr) error {
	s, err := f.cs.CoreV1().Services(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	s.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
	}
	_, err = f.cs.CoreV1().Services(r.Namespace).UpdateStatus(ctx, s, metav1.UpdateOptions{})
	f.mu.Lock()
	f.writes++
	f.mu.Unlock()
	return err
}

func (f *fakeStatus) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) Event(s ServiceRef, warning bool, reason, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, fmt.Sprintf("%s %v %s: %s", s, warning, reason, msg))
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.got)
}

func (e *events) has(sub string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.ContainsFunc(e.got, func(s string) bool { return strings.Contains(s, sub) })
}

type fakeSvcs struct {
	kubeclient.ListerWatcher[*corev1.ServiceList]
}

func (fakeSvcs) IsWatchListSemanticsUnSupported() bool { return true }

func lb(name string, edit ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(services.Class),
			IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack),
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	for _, e := range edit {
		e(s)
	}
	return s
}

var pools = []lbassign.Pool{{Name: "lb", Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8:1b::100/126"), netip.MustParsePrefix("203.0.113.128/30")},
	Allows: func(ns string) bool { return ns == "shop" }}}

type env struct {
	a      *Assigner // the last started
	cs     *fake.Clientset
	inf    cache.SharedIndexInformer
	claims *fakeClaims
	status *fakeStatus
	ev     *events
}

func newEnv(t *testing.T, objs ...*corev1.Service) *env {
	cs := fake.NewClientset()
	for _, o := range objs {
		if _, err := cs.CoreV1().Services(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{cs: cs, claims: newFakeClaims(), status: &fakeStatus{cs: cs}, ev: &events{}}
	return e
}

// start runs an assigner (one leadership term) until the returned stop.
func (e *env) start(t *testing.T) (stop func()) {
	t.Helper()
	f := kubeclient.NewFactory()
	inf := f.Informer("services", func() cache.SharedIndexInformer {
		return kubeclient.NewInformer(fakeSvcs{e.cs.CoreV1().Services("")}, &corev1.Service{}, nil)
	})
	a := New(Config{Services: inf, Claims: e.claims, Status: e.status, Events: e.ev,
		Pools: func() []lbassign.Pool { return pools },
		Ours:  (services.Options{}).Ours,
		AuthorizeExternalIP: func(ip netip.Addr, ns string) error {
			if netip.MustParsePrefix("2001:db8:e5::/64").Contains(ip) {
				return nil
			}
			return fmt.Errorf("no AddressPool allows namespace %s to use %s as externalIP", ns, ip)
		},
	})
	e.a = a
	_, stopF := testutil.Run(t, f.Run)
	_, stopA := testutil.Run(t, a.Run)
	testutil.WaitWatching(t, e.cs, "services")
	return func() { stopA(); stopF() }
}

func (e *env) ingress(t *testing.T, name string) []string {
	t.Helper()
	s, err := e.cs.CoreV1().Services("shop").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, i := range s.Status.LoadBalancer.Ingress {
		out = append(out, i.IP)
	}
	return out
}

func (e *env) waitIngress(t *testing.T, name string, want ...string) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%s ingress %v", name, want), func() (bool, string) {
		got := e.ingress(t, name)
		return slices.Equal(got, want), fmt.Sprint(got)
	})
}

// Assignment end to end through the fake API: addresses claimed, then
// written; another class and a ClusterIP Service untouched; an address a
// pod holds never handed out; a claim lost to a racing pod re-assigned;
// the Service's deletion releases; a new leader keeps every address and
// writes nothing.
func TestAssigner(t *testing.T) {
	e := newEnv(t,
		lb("web"),
		lb("other", func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("metallb.io/metallb") }),
		lb("plain", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeClusterIP
			s.Spec.ExternalIPs = []string{"2001:db8:e5::5", "192.0.2.99"}
		}),
	)
	e.claims.pods[netip.MustParseAddr("2001:db8:1b::100")] = "pod shop/holder" // first of the pool
	stop := e.start(t)
	e.waitIngress(t, "web", "2001:db8:1b::101", "203.0.113.128")
	if got := e.claims.Services(); len(got) != 2 || got[netip.MustParseAddr("2001:db8:1b::101")][0].Name != "web" {
		t.Errorf("claims %v", got)
	}
	if ing := e.ingress(t, "other"); len(ing) != 0 {
		t.Errorf("another class's Service got %v", ing)
	}
	// The Event follows the status write.
	testutil.Eventually(t, "the AddressAssigned Event", func() (bool, string) {
		return e.ev.has("shop/web false AddressAssigned: assigned 2001:db8:1b::101, 203.0.113.128"), fmt.Sprint(e.ev.list())
	})
	// The external IP no pool allows is warned about on its Service; the
	// allowed one is not.
	testutil.Eventually(t, "a Warning for the external IP", func() (bool, string) {
		return e.ev.has(`shop/plain true ExternalIPNotAllowed: spec.externalIPs "192.0.2.99" is not advertised: no AddressPool allows namespace shop to use 192.0.2.99 as externalIP`) &&
			!e.ev.has(`"2001:db8:e5::5"`), fmt.Sprint(e.ev.list())
	})

	// A requested address a pod holds: a Warning naming it, nothing else.
	api := e.cs.CoreV1().Services("shop")
	req := lb("req", func(s *corev1.Service) {
		s.Annotations = map[string]string{lbassign.AnnotationLoadBalancerIPs: "2001:db8:1b::100"}
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	})
	if _, err := api.Create(context.Background(), req, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a Warning for the held address", func() (bool, string) {
		return e.ev.has("shop/req true Reserved"), fmt.Sprint(e.ev.list())
	})
	if ing := e.ingress(t, "req"); len(ing) != 0 {
		t.Errorf("req got %v", ing)
	}

	// A pod claims the next free address just before the Service does:
	// the Service gets another.
	e.claims.mu.Lock()
	e.claims.failOn = netip.MustParseAddr("2001:db8:1b::102")
	e.claims.mu.Unlock()
	if _, err := api.Create(context.Background(), lb("race", func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitIngress(t, "race", "2001:db8:1b::103")

	// The leader's counts: the pool's use, and the refusals by reason.
	testutil.Eventually(t, "the pool's use counted", func() (bool, string) {
		u := e.a.Usage()
		return len(u) == 1 && u[0].Name == "lb" && u[0].Used == 3 && u[0].Size == 8, fmt.Sprint(u)
	})
	if f := e.a.Failures(); f["Reserved"] == 0 || f[ReasonClaimFailed] == 0 {
		t.Errorf("failures %v: want Reserved and AddressClaimFailed counted", f)
	}

	// A new leader: same addresses, no status written.
	stop()
	if u := e.a.Usage(); len(u) != 0 {
		t.Errorf("a former leader still reports %v", u)
	}
	writes := e.status.count()
	stop = e.start(t)
	testutil.Consistently(t, "a new leader writes nothing", 2*time.Second, func() (bool, string) {
		return e.status.count() == writes, fmt.Sprint(e.status.count() - writes)
	})
	e.waitIngress(t, "web", "2001:db8:1b::101", "203.0.113.128")

	// Deleting the Service releases its claims.
	if err := api.Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "web's claims released", func() (bool, string) {
		for _, hs := range e.claims.Services() {
			if slices.ContainsFunc(hs, func(r ServiceRef) bool { return r.Name == "web" }) {
				return false, fmt.Sprint(e.claims.Services())
			}
		}
		return true, ""
	})
	stop()
}

// A claim left by a Service that is gone (a leader crashed between claim
// and status, or the Service went while nobody led) is collected by the
// next leader's full pass.
func TestAssignerCollectsOrphanClaims(t *testing.T) {
	e := newEnv(t, lb("web"))
	orphan := netip.MustParseAddr("203.0.113.131")
	e.claims.svc[orphan] = &fakeClaim{holders: []ServiceRef{{Namespace: "shop", Name: "gone", UID: "uid-gone"}}}
	stop := e.start(t)
	defer stop()
	e.waitIngress(t, "web", "2001:db8:1b::100", "203.0.113.128")
	testutil.Eventually(t, "the orphan claim collected", func() (bool, string) {
		_, ok := e.claims.Services()[orphan]
		return !ok, fmt.Sprint(e.claims.Services())
	})
}

// storeStatus writes the status into the Services' store (the informer's,
// never run: the tests sync by hand).
type storeStatus struct{ store cache.Store }

func (s storeStatus) SetIngress(_ context.Context, r ServiceRef, ips []netip.Addr) error {
	obj, ok, _ := s.store.GetByKey(r.String())
	if !ok {
		return fmt.Errorf("Service %s not found", r)
	}
	svc := obj.(*corev1.Service).DeepCopy()
	svc.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	return s.store.Update(svc)
}

// term is a leadership term over a store of objs, synced by hand.
func term(t *testing.T, claims Claims, objs ...*corev1.Service) (*state, cache.Store) {
	t.Helper()
	inf := cache.NewSharedIndexInformer(&cache.ListWatch{ListFunc: noLW{}.List, WatchFunc: noLW{}.Watch}, &corev1.Service{}, 0, cache.Indexers{})
	for _, o := range objs {
		if err := inf.GetStore().Add(o); err != nil {
			t.Fatal(err)
		}
	}
	a := New(Config{Services: inf, Claims: claims, Status: storeStatus{inf.GetStore()}, Events: &events{},
		Pools: func() []lbassign.Pool { return pools }, Ours: (services.Options{}).Ours, Log: quietLog()})
	return a.newState(), inf.GetStore()
}

func withStatus(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) {
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
	}
}

func shared(key string, port int32) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Annotations = map[string]string{lbassign.AnnotationAllowSharedIP: key}
		s.Spec.Ports = []corev1.ServicePort{{Port: port, Protocol: corev1.ProtocolTCP}}
		s.Spec.IPFamilies, s.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv6Protocol}, ptr.To(corev1.IPFamilyPolicySingleStack)
	}
}

func holdersOf(c *fakeClaims, ip string) []string {
	var out []string
	if fc := c.svc[netip.MustParseAddr(ip)]; fc != nil {
		for _, h := range fc.holders {
			out = append(out, h.String())
		}
	}
	return out
}

// Defect (orphan claim of a live Service): a leader claimed X for web and
// died before writing web's status; web has Y. The collector skipped X
// because web exists, and only what this term recorded was ever released:
// X stayed claimed for good. A full pass releases it now, and nothing
// else.
func TestCollectReleasesTheOrphanOfALiveService(t *testing.T) {
	c := newFakeClaims()
	web := lb("web", shared("", 80), withStatus("2001:db8:1b::101"))
	webRef := ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web"}
	c.svc[netip.MustParseAddr("2001:db8:1b::101")] = &fakeClaim{holders: []ServiceRef{webRef}}
	c.svc[netip.MustParseAddr("2001:db8:1b::103")] = &fakeClaim{holders: []ServiceRef{webRef}} // the dead leader's
	c.pods[netip.MustParseAddr("2001:db8:1b::102")] = "pod shop/p"
	st, store := term(t, c, web)
	st.pass(context.Background(), nil, true)
	if got := holdersOf(c, "2001:db8:1b::103"); len(got) != 0 {
		t.Errorf("the orphan claim is held by %v", got)
	}
	if got := holdersOf(c, "2001:db8:1b::101"); !slices.Equal(got, []string{"shop/web"}) {
		t.Errorf("web's own claim is held by %v", got)
	}
	if _, ok := c.pods[netip.MustParseAddr("2001:db8:1b::102")]; !ok {
		t.Error("a pod's claim was released")
	}
	obj, _, _ := store.GetByKey("shop/web")
	if got := statusOf(obj.(*corev1.Service)); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("2001:db8:1b::101")}) {
		t.Errorf("web moved to %v", got)
	}
}

// The collector never releases an assignment in flight in this term: one
// the allocator gave, claimed, whose status is not written yet.
func TestCollectKeepsAnAssignmentInFlight(t *testing.T) {
	c := newFakeClaims()
	web := lb("web", shared("", 80))
	st, _ := term(t, c, web)
	addrs, err := st.alloc.Assign(st.input(web)) // sync's first step
	if err != nil {
		t.Fatal(err)
	}
	ref := ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web"}
	if err := c.Claim(context.Background(), addrs[0], "lb", ref, ""); err != nil { // its second
		t.Fatal(err)
	}
	st.collect(context.Background()) // as a full pass would, before the status is written
	if got := holdersOf(c, addrs[0].String()); !slices.Equal(got, []string{"shop/web"}) {
		t.Fatalf("the claim in flight of %s is held by %v", addrs[0], got)
	}
}

// Defect (shared addresses): a second Service sharing an address by
// MetalLB's rules joins its claim, and neither moves on later full passes;
// no reservation is left behind.
func TestSharedAddressStays(t *testing.T) {
	c := newFakeClaims()
	st, store := term(t, c, lb("web", shared("k", 80)))
	ctx := context.Background()
	st.pass(ctx, nil, true)
	_ = store.Add(lb("api", shared("k", 443)))
	st.pass(ctx, []string{"shop/api"}, false)
	for range 3 {
		st.pass(ctx, nil, true)
	}
	for _, name := range []string{"web", "api"} {
		obj, _, _ := store.GetByKey("shop/" + name)
		if got := statusOf(obj.(*corev1.Service)); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("2001:db8:1b::100")}) {
			t.Errorf("%s has %v", name, got)
		}
	}
	if got := holdersOf(c, "2001:db8:1b::100"); !slices.Equal(got, []string{"shop/web", "shop/api"}) {
		t.Errorf("the claim is held by %v", got)
	}
	if r := st.alloc.Reserved(); len(r) != 0 {
		t.Errorf("reserved %v", r)
	}
}

// A reservation made because a pod's claim refused a Service is dropped
// at the next full pass once the pod let it go: it never keeps the
// address for good.
func TestReservationsAreThePods(t *testing.T) {
	c := newFakeClaims()
	x := netip.MustParseAddr("2001:db8:1b::100")
	ctx := context.Background()
	st, store := term(t, c, lb("web", shared("", 80), func(s *corev1.Service) {
		s.Annotations[lbassign.AnnotationLoadBalancerIPs] = x.String()
	}))
	c.pods[x] = "pod shop/racer" // after the term read the pods' claims
	st.pass(ctx, []string{"shop/web"}, false)
	if by, ok := st.alloc.Reserved()[x]; !ok || by != "pod shop/racer" {
		t.Fatalf("reserved %v after the pod's claim refused web", st.alloc.Reserved())
	}
	delete(c.pods, x)
	st.pass(ctx, nil, true)
	obj, _, _ := store.GetByKey("shop/web")
	if got := statusOf(obj.(*corev1.Service)); !slices.Equal(got, []netip.Addr{x}) || len(st.alloc.Reserved()) != 0 {
		t.Errorf("web has %v, reserved %v", got, st.alloc.Reserved())
	}
}

// Review of the sharing change: a Service of another namespace that
// copies a Service's sharing key (anyone who reads Services can) does not
// join its address, so it can neither be advertised there nor pin it;
// the owner keeps its address when it later adds the intruder's port.
func TestSharingStaysInANamespace(t *testing.T) {
	both := []lbassign.Pool{{Name: "lb", Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8:1b::100/126")},
		Allows: func(ns string) bool { return ns == "shop" || ns == "evil" }}}
	c := newFakeClaims()
	inf := cache.NewSharedIndexInformer(&cache.ListWatch{ListFunc: noLW{}.List, WatchFunc: noLW{}.Watch}, &corev1.Service{}, 0, cache.Indexers{})
	store := inf.GetStore()
	_ = store.Add(lb("web", shared("team-a", 80)))
	ev := &events{}
	a := New(Config{Services: inf, Claims: c, Status: storeStatus{store}, Events: ev,
		Pools: func() []lbassign.Pool { return both }, Ours: (services.Options{}).Ours, Log: quietLog()})
	st := a.newState()
	ctx := context.Background()
	st.pass(ctx, nil, true)
	x := netip.MustParseAddr("2001:db8:1b::100")
	_ = store.Add(lb("x", shared("team-a", 443), func(s *corev1.Service) {
		s.Namespace, s.UID = "evil", "uid-x"
		s.Annotations[lbassign.AnnotationLoadBalancerIPs] = x.String()
	}))
	st.pass(ctx, nil, true)
	if h := holdersOf(c, x.String()); !slices.Equal(h, []string{"shop/web"}) {
		t.Errorf("%s held by %v, want shop/web alone", x, h)
	}
	obj, _, _ := store.GetByKey("evil/x")
	if got := statusOf(obj.(*corev1.Service)); len(got) != 0 {
		t.Errorf("evil/x given %v", got)
	}
	if !ev.has("evil/x true InUse: ") || !ev.has("Service shop/web of another namespace") {
		t.Errorf("no Warning naming the namespace rule: %v", ev.list())
	}
	// shop/web adds port 443: it keeps its address.
	obj, _, _ = store.GetByKey("shop/web")
	w := obj.(*corev1.Service).DeepCopy()
	w.Spec.Ports = append(w.Spec.Ports, corev1.ServicePort{Port: 443, Protocol: corev1.ProtocolTCP})
	_ = store.Update(w)
	st.pass(ctx, nil, true)
	obj, _, _ = store.GetByKey("shop/web")
	if got := statusOf(obj.(*corev1.Service)); !slices.Equal(got, []netip.Addr{x}) {
		t.Errorf("shop/web moved to %v", got)
	}
}

// Review of the sharing change: a sharer that drops its key while an
// orphan hold (a dead leader's join) is still on the claim would write a
// claim with sharers and no key, which the API refuses, again and again.
// The claim refuses the holder's new key while another holds it; the
// assigner frees the orphan and takes the address alone, at once.
func TestDroppedKeyWithAnOrphanSharer(t *testing.T) {
	c := newFakeClaims()
	x := netip.MustParseAddr("2001:db8:1b::100")
	webRef := ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web"}
	c.svc[x] = &fakeClaim{key: "k", holders: []ServiceRef{webRef, {Namespace: "shop", Name: "gone", UID: "uid-gone"}}}
	st, store := term(t, c, lb("web", shared("k", 80), withStatus(x.String())))
	ctx := context.Background()
	st.pass(ctx, []string{"shop/web"}, false) // before any full pass: the orphan is there
	obj, _, _ := store.GetByKey("shop/web")
	w := obj.(*corev1.Service).DeepCopy()
	delete(w.Annotations, lbassign.AnnotationAllowSharedIP)
	_ = store.Update(w)
	st.pass(ctx, []string{"shop/web"}, false)
	cl := c.svc[x]
	if cl == nil || cl.key != "" || len(cl.holders) != 1 || cl.holders[0].Name != "web" {
		t.Fatalf("claim %+v, want web alone under no key", cl)
	}
	obj, _, _ = store.GetByKey("shop/web")
	if got := statusOf(obj.(*corev1.Service)); !slices.Equal(got, []netip.Addr{x}) {
		t.Errorf("web moved to %v", got)
	}
}

// Second review: a claim written before sharing stayed within a
// namespace, held by shop/web first and then by a Service of another
// namespace. A new leader keeps the address with the namespace that held
// it first, whatever the namespaces' order, pinned or not.
func TestLegacyCrossNamespaceClaim(t *testing.T) {
	for _, tc := range []struct {
		other  string
		pinned bool
	}{{"aaa", false}, {"zzz", false}, {"aaa", true}} {
		t.Run(fmt.Sprintf("%s/pinned=%v", tc.other, tc.pinned), func(t *testing.T) {
			other := tc.other
			both := []lbassign.Pool{{Name: "lb", Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8:1b::100/126")},
				Allows: func(ns string) bool { return ns == "shop" || ns == other }}}
			x := netip.MustParseAddr("2001:db8:1b::100")
			web := lb("web", shared("k", 80), withStatus(x.String()))
			if tc.pinned {
				web.Annotations[lbassign.AnnotationLoadBalancerIPs] = x.String()
			}
			intruder := lb("x", shared("k", 443), withStatus(x.String()), func(s *corev1.Service) { s.Namespace, s.UID = other, "uid-x" })
			terms := func(port int32) string {
				return lbassign.Terms(lbassign.Service{SharingKey: "k", Ports: []lbassign.Port{{Port: port, Protocol: corev1.ProtocolTCP}}})
			}
			c := newFakeClaims()
			c.svc[x] = &fakeClaim{key: "k", holders: []ServiceRef{
				{Namespace: "shop", Name: "web", UID: "uid-web", Terms: terms(80)},
				{Namespace: other, Name: "x", UID: "uid-x", Terms: terms(443)}}}
			inf := cache.NewSharedIndexInformer(&cache.ListWatch{ListFunc: noLW{}.List, WatchFunc: noLW{}.Watch}, &corev1.Service{}, 0, cache.Indexers{})
			store := inf.GetStore()
			_ = store.Add(web)
			_ = store.Add(intruder)
			a := New(Config{Services: inf, Claims: c, Status: storeStatus{store}, Events: &events{},
				Pools: func() []lbassign.Pool { return both }, Ours: (services.Options{}).Ours, Log: quietLog()})
			st := a.newState()
			st.pass(context.Background(), nil, true)
			obj, _, _ := store.GetByKey("shop/web")
			gw := statusOf(obj.(*corev1.Service))
			obj, _, _ = store.GetByKey(other + "/x")
			gx := statusOf(obj.(*corev1.Service))
			if !slices.Equal(gw, []netip.Addr{x}) || slices.Contains(gx, x) || !slices.Equal(holdersOf(c, x.String()), []string{"shop/web"}) {
				t.Errorf("shop/web %v, %s/x %v, claim of %s held by %v; want shop/web alone on it", gw, other, gx, x, holdersOf(c, x.String()))
			}
		})
	}
}
