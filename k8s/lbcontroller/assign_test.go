package lbcontroller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/lbassign"
	"code.fritzlab.net/fritzlab/flock/k8s/loadbalancers"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// claimsAPI is the fake dynamic client for AddressClaims plus what the
// real API server does and the fake does not: UIDs, resourceVersions
// (checked on update) and delete preconditions. Reactors run under the
// fake's lock, so each check-and-act is atomic, as in etcd. It lists
// AddressPools and NodeConfigs too (objs: the first ones).
func claimsAPI(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{
			claims.GVR:       v1alpha1.AddressClaimKind + "List",
			addresspools.GVR: v1alpha1.AddressPoolKind + "List",
			nodeconfigs.GVR:  "NodeConfigList",
		}, objs...)
	tr := dyn.Tracker()
	var seq atomic.Int64
	stamp := func(u *unstructured.Unstructured) {
		n := seq.Add(1)
		u.SetResourceVersion(strconv.FormatInt(n, 10))
	}
	dyn.PrependReactor("create", claims.GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		u := action.(clienttesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		stamp(u)
		u.SetUID(types.UID("uid-" + u.GetResourceVersion()))
		if err := tr.Create(claims.GVR, u, ""); err != nil {
			return true, nil, err
		}
		return true, u.DeepCopy(), nil
	})
	dyn.PrependReactor("update", claims.GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		u := action.(clienttesting.UpdateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		old, err := tr.Get(claims.GVR, "", u.GetName())
		if err != nil {
			return true, nil, err
		}
		m, _ := meta.Accessor(old)
		if u.GetResourceVersion() != m.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(claims.GVR.GroupResource(), u.GetName(), fmt.Errorf("resourceVersion %s, stored %s", u.GetResourceVersion(), m.GetResourceVersion()))
		}
		stamp(u)
		u.SetUID(m.GetUID())
		if err := tr.Update(claims.GVR, u, ""); err != nil {
			return true, nil, err
		}
		return true, u.DeepCopy(), nil
	})
	dyn.PrependReactor("delete", claims.GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		d := action.(clienttesting.DeleteAction)
		obj, err := tr.Get(claims.GVR, "", d.GetName())
		if err != nil {
			return true, nil, err
		}
		m, _ := meta.Accessor(obj)
		if pre := d.GetDeleteOptions().Preconditions; pre != nil {
			if pre.UID != nil && *pre.UID != m.GetUID() || pre.ResourceVersion != nil && *pre.ResourceVersion != m.GetResourceVersion() {
				return true, nil, apierrors.NewConflict(claims.GVR.GroupResource(), d.GetName(), fmt.Errorf("precondition failed"))
			}
		}
		return true, nil, tr.Delete(claims.GVR, "", d.GetName())
	})
	return dyn
}

type fakeSvcs struct {
	kubeclient.ListerWatcher[*corev1.ServiceList]
}

func (fakeSvcs) IsWatchListSemanticsUnSupported() bool { return true }

// typedStatus writes status.loadBalancer.ingress through the typed fake.
type typedStatus struct{ cs *fake.Clientset }

func (s typedStatus) SetIngress(ctx context.Context, r loadbalancers.ServiceRef, ips []netip.Addr) error {
	svc, err := s.cs.CoreV1().Services(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	svc.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
	}
	_, err = s.cs.CoreV1().Services(r.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	return err
}

type noEvents struct {
	mu  sync.Mutex
	got []string
}

func (e *noEvents) Event(r loadbalancers.ServiceRef, warning bool, reason, msg string) {
	e.mu.Lock()
	e.got = append(e.got, fmt.Sprintf("%s %v %s: %s", r, warning, reason, msg))
	e.mu.Unlock()
}

// lab is the assigner against the real claims package (over the fake
// API) and a fake Services API.
type lab struct {
	cs     *fake.Clientset
	dyn    *dynfake.FakeDynamicClient
	claims *claims.Claims
	a      *loadbalancers.Assigner
	ev     *noEvents
}

var labPools = []lbassign.Pool{{Name: "lb", Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8:1b::100/124")},
	Allows: func(string) bool { return true }}}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newLab(t *testing.T, objs ...*corev1.Service) *lab {
	t.Helper()
	l := &lab{cs: fake.NewClientset(), dyn: claimsAPI(), ev: &noEvents{}}
	for _, o := range objs {
		if _, err := l.cs.CoreV1().Services(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// start runs one leadership term until the returned stop.
func (l *lab) start(t *testing.T) (stop func()) {
	t.Helper()
	f := kubeclient.NewFactory()
	svcs := f.Informer("services", func() cache.SharedIndexInformer {
		return kubeclient.NewInformer(fakeSvcs{l.cs.CoreV1().Services("")}, &corev1.Service{}, nil)
	})
	l.claims = claims.New(f, l.dyn, "", quietLog())
	l.a = loadbalancers.New(loadbalancers.Config{
		Services: svcs, Claims: apiClaims{l.claims}, Status: typedStatus{l.cs}, Events: l.ev,
		Pools: func() []lbassign.Pool { return labPools }, Ours: (services.Options{}).Ours,
		Resync: time.Hour, Log: quietLog(),
	})
	_, stopF := testutil.Run(t, f.Run)
	testutil.WaitWatching(t, l.cs, "services")
	testutil.WaitWatching(t, l.dyn, claims.GVR.Resource)
	_, stopA := testutil.Run(t, l.a.Run)
	return func() { stopA(); stopF() }
}

func (l *lab) ingress(name string) []string {
	s, err := l.cs.CoreV1().Services("shop").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, i := range s.Status.LoadBalancer.Ingress {
		out = append(out, i.IP)
	}
	return out
}

func (l *lab) waitIngress(t *testing.T, name string, want ...string) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%s ingress %v", name, want), func() (bool, string) {
		got := l.ingress(name)
		return slices.Equal(got, want), fmt.Sprintf("%v; events %v", got, l.events())
	})
}

func (l *lab) events() []string {
	l.ev.mu.Lock()
	defer l.ev.mu.Unlock()
	return slices.Clone(l.ev.got)
}

// stored reads the claim of ip from the API (not the cache).
func (l *lab) stored(ip string) (claims.Claim, bool) {
	obj, err := l.dyn.Tracker().Get(claims.GVR, "", claims.ClaimName(netip.MustParseAddr(ip)))
	if err != nil {
		return claims.Claim{}, false
	}
	cl, _ := claims.ClaimOf(obj.(*unstructured.Unstructured))
	return cl, true
}

// fullPass asks for full passes and gives them time to run (the
// assertions that follow wait or hold for longer).
func (l *lab) fullPass(t *testing.T) {
	t.Helper()
	for range 2 { // one may already be under way
		l.a.Refresh()
		time.Sleep(50 * time.Millisecond)
	}
}

func lbService(name string, edit ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(services.Class),
			IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol}, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicySingleStack),
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	for _, e := range edit {
		e(s)
	}
	return s
}

func sharing(key string, port int32) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Annotations = map[string]string{lbassign.AnnotationAllowSharedIP: key}
		s.Spec.Ports = []corev1.ServicePort{{Port: port, Protocol: corev1.ProtocolTCP}}
	}
}

// Defect: a second Service sharing an address by MetalLB's rules was
// refused by the claim (one Service per claim), the refusal reserved the
// address for good, and the next full pass moved the first Service off
// its own address. Now both hold it, neither moves, and the claim goes
// with the last of them.
func TestSharedAddressHeldByEverySharer(t *testing.T) {
	l := newLab(t, lbService("web", sharing("k", 80)))
	stop := l.start(t)
	defer stop()
	const x = "2001:db8:1b::100"
	l.waitIngress(t, "web", x)
	if _, err := l.cs.CoreV1().Services("shop").Create(context.Background(), lbService("api", sharing("k", 443)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.waitIngress(t, "api", x)
	for range 3 {
		l.fullPass(t)
	}
	testutil.Consistently(t, "neither Service moves", time.Second, func() (bool, string) {
		return slices.Equal(l.ingress("web"), []string{x}) && slices.Equal(l.ingress("api"), []string{x}),
			fmt.Sprintf("web %v api %v", l.ingress("web"), l.ingress("api"))
	})
	holders := func() []string {
		cl, ok := l.stored(x)
		if !ok {
			return nil
		}
		var out []string
		for _, h := range cl.Holders() {
			out = append(out, h.String()+"@"+h.UID)
		}
		slices.Sort(out)
		return out
	}
	if got := holders(); !slices.Equal(got, []string{"shop/api@uid-api", "shop/web@uid-web"}) {
		t.Fatalf("claim of %s held by %v, want both sharers", x, got)
	}
	// A third with the same key but a port in use is refused, and
	// changes nothing for the two.
	if _, err := l.cs.CoreV1().Services("shop").Create(context.Background(), lbService("clash", sharing("k", 80), func(s *corev1.Service) {
		s.Annotations[lbassign.AnnotationLoadBalancerIPs] = x
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "clash refused", func() (bool, string) {
		return slices.ContainsFunc(l.events(), func(e string) bool {
			return e == "shop/clash true InUse: "+
				`metadata.annotations[flock.fritzlab.net/loadBalancerIPs] "2001:db8:1b::100": port TCP/80 is also used by Service shop/web`
		}), fmt.Sprint(l.events())
	})
	l.fullPass(t)
	if got := holders(); !slices.Equal(got, []string{"shop/api@uid-api", "shop/web@uid-web"}) || len(l.ingress("clash")) != 0 {
		t.Fatalf("after the refusal: claim held by %v, clash has %v", got, l.ingress("clash"))
	}
	if err := l.cs.CoreV1().Services("shop").Delete(context.Background(), "clash", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The claim goes with the last sharer only.
	if err := l.cs.CoreV1().Services("shop").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "web's share released", func() (bool, string) {
		got := holders()
		return slices.Equal(got, []string{"shop/api@uid-api"}), fmt.Sprint(got)
	})
	l.fullPass(t)
	if got := l.ingress("api"); !slices.Equal(got, []string{x}) {
		t.Fatalf("api moved to %v when web went", got)
	}
	if err := l.cs.CoreV1().Services("shop").Delete(context.Background(), "api", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the claim released with its last sharer", func() (bool, string) {
		_, ok := l.stored(x)
		return !ok, fmt.Sprint(holders())
	})
}

// Defect: a leader claimed X for a Service and died before writing its
// status; the next leader gave the Service another address; the claims
// collector skipped X's claim because the Service still exists, so X
// stayed claimed for good. Now a full pass releases it, and nothing else.
func TestOrphanClaimOfALiveServiceReleased(t *testing.T) {
	const y, orphan = "2001:db8:1b::105", "2001:db8:1b::109"
	web := lbService("web", func(s *corev1.Service) {
		s.Annotations = map[string]string{lbassign.AnnotationLoadBalancerIPs: y}
	})
	l := newLab(t, web)
	// The crashed leader's claim.
	pre := claims.New(kubeclient.NewFactory(), l.dyn, "", quietLog())
	if err := pre.ClaimService(context.Background(), netip.MustParseAddr(orphan), "lb", claims.ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web"}); err != nil {
		t.Fatal(err)
	}
	stop := l.start(t)
	defer stop()
	l.waitIngress(t, "web", y)
	l.fullPass(t)
	testutil.Eventually(t, "the orphan claim released", func() (bool, string) {
		_, ok := l.stored(orphan)
		return !ok, ""
	})
	if cl, ok := l.stored(y); !ok || cl.Service == nil || cl.Service.Name != "web" {
		t.Fatalf("web's own claim of %s: %+v, %v", y, cl, ok)
	}
}
