package services

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
