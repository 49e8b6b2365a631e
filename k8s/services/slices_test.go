package services

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// selecting is a fake API whose watches of EndpointSlices send only what
// their label selector selects, as the API server's do (the fake's
// lists already do), and which records every selector the slices were
// listed and watched with, and counts the watches of Services opened.
type selecting struct {
	*fake.Clientset
	mu        sync.Mutex
	selectors []string
	svcWatch  atomic.Int32
}

func newSelecting(objs ...runtime.Object) *selecting {
	s := &selecting{Clientset: fake.NewClientset(objs...)}
	s.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s.record(a.(k8stesting.ListActionImpl).ListOptions.LabelSelector)
		return false, nil, nil
	})
	s.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchActionImpl)
		w, err := s.Tracker().Watch(a.GetResource(), a.GetNamespace(), wa.ListOptions)
		if err != nil {
			return true, nil, err
		}
		if a.GetResource().Resource == "services" {
			s.svcWatch.Add(1)
			return true, w, nil
		}
		s.record(wa.ListOptions.LabelSelector)
		sel := wa.WatchRestrictions.Labels
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			m, err := meta.Accessor(e.Object)
			return e, err == nil && sel.Matches(labels.Set(m.GetLabels()))
		}), nil
	})
	return s
}

func (s *selecting) record(sel string) {
	s.mu.Lock()
	s.selectors = append(s.selectors, sel)
	s.mu.Unlock()
}

// listedSlices are the keys of the slices the controller's watch holds.
func listedSlices(c *Controller) []string {
	c.eps.mu.Lock()
	w := c.eps.cur
	c.eps.mu.Unlock()
	if w == nil || w.inf == nil {
		return nil
	}
	keys := w.inf.GetStore().ListKeys()
	slices.Sort(keys)
	return keys
}

func clusterIP(s *corev1.Service) {
	s.Spec.Type, s.Spec.LoadBalancerClass = corev1.ServiceTypeClusterIP, nil
}

func externalIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

// A node lists and watches only the EndpointSlices of the Services whose
// addresses it decides (a LoadBalancer's ingress, external IPs): a
// ClusterIP Service's slices never reach it. A Service that gets an
// external IP later gets a watch of its slices, and its address goes
// out; past the selector's limit every slice is watched.
func TestSlicesOnlyOfServicesThatWantThem(t *testing.T) {
	web := svc("web", ingress("2001:db8:1b::1"))
	db := svc("db", clusterIP)
	ext := svc("ext", clusterIP)
	objs := []runtime.Object{web, db, ext}
	for _, name := range []string{"web", "db", "ext"} {
		objs = append(objs, slicesFor(name, ep{node, "fd00:10::1", "ready"})[0])
	}
	cs := newSelecting(objs...)
	c := startController(t, cs.Clientset, Options{Node: node, Authorize: authorize})
	ctx := context.Background()
	waitRows(t, c, "web advertised", []string{"shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"})
	if got := listedSlices(c); !slices.Equal(got, []string{"shop/web-IPv6"}) {
		t.Fatalf("slices held: %v, want only web's", got)
	}
	dbLabels := labels.Set{discoveryv1.LabelServiceName: "db"}
	checkSelectors := func() {
		t.Helper()
		cs.mu.Lock()
		defer cs.mu.Unlock()
		for _, s := range cs.selectors {
			sel, err := labels.Parse(s)
			if err != nil {
				t.Fatalf("selector %q: %v", s, err)
			}
			if sel.Matches(dbLabels) {
				t.Fatalf("slices asked with %q, which selects the ClusterIP Service db's", s)
			}
		}
	}
	checkSelectors()

	ext.Spec.ExternalIPs = []string{"2001:db8:e::1"}
	if _, err := cs.CoreV1().Services("shop").Update(ctx, ext, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRows(t, c, "ext's external IP advertised once its slices are listed", []string{
		"shop/ext externalIP 2001:db8:e::1: advertised (ready endpoint in the cluster, 1)",
		"shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"})
	if got := listedSlices(c); !slices.Equal(got, []string{"shop/ext-IPv6", "shop/web-IPv6"}) {
		t.Fatalf("slices held: %v, want web's and ext's", got)
	}
	checkSelectors()
	// A slice of a watched Service follows.
	sl := slicesFor("ext", ep{node, "fd00:10::1", "down"})[0]
	if _, err := cs.DiscoveryV1().EndpointSlices("shop").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRows(t, c, "ext's endpoint down", []string{
		"shop/ext externalIP 2001:db8:e::1: not advertised (no usable endpoint in the cluster, 0)",
		"shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"})
}

func TestSlicesPastTheSelectorLimit(t *testing.T) {
	defer func(n int) { maxSelector = n }(maxSelector)
	maxSelector = 72 // web's selector fits (67 bytes), with shop-frontend's it does not
	objs := []runtime.Object{svc("web", ingress("2001:db8:1b::1")), svc("db", clusterIP)}
	for _, name := range []string{"web", "db"} {
		objs = append(objs, slicesFor(name, ep{node, "fd00:10::1", "ready"})[0])
	}
	cs := newSelecting(objs...)
	c := startController(t, cs.Clientset, Options{Node: node, Authorize: authorize})
	waitRows(t, c, "web advertised", []string{"shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"})
	if got := listedSlices(c); !slices.Equal(got, []string{"shop/web-IPv6"}) {
		t.Fatalf("slices held: %v, want only web's", got)
	}
	if _, err := cs.CoreV1().Services("shop").Create(context.Background(), svc("shop-frontend", externalIPs("2001:db8:e::1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "every slice watched", func() (bool, string) {
		got := listedSlices(c)
		return slices.Equal(got, []string{"shop/db-IPv6", "shop/web-IPv6"}), fmt.Sprint(got)
	})
	cs.mu.Lock()
	last := cs.selectors[len(cs.selectors)-1]
	cs.mu.Unlock()
	if last != sliceLabels {
		t.Errorf("past the limit, slices watched with %q, want kube-proxy's %q", last, sliceLabels)
	}
}

func TestSliceWatchWidth(t *testing.T) {
	set := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	many := set()
	for i := range 20 {
		many[fmt.Sprint("s", i)] = true
	}
	for _, tc := range []struct {
		name            string
		have, want      map[string]bool
		covers, tooWide bool
	}{
		{"the same", set("a"), set("a"), true, false},
		{"one more wanted", set("a"), set("a", "b"), false, false},
		{"a few more held", set("a", "b", "c"), set("a"), true, false},
		{"far more held", many, set("s1"), true, true},
		{"nothing wanted, a few held", set("a"), set(), true, false},
		{"every slice held, a selector would do", nil, set("a"), true, true},
		{"every slice held and wanted", nil, nil, true, false},
		{"every slice wanted", set("a"), nil, false, false},
	} {
		if got := covers(tc.have, tc.want); got != tc.covers {
			t.Errorf("%s: covers %v, want %v", tc.name, got, tc.covers)
		}
		if got := wide(tc.have, tc.want); got != tc.tooWide {
			t.Errorf("%s: wide %v, want %v", tc.name, got, tc.tooWide)
		}
	}
}

func waitRows(t *testing.T, c *Controller, what string, want []string) {
	t.Helper()
	testutil.Eventually(t, what, func() (bool, string) {
		var got []string
		for _, a := range c.Addresses() {
			got = append(got, row(a))
		}
		return slices.Equal(got, want), fmt.Sprint(got)
	})
}

// TestSliceWatchModel: Services turn LoadBalancer, get and lose external
// IPs, go and come back, and their endpoints flip, from several
// goroutines, while the controller restarts now and then; a Service of
// the same name lives in another namespace. At quiescent points the
// controller's rows are Compute of every Service and every slice of the
// API (as if every slice were watched), and it holds no slice of a
// Service that does not want them beyond the watch's margin.
// FLOCK_SEED=<n> repeats a run.
func TestSliceWatchModel(t *testing.T) {
	seed := testutil.Seed(t)
	const nsvc = 8
	nss := []string{"shop", "other"}
	cs := newSelecting()
	ctx := context.Background()
	shape := func(r *rand.Rand, ns string, i int) *corev1.Service {
		name := fmt.Sprintf("s%d", i)
		var s *corev1.Service
		switch r.IntN(4) {
		case 0:
			s = svc(name, clusterIP)
		case 1:
			s = svc(name, clusterIP, externalIPs(fmt.Sprintf("2001:db8:e::%x", i+1)))
		case 2:
			s = svc(name)
		default:
			s = svc(name, ingress(fmt.Sprintf("2001:db8:1b::%x", i+1)))
		}
		if r.IntN(2) == 0 {
			local(s)
		}
		s.Namespace = ns
		return s
	}
	slice := func(r *rand.Rand, ns string, i int) *discoveryv1.EndpointSlice {
		n := []string{node, "node-b"}[r.IntN(2)]
		st := []string{"ready", "terminating", "down"}[r.IntN(3)]
		sl := slicesFor(fmt.Sprintf("s%d", i), ep{n, fmt.Sprintf("fd00:10::%x", i+1), st})[0]
		sl.Namespace = ns
		return sl
	}
	r0 := rand.New(rand.NewPCG(uint64(seed), 0))
	for _, ns := range nss {
		for i := range nsvc {
			if _, err := cs.CoreV1().Services(ns).Create(ctx, shape(r0, ns, i), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// Slices are changed, never deleted: the fake's watch, unlike
			// the API server's, does not replay a delete made between a
			// list and its watch.
			if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice(r0, ns, i), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var c *Controller
	var stop func()
	start := func() {
		opened := cs.svcWatch.Load()
		f := kubeclient.NewFactory()
		c = New(f, Clients{
			Services:       fakeSvcs{cs.CoreV1().Services(metav1.NamespaceAll)},
			EndpointSlices: fakeSlices{cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)},
		}, Options{Node: node, Authorize: authorize}, nil)
		fctx, stopF := testutil.Run(t, f.Run)
		if err := f.WaitForSync(fctx); err != nil {
			t.Fatal(err)
		}
		_, stopC := testutil.Run(t, c.Run)
		stop = func() { stopC(); stopF() }
		// Services are deleted too: nothing changes until the watch is
		// open (see slices above).
		testutil.Eventually(t, "the Services watched", func() (bool, string) { return cs.svcWatch.Load() > opened, "" })
	}
	start()
	truth := func() []string {
		svcs, err := cs.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sls, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var in []*corev1.Service
		for i := range svcs.Items {
			s, _ := trimService(&svcs.Items[i])
			in = append(in, s.(*corev1.Service))
		}
		addrs, _ := Compute(Options{Node: node, Authorize: authorize}, in, func(key string) []*discoveryv1.EndpointSlice {
			var out []*discoveryv1.EndpointSlice
			for i := range sls.Items {
				if sliceService(&sls.Items[i]) == key {
					s, _ := trimSlice(&sls.Items[i])
					out = append(out, s.(*discoveryv1.EndpointSlice))
				}
			}
			return out
		})
		var rows []string
		for _, a := range addrs {
			rows = append(rows, row(a))
		}
		return rows
	}
	for round := range 8 {
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(seed), uint64(round*10+g+1)))
				for range 25 {
					ns, i := nss[r.IntN(len(nss))], r.IntN(nsvc)
					var err error
					switch r.IntN(4) {
					case 0, 1:
						s := shape(r, ns, i)
						for {
							if _, err = cs.CoreV1().Services(ns).Update(ctx, s, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
								if _, err = cs.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
									continue // made by another goroutine meanwhile
								}
							}
							break
						}
					case 2:
						err = cs.CoreV1().Services(ns).Delete(ctx, fmt.Sprintf("s%d", i), metav1.DeleteOptions{})
						if apierrors.IsNotFound(err) {
							err = nil
						}
					default:
						_, err = cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice(r, ns, i), metav1.UpdateOptions{})
					}
					if err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		want := truth()
		waitRows(t, c, fmt.Sprintf("round %d: the rows of every Service and slice", round), want)
		// Nothing of a Service that wants no slices is held but what the
		// watch's margin allows.
		c.eps.mu.Lock()
		target := c.eps.target()
		c.eps.mu.Unlock()
		held := map[string]bool{}
		for _, k := range listedSlices(c) {
			held[k] = true
		}
		if target != nil && len(held) > 2*2*len(target)+2*8 {
			t.Fatalf("round %d: %d slices held for %d names wanted", round, len(held), len(target))
		}
		if round%3 == 2 {
			stop()
			start()
		}
	}
}
