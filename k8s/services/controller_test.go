package services

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// The fakes cannot stream a list through a watch; they say so.
type fakeSvcs struct {
	kubeclient.ListerWatcher[*corev1.ServiceList]
}

func (fakeSvcs) IsWatchListSemanticsUnSupported() bool { return true }

type fakeSlices struct {
	kubeclient.ListerWatcher[*discoveryv1.EndpointSliceList]
}

func (fakeSlices) IsWatchListSemanticsUnSupported() bool { return true }

func startController(t *testing.T, cs *fake.Clientset, o Options) *Controller {
	t.Helper()
	f := kubeclient.NewFactory()
	c := New(f, Clients{
		Services:       fakeSvcs{cs.CoreV1().Services(metav1.NamespaceAll)},
		EndpointSlices: fakeSlices{cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)},
	}, o, nil)
	testutil.Start(t, f.Run, f.WaitForSync)
	testutil.Run(t, c.Run)
	testutil.WaitWatching(t, cs, "services")
	testutil.WaitWatching(t, cs, "endpointslices")
	return c
}

func waitRoutes(t *testing.T, c *Controller, what string, want map[netip.Prefix]Route) {
	t.Helper()
	testutil.Eventually(t, what, func() (bool, string) {
		got := c.Routes()
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})
}

// From the API: a LoadBalancer Service's address is advertised while a
// local endpoint is ready, drains when it terminates, goes when nothing
// serves; an EndpointSlice of another Service changes nothing; the
// Service's deletion withdraws; options (pools) changing re-decides all.
func TestController(t *testing.T) {
	web := svc("web", ingress("2001:db8:1b::1"), local)
	sl := slicesFor("web", ep{node, "fd00:10::1", "ready"})[0]
	other := slicesFor("db", ep{node, "fd00:10::9", "ready"})[0]
	cs := fake.NewClientset(web, sl, other)
	c := startController(t, cs, Options{Node: node, Authorize: authorize, Weights: true})
	ctx := context.Background()
	p := netip.MustParsePrefix("2001:db8:1b::1/128")

	waitRoutes(t, c, "advertised with weight 1", map[netip.Prefix]Route{p: {Path: advert.Path{Kind: advert.Service, Weight: 1}, Owners: []string{"shop/web"}}})
	<-c.Changed()

	sl.Endpoints[0].Conditions.Ready = new(false)
	sl.Endpoints[0].Conditions.Terminating = new(true)
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, c, "draining", map[netip.Prefix]Route{p: {Path: advert.Path{Kind: advert.Service, Drain: true, Weight: 1}, Owners: []string{"shop/web"}}})
	if rows := c.Addresses(); len(rows) != 1 || rows[0].State != StateDraining {
		t.Errorf("Addresses = %v", rows)
	}

	sl.Endpoints[0].Conditions.Serving = new(false)
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, c, "withdrawn", map[netip.Prefix]Route{})
	if rows := c.Addresses(); len(rows) != 1 || rows[0].State != StateNotAdvertised || rows[0].Reason != "no usable endpoint in the cluster" {
		t.Errorf("Addresses = %v", rows)
	}

	// Back, then the pools stop allowing it, then the Service goes.
	sl.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: new(true)}
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, c, "back", map[netip.Prefix]Route{p: {Path: advert.Path{Kind: advert.Service, Weight: 1}, Owners: []string{"shop/web"}}})
	c.SetOptions(Options{Node: node, Authorize: func(string, netip.Addr, string) error { return fmt.Errorf("pool gone") }})
	waitRoutes(t, c, "unauthorized", map[netip.Prefix]Route{})
	c.SetOptions(Options{Node: node, Authorize: authorize})
	waitRoutes(t, c, "authorized again, no weights", map[netip.Prefix]Route{p: {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/web"}}})
	if err := cs.CoreV1().Services("shop").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, c, "Service deleted", map[netip.Prefix]Route{})
	if n := c.Changes(); n < 6 {
		t.Errorf("Changes() = %d, want at least the 6 route changes made here", n)
	}
	if rows := c.Addresses(); len(rows) != 0 {
		t.Errorf("Addresses after the Service went: %v", rows)
	}
}

// fakeProxy is a Service proxy's rules as a test sets them.
type fakeProxy struct {
	mu        sync.Mutex
	delivered map[string]bool // "ip port/proto"
	unknown   bool            // its rules cannot be read for any family
	fail      error
	reads     int
}

func (f *fakeProxy) set(key string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delivered[key] = on
}

func (f *fakeProxy) read() (Proxy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.fail != nil {
		return nil, f.fail
	}
	return proxyReading{maps.Clone(f.delivered), f.unknown}, nil
}

func (f *fakeProxy) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

type proxyReading struct {
	delivered map[string]bool
	unknown   bool
}

func (p proxyReading) Delivers(ip netip.Addr, proto corev1.Protocol, port int32) (bool, bool) {
	return p.delivered[fmt.Sprintf("%s %d/%s", ip, port, proto)], !p.unknown
}

func withPorts(ports ...corev1.ServicePort) svcOpt {
	return func(s *corev1.Service) { s.Spec.Ports = ports }
}

// An address kube-proxy would deliver goes out only once kube-proxy has
// programmed it on a port of the Service; once out, the proxy is not
// read again for it; a proxy whose rules cannot be read holds nothing;
// rules that never take it hold it for proxyHoldMax, no longer.
func TestControllerWaitsForProxy(t *testing.T) {
	ports := withPorts(corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	web := svc("web", ingress("2001:db8:1b::1"), local, ports)
	sl := slicesFor("web", ep{node, "fd00:10::1", "ready"})[0]
	cs := fake.NewClientset(web, sl)
	px := &fakeProxy{delivered: map[string]bool{}}
	c := startController(t, cs, Options{Node: node, Authorize: authorize, ReadProxy: px.read})
	ctx := context.Background()
	p := netip.MustParsePrefix("2001:db8:1b::1/128")
	out := map[netip.Prefix]Route{p: {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/web"}}}

	testutil.Eventually(t, "held for kube-proxy", func() (bool, string) {
		rows := c.Addresses()
		return len(rows) == 1 && rows[0].State == StateNotAdvertised && strings.HasPrefix(rows[0].Reason, ReasonProxyPending), fmt.Sprint(rows)
	})
	if r := c.Routes(); len(r) != 0 {
		t.Fatalf("routes while kube-proxy has not programmed the address: %v", r)
	}
	if rows := c.Addresses(); !strings.Contains(rows[0].Reason, "80/TCP, 53/UDP") {
		t.Errorf("the reason does not name the ports waited for: %q", rows[0].Reason)
	}
	// One port is enough (kube-proxy programs a Service's ports in one
	// transaction, and never a port without endpoints: 53/UDP has none
	// here).
	px.set("2001:db8:1b::1 80/TCP", true)
	waitRoutes(t, c, "advertised once programmed", out)

	// Out: changes of its Service read the proxy no more, even if it
	// says otherwise now (kube-proxy delivered it; the decision alone
	// takes it back).
	px.set("2001:db8:1b::1 80/TCP", false)
	reads := px.readCount()
	sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{"fd00:10::2"}, NodeName: new("node-b"), Conditions: discoveryv1.EndpointConditions{Ready: new(true)}})
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the update seen", func() (bool, string) {
		rows := c.Addresses()
		return len(rows) == 1 && rows[0].Endpoints == 1 && c.Changes() > 0, fmt.Sprint(rows)
	})
	time.Sleep(3 * proxyRetry)
	if n := px.readCount(); n != reads {
		t.Errorf("the proxy was read %d more times for an address already out", n-reads)
	}
	waitRoutes(t, c, "still advertised", out)

	// Withdrawn (no local endpoint), then back: held again until
	// programmed.
	sl.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: new(false), Serving: new(false)}
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, c, "withdrawn", map[netip.Prefix]Route{})
	sl.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: new(true)}
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "held again", func() (bool, string) {
		rows := c.Addresses()
		return len(rows) == 1 && strings.HasPrefix(rows[0].Reason, ReasonProxyPending), fmt.Sprint(rows)
	})
	px.set("2001:db8:1b::1 80/TCP", true)
	waitRoutes(t, c, "out again", out)

	// Rules that never take the address (a table kube-proxy left
	// behind) hold it for proxyHoldMax, no longer.
	t.Run("held too long", func(t *testing.T) {
		defer func(d time.Duration) { proxyHoldMax = d }(proxyHoldMax)
		proxyHoldMax = 500 * time.Millisecond
		px := &fakeProxy{delivered: map[string]bool{}}
		cs := fake.NewClientset(svc("web", ingress("2001:db8:1b::1"), local, ports), slicesFor("web", ep{node, "fd00:10::1", "ready"})[0])
		start := time.Now()
		c := startController(t, cs, Options{Node: node, Authorize: authorize, ReadProxy: px.read})
		waitRoutes(t, c, "advertised after the longest wait", out)
		if d := time.Since(start); d < proxyHoldMax {
			t.Errorf("advertised after %s, before the wait of %s ended", d, proxyHoldMax)
		}
	})

	// Rules that cannot be read hold nothing, nor does a failed read.
	for _, tc := range []struct {
		name    string
		unknown bool
		fail    error
	}{{"unknown family", true, nil}, {"failed read", false, fmt.Errorf("netlink: permission denied")}} {
		t.Run(tc.name, func(t *testing.T) {
			px := &fakeProxy{delivered: map[string]bool{}, unknown: tc.unknown, fail: tc.fail}
			cs := fake.NewClientset(svc("web", ingress("2001:db8:1b::1"), local, ports), slicesFor("web", ep{node, "fd00:10::1", "ready"})[0])
			c := startController(t, cs, Options{Node: node, Authorize: authorize, ReadProxy: px.read})
			waitRoutes(t, c, "advertised at once", out)
		})
	}
}

// A Service deleted while its address waits, then a full recompute (the
// claims changed) in the same pass: no wait is left behind, so the same
// Service and address created again wait from the start. Driven by hand
// (the informers' stores, recompute) to put both in one pass.
func TestProxyWaitForgetsDeleted(t *testing.T) {
	px := &fakeProxy{delivered: map[string]bool{}}
	f := kubeclient.NewFactory()
	cs := fake.NewClientset()
	c := New(f, Clients{
		Services:       fakeSvcs{cs.CoreV1().Services(metav1.NamespaceAll)},
		EndpointSlices: fakeSlices{cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)},
	}, Options{Node: node, Authorize: authorize, ReadProxy: px.read}, nil)
	web := svc("web", ingress("2001:db8:1b::1"), local, withPorts(corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}))
	if err := c.svcs.GetStore().Add(web); err != nil {
		t.Fatal(err)
	}
	c.eps.cur = &sliceWatch{inf: newSliceInformer(c.eps.lw, sliceLabels), stop: func() {}}
	if err := c.eps.cur.inf.GetIndexer().Add(slicesFor("web", ep{node, "fd00:10::1", "ready"})[0]); err != nil {
		t.Fatal(err)
	}
	c.mark("shop/web")
	c.recompute()
	if len(c.heldSince) != 1 {
		t.Fatalf("held: waits %v", c.heldSince)
	}
	if err := c.svcs.GetStore().Delete(web); err != nil {
		t.Fatal(err)
	}
	c.mark("shop/web")
	c.Refresh()
	c.recompute()
	if len(c.heldSince) != 0 {
		t.Fatalf("after the Service went in a full recompute, waits are left: %v", c.heldSince)
	}
}

// gatedSvcs lists only once its gate opens, and records the options of
// every list and watch.
type gatedSvcs struct {
	fakeSvcs
	gate chan struct{}
	mu   sync.Mutex
	opts []metav1.ListOptions
}

func (g *gatedSvcs) List(ctx context.Context, o metav1.ListOptions) (*corev1.ServiceList, error) {
	g.record(o)
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.fakeSvcs.List(ctx, o)
}

func (g *gatedSvcs) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	g.record(o)
	return g.fakeSvcs.Watch(ctx, o)
}

// gatedSlices lists only once its gate opens.
type gatedSlices struct {
	fakeSlices
	gate chan struct{}
}

func (g gatedSlices) List(ctx context.Context, o metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.fakeSlices.List(ctx, o)
}

func (g *gatedSvcs) record(o metav1.ListOptions) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.opts = append(g.opts, o)
}

// The informers ask for kube-proxy's selectors and cache trimmed
// objects; until the Services, and the slices of those that want them,
// are listed nothing is decided (no route, no change, Synced open), once
// they are Synced closes, also when the answer is no route at all.
func TestControllerSynced(t *testing.T) {
	for _, withRoute := range []bool{true, false} {
		t.Run(fmt.Sprint("route ", withRoute), func(t *testing.T) {
			web := svc("web", ingress("2001:db8:1b::1"))
			web.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}
			var objs []runtime.Object
			if withRoute {
				objs = append(objs, web, slicesFor("web", ep{node, "fd00:10::1", "ready"})[0])
			}
			cs := fake.NewClientset(objs...)
			gated := &gatedSvcs{fakeSvcs: fakeSvcs{cs.CoreV1().Services(metav1.NamespaceAll)}, gate: make(chan struct{})}
			slicesGate := make(chan struct{})
			f := kubeclient.NewFactory()
			c := New(f, Clients{Services: gated, EndpointSlices: gatedSlices{fakeSlices{cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)}, slicesGate}},
				Options{Node: node, Authorize: authorize}, nil)
			testutil.Run(t, f.Run)
			testutil.Run(t, c.Run)
			testutil.Eventually(t, "the Services listed", func() (bool, string) {
				gated.mu.Lock()
				defer gated.mu.Unlock()
				return len(gated.opts) > 0, ""
			})
			time.Sleep(100 * time.Millisecond)
			select {
			case <-c.Synced():
				t.Fatal("Synced before the Services were listed")
			default:
			}
			if r, n := c.Routes(), c.Changes(); len(r) != 0 || n != 0 {
				t.Fatalf("before the Services were listed: routes %v, %d changes", r, n)
			}
			close(gated.gate)
			if withRoute {
				// web wants its slices: nothing is decided before they
				// are listed.
				time.Sleep(100 * time.Millisecond)
				select {
				case <-c.Synced():
					t.Fatal("Synced before the slices were listed")
				default:
				}
			}
			close(slicesGate)
			select {
			case <-c.Synced():
			case <-time.After(10 * time.Second):
				t.Fatal("Synced never closed")
			}
			if got := len(c.Routes()); got != map[bool]int{true: 1, false: 0}[withRoute] {
				t.Fatalf("routes once Synced: %v", c.Routes())
			}
			gated.mu.Lock()
			o := gated.opts[0]
			gated.mu.Unlock()
			if o.LabelSelector != "!service.kubernetes.io/service-proxy-name" || o.FieldSelector != "spec.clusterIP!=None" {
				t.Errorf("Services listed with %q %q, not kube-proxy's selectors", o.LabelSelector, o.FieldSelector)
			}
			if withRoute {
				obj, ok, _ := c.svcs.GetStore().GetByKey("shop/web")
				if !ok || obj.(*corev1.Service).Annotations != nil {
					t.Errorf("the cache holds the Service untrimmed: %v", obj)
				}
			}
		})
	}
}
