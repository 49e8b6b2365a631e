package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// gate holds the lists of the informers it wraps until it opens, and
// counts the lists begun.
type gate struct {
	open  chan struct{}
	mu    sync.Mutex
	lists int
}

func (g *gate) wait(ctx context.Context) error {
	g.mu.Lock()
	g.lists++
	g.mu.Unlock()
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) listed() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lists
}

// gated is a fake's ListerWatcher whose List waits for the gate; the
// fakes cannot stream a list through a watch, and say so.
type gated[L runtime.Object] struct {
	kubeclient.ListerWatcher[L]
	g *gate
}

func (l gated[L]) List(ctx context.Context, o metav1.ListOptions) (L, error) {
	if err := l.g.wait(ctx); err != nil {
		var zero L
		return zero, err
	}
	return l.ListerWatcher.List(ctx, o)
}

func (gated[L]) IsWatchListSemanticsUnSupported() bool { return true }

// withPeer is the daemon's start-up but for what a test daemon cannot
// do (authorize, restore: no AddressPools, no agent) and the peers,
// which it records with what the speaker held then.
type withPeer struct {
	*daemonStartup
	target *speakerSets
	peered chan map[netip.Prefix]advert.Path
}

func (w withPeer) authorize()                    {}
func (w withPeer) restore(context.Context) error { return nil }
func (w withPeer) peer() {
	held, _ := w.target.held()
	w.peered <- held
}

// CNI is served while the Services and EndpointSlices are still being
// listed: start-up waits for the informers ADD reads, not for theirs.
// Meanwhile no Service route is touched — none decided, none in the node
// state or the speaker — and no peer is added, so a graceful-restart peer
// keeps the routes of the agent before. Once they are listed the Service
// route reaches the speaker, and only then are the peers added.
func TestServesCNIWhileServicesList(t *testing.T) {
	d := testDaemon(t)
	d.o.CNISocket = filepath.Join(t.TempDir(), "cni.sock")
	target := &speakerSets{}
	d.bgpLoop = &reconcile.Loop[map[netip.Prefix]advert.Path]{Name: "bgp", Target: target, Desired: d.state.Adverts, Wake: d.state.Changed()}
	ext := netip.MustParsePrefix("2001:db8:e::1/128")
	cs := fake.NewClientset(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "fd00:96::10", ExternalIPs: []string{ext.Addr().String()},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv6,
			Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080))}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"fd00:10::1"}, NodeName: new("node-b")}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0"}, Spec: corev1.PodSpec{NodeName: "node1"}},
	)
	svcGate := &gate{open: make(chan struct{})}
	k := &kubeMode{factory: kubeclient.NewFactory(), svcFactory: kubeclient.NewFactory()}
	// What ADD reads: this node's pods (listed at once).
	pods := k.factory.Informer("pods", func() cache.SharedIndexInformer {
		return kubeclient.NewInformer(gated[*corev1.PodList]{cs.CoreV1().Pods(""), &gate{open: closed()}}, &corev1.Pod{}, nil)
	})
	k.services = services.New(k.svcFactory, services.Clients{
		Services:       gated[*corev1.ServiceList]{cs.CoreV1().Services(""), svcGate},
		EndpointSlices: gated[*discoveryv1.EndpointSliceList]{cs.DiscoveryV1().EndpointSlices(""), svcGate},
	}, services.Options{Node: "node1", Authorize: func(string, netip.Addr, string) error { return nil }}, d.log)
	d.kube = k

	c := &d.components
	c.register("informers", duringRecovery, k.factory)
	k.registerServices(d, c)
	s, done := startServing(t, d, target, "while the Services are being listed")
	if !pods.HasSynced() {
		t.Fatal("serving before the pods synced")
	}
	// The Services' informers start beside the CNI server: their lists
	// may begin just after it serves, and are held there.
	testutil.Eventually(t, "the Services' lists begun", func() (bool, string) {
		return svcGate.listed() > 0, fmt.Sprintf("%d begun", svcGate.listed())
	})
	if !d.ready.Load() {
		t.Error("CNI served, the agent not ready")
	}
	testutil.Consistently(t, "nothing of the Services touched while they are listed", 300*time.Millisecond, func() (bool, string) {
		held, _ := target.held()
		switch {
		case len(d.state.ServiceRoutes()) != 0:
			return false, fmt.Sprintf("node state has Service routes %v", d.state.ServiceRoutes())
		case held[ext].Kind == advert.Service:
			return false, "the speaker holds the Service route"
		case k.services.Changes() != 0:
			return false, "the controller published routes"
		case len(s.peered) != 0:
			return false, "peers added"
		}
		return true, ""
	})

	close(svcGate.open)
	select {
	case held := <-s.peered:
		if held[ext].Kind != advert.Service {
			t.Errorf("peers added while the speaker holds %v: the Service route is not in their first UPDATEs", held)
		}
	case <-time.After(testutil.Timeout):
		t.Fatal("peers never added once the Services were listed")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Services that are never listed (RBAC, say) hold the peers back only
// for serviceRoutesWait.
func TestPeersWithoutServicesAfterTheWait(t *testing.T) {
	defer func(w time.Duration) { serviceRoutesWait = w }(serviceRoutesWait)
	serviceRoutesWait = 200 * time.Millisecond
	d := testDaemon(t)
	cs := fake.NewClientset()
	never := &gate{open: make(chan struct{})}
	k := &kubeMode{factory: kubeclient.NewFactory(), svcFactory: kubeclient.NewFactory()}
	k.services = services.New(k.svcFactory, services.Clients{
		Services:       gated[*corev1.ServiceList]{cs.CoreV1().Services(""), never},
		EndpointSlices: gated[*discoveryv1.EndpointSliceList]{cs.DiscoveryV1().EndpointSlices(""), never},
	}, services.Options{Node: "node1"}, d.log)
	d.kube = k
	testutil.Run(t, k.svcFactory.Run)
	testutil.Run(t, k.services.Run)
	start := time.Now()
	d.waitServiceRoutes(context.Background())
	if took := time.Since(start); took < serviceRoutesWait || took > serviceRoutesWait+testutil.Timeout {
		t.Errorf("waited %v, want %v", took, serviceRoutesWait)
	}
	if len(d.state.ServiceRoutes()) != 0 {
		t.Errorf("Service routes from unlisted Services: %v", d.state.ServiceRoutes())
	}
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// startServing adds the BGP reconciler and a CNI server to d's
// components (the test registered the others) and runs d's start-up
// (withPeer) until the test ends. It returns once CNI is served (when:
// what the test holds back meanwhile), with the start-up's peers and its
// end.
func startServing(t *testing.T, d *daemon, target *speakerSets, when string) (withPeer, <-chan error) {
	t.Helper()
	serving := make(chan struct{})
	c := &d.components
	c.register("bgp reconciler", whenServing, d.bgpLoop)
	c.register("cni server", whenServing, RunFunc(func(ctx context.Context) error {
		close(serving)
		<-ctx.Done()
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	s := withPeer{daemonStartup: &daemonStartup{d: d, g: g}, target: target, peered: make(chan map[netip.Prefix]advert.Path, 1)}
	done := make(chan error, 1)
	go func() { done <- startup(gctx, s) }()
	t.Cleanup(func() {
		cancel()
		_ = g.Wait()
	})
	select {
	case <-serving:
	case <-time.After(testutil.Timeout):
		t.Fatal("CNI not served " + when)
	}
	return s, done
}
