package services

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// modelProxy is kube-proxy as the model runs it: it programs what the
// API says, some time after it says it, except for the stuck Services,
// which it never programs.
type modelProxy struct {
	mu        sync.Mutex
	delivered map[netip.Addr]bool
	reads     int
}

func (m *modelProxy) read() (Proxy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	cp := map[string]bool{}
	for a, on := range m.delivered {
		cp[fmt.Sprintf("%s 80/TCP", a)] = on
	}
	return proxyReading{delivered: cp}, nil
}

// TestProxyWaitModel: Services' local endpoints flip from several
// goroutines while a model kube-proxy follows the API with a delay and
// the controller restarts now and then. At every moment no address of a
// Service kube-proxy never programs is advertised (the wait is what
// keeps it back: the decision alone would advertise it); at quiescent
// points, once kube-proxy has caught up, the advertised addresses are
// exactly those decided and programmed. FLOCK_SEED=<n> repeats a run.
func TestProxyWaitModel(t *testing.T) {
	seed := testutil.Seed(t)
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	// The stuck Services must wait all run long.
	defer func(d time.Duration) { proxyHoldMax = d }(proxyHoldMax)
	proxyHoldMax = time.Hour
	const nsvc = 6
	ports := withPorts(corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	var objs []any
	ips := make([]netip.Addr, nsvc)
	stuck := map[netip.Addr]bool{}
	for i := range nsvc {
		ips[i] = netip.MustParseAddr(fmt.Sprintf("2001:db8:1b::%x", i+1))
		if i < 2 {
			stuck[ips[i]] = true
		}
		name := fmt.Sprintf("s%d", i)
		objs = append(objs, svc(name, ingress(ips[i].String()), local, ports), slicesFor(name, ep{node, fmt.Sprintf("fd00:10::%x", i+1), "ready"})[0])
	}
	cs := fake.NewClientset()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Service:
			_, err = cs.CoreV1().Services("shop").Create(ctx, o, metav1.CreateOptions{})
		case *discoveryv1.EndpointSlice:
			_, err = cs.DiscoveryV1().EndpointSlices("shop").Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// ready is what the API says of each Service's local endpoint.
	ready := func(i int) bool {
		sl, err := cs.DiscoveryV1().EndpointSlices("shop").Get(ctx, fmt.Sprintf("s%d-IPv6", i), metav1.GetOptions{})
		if err != nil {
			t.Error(err)
			return false
		}
		return *sl.Endpoints[0].Conditions.Ready
	}
	px := &modelProxy{delivered: map[netip.Addr]bool{}}
	catchUp := func() {
		for i, ip := range ips {
			on := !stuck[ip] && ready(i)
			px.mu.Lock()
			px.delivered[ip] = on
			px.mu.Unlock()
		}
	}

	var c *Controller
	var stopC, stopF func()
	start := func() {
		f := kubeclient.NewFactory()
		c = New(f, Clients{
			Services:       fakeSvcs{cs.CoreV1().Services(metav1.NamespaceAll)},
			EndpointSlices: fakeSlices{cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)},
		}, Options{Node: node, Authorize: authorize, ReadProxy: px.read}, nil)
		var fctx context.Context
		fctx, stopF = testutil.Run(t, f.Run)
		if err := f.WaitForSync(fctx); err != nil {
			t.Fatal(err)
		}
		_, stopC = testutil.Run(t, c.Run)
	}
	check := func(when string) {
		t.Helper()
		for p := range c.Routes() {
			if stuck[p.Addr()] {
				t.Fatalf("%s: %s advertised, though kube-proxy never programmed it", when, p)
			}
		}
	}
	start()
	for round := range 6 {
		// Writers flip endpoints; kube-proxy follows with a lag; the
		// invariant is checked all along.
		done := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 3 {
			wr := rand.New(rand.NewPCG(r.Uint64(), uint64(w)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 15 {
					i := wr.IntN(nsvc)
					sl, err := cs.DiscoveryV1().EndpointSlices("shop").Get(ctx, fmt.Sprintf("s%d-IPv6", i), metav1.GetOptions{})
					if err != nil {
						t.Error(err)
						return
					}
					on := wr.IntN(2) == 0
					sl.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: new(on), Serving: new(on), Terminating: new(false)}
					if _, err := cs.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Duration(wr.IntN(20)) * time.Millisecond)
				}
			}()
		}
		go func() {
			pr := rand.New(rand.NewPCG(r.Uint64(), 99))
			for {
				select {
				case <-done:
					return
				case <-time.After(time.Duration(5+pr.IntN(60)) * time.Millisecond):
					catchUp()
				}
			}
		}()
		deadline := time.Now().Add(400 * time.Millisecond)
		for time.Now().Before(deadline) {
			check(fmt.Sprintf("round %d", round))
			time.Sleep(5 * time.Millisecond)
		}
		if round%2 == 1 {
			// A restart: the new controller knows nothing it
			// advertised before.
			stopC()
			stopF()
			check(fmt.Sprintf("round %d, stopped", round))
			start()
		}
		wg.Wait()
		close(done)
		// Quiescent: kube-proxy caught up.
		catchUp()
		want := map[netip.Prefix]bool{}
		for i, ip := range ips {
			if ready(i) && !stuck[ip] {
				want[netip.PrefixFrom(ip, 128)] = true
			}
		}
		testutil.Eventually(t, fmt.Sprintf("round %d: advertised == decided and programmed", round), func() (bool, string) {
			got := c.Routes()
			if len(got) != len(want) {
				return false, fmt.Sprint(got)
			}
			for p := range got {
				if !want[p] {
					return false, fmt.Sprint(got)
				}
			}
			return true, ""
		})
		check(fmt.Sprintf("round %d, quiescent", round))
	}
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.reads == 0 {
		t.Error("the proxy was never read")
	}
}
