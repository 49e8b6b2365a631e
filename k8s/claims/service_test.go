package claims

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

var (
	web    = ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web"}
	api    = ServiceRef{Namespace: "shop", Name: "api", UID: "uid-api"}
	lbIP   = netip.MustParseAddr("2001:db8:1b::1")
	lbIPv4 = netip.MustParseAddr("203.0.113.128")
)

// svcClaim is a Service's claim, as ClaimService makes it.
func svcClaim(ip, pool string, svc ServiceRef) Claim {
	return Claim{IP: netip.MustParseAddr(ip), Use: v1alpha1.UseLoadBalancer, Pool: pool, Service: &svc}
}

// The leader's Claims may run on any node (or none): a Service's claim
// names no node, pod or container whatever the Claims' node is.
func TestClaimServiceCreatesTheObject(t *testing.T) {
	a := newFakeAPI()
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	if err := c.ClaimService(context.Background(), netip.MustParseAddr("::ffff:203.0.113.128"), "lb-pool", web); err != nil {
		t.Fatal(err)
	}
	u, ok := a.get(t, "203.0.113.128")
	if !ok {
		t.Fatal("no AddressClaim ipv4-203.0.113.128")
	}
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	want := map[string]any{"ip": "203.0.113.128", "use": "loadBalancer", "pool": "lb-pool",
		"service": map[string]any{"namespace": "shop", "name": "web", "uid": "uid-web"}}
	if !reflect.DeepEqual(spec, want) {
		t.Fatalf("spec = %v, want %v (no pod, node or containerID)", spec, want)
	}
	if l := u.GetLabels(); len(l) != 1 || l[LabelPool] != "lb-pool" {
		t.Fatalf("labels = %v, want the pool's only", l)
	}
	got, err := ClaimOf(u)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Created.Equal(t0) {
		t.Fatalf("Created = %s, want %s", got.Created, t0)
	}
	got.Created = time.Time{}
	if w := (Claim{IP: lbIPv4, Use: v1alpha1.UseLoadBalancer, Pool: "lb-pool", Service: &web}); !reflect.DeepEqual(got, w) {
		t.Fatalf("ClaimOf = %+v, want %+v", got, w)
	}
}

// ClaimOf and object invert each other, for a pod's claim and a Service's.
func TestClaimOfRoundTrip(t *testing.T) {
	for _, cl := range []Claim{
		svcClaim("2001:db8:1b::1", "lb", web),
		svcClaim("203.0.113.1", "", ServiceRef{Namespace: "ns", Name: "no-uid"}),
		func() Claim {
			cl := svcClaim("2001:db8:1b::2", "lb", web)
			cl.SharingKey, cl.Sharers = "k", []ServiceRef{api, {Namespace: "other", Name: "x"}}
			return cl
		}(),
		claim("2001:db8:100::1", v1alpha1.UsePod, "shared", podmeta.ID{Namespace: "kube-system", Name: "dns", UID: "m1", StaticUID: "s1"}, "node-a", "c1"),
		claim("198.51.100.1", v1alpha1.UseAddresses, "", pod("ns", "x"), "node-b", "c2"),
	} {
		u, err := object(cl)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ClaimOf(u)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, cl) {
			t.Errorf("round trip\n got %+v\nwant %+v", got, cl)
		}
		if _, has := u.Object["spec"].(map[string]any)["pod"]; has == (cl.Service != nil) {
			t.Errorf("%s: spec.pod present: %v, for a claim held by %s", cl.IP, has, cl.who())
		}
	}
}

// A Service claiming its own address again (the leader restarted, another
// leader took over, a retried reconcile) is fine; an empty UID on either
// side matches by namespace and name.
func TestClaimServiceIdempotent(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "", quiet())
	for i := range 3 {
		if err := c.ClaimService(ctx, lbIP, "lb", web); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	noUID := ServiceRef{Namespace: web.Namespace, Name: web.Name}
	if err := New(kubeclient.NewFactory(), a, "node-b", quiet()).ClaimService(ctx, lbIP, "lb", noUID); err != nil {
		t.Fatalf("the same Service without a UID, from another node: %v", err)
	}
	if err := c.ClaimService(ctx, lbIPv4, "lb", noUID); err != nil {
		t.Fatal(err)
	}
	if err := c.ClaimService(ctx, lbIPv4, "lb", web); err != nil {
		t.Fatalf("the Service's UID against a claim without one: %v", err)
	}
	// The pool does not matter (the address is the Service's either way).
	if err := c.ClaimService(ctx, lbIP, "other-pool", web); err != nil {
		t.Fatal(err)
	}
	u, _ := a.get(t, lbIP.String())
	if got, _ := ClaimOf(u); got.Pool != "lb" || !reflect.DeepEqual(got.Service, &web) {
		t.Fatalf("claim %+v changed", got)
	}
}

// Whoever holds the IP, anyone else is refused with a *ClaimedError naming
// the holder: pod against Service, Service against pod, Service against
// Service (another one, or another incarnation of the same name).
func TestServiceClaimConflicts(t *testing.T) {
	ctx := context.Background()
	holderPod := claim("2001:db8:1b::2", v1alpha1.UseAddresses, "lb", podmeta.ID{Namespace: "shop", Name: "db-0", UID: "6f1c"}, "node-b", "0123456789abcdef0123")
	reborn := ServiceRef{Namespace: web.Namespace, Name: web.Name, UID: "uid-web-2"}
	for name, tc := range map[string]struct {
		holder, taker Claim
		want          string
	}{
		"a Service against a pod's claim": {holderPod, svcClaim("2001:db8:1b::2", "lb", web),
			"2001:db8:1b::2 is claimed by pod shop/db-0 (uid 6f1c) on node node-b, container 0123456789ab"},
		"a pod against a Service's claim": {svcClaim("2001:db8:1b::1", "lb", web), claim("2001:db8:1b::1", v1alpha1.UseAddresses, "lb", pod("shop", "x"), "node-a", "c1"),
			"2001:db8:1b::1 is claimed by Service shop/web (uid uid-web)"},
		"a pod address against a Service's claim": {svcClaim("2001:db8:1b::1", "lb", web), claim("2001:db8:1b::1", v1alpha1.UsePod, "lb", pod("shop", "x"), "node-a", "c1"),
			"2001:db8:1b::1 is claimed by Service shop/web (uid uid-web)"},
		"another Service": {svcClaim("2001:db8:1b::1", "lb", web), svcClaim("2001:db8:1b::1", "lb", api),
			"2001:db8:1b::1 is claimed by Service shop/web (uid uid-web)"},
		"another incarnation of the Service": {svcClaim("2001:db8:1b::1", "lb", web), svcClaim("2001:db8:1b::1", "lb", reborn),
			"2001:db8:1b::1 is claimed by Service shop/web (uid uid-web)"},
		"a Service without a UID against another": {svcClaim("2001:db8:1b::1", "lb", ServiceRef{Namespace: "shop", Name: "web"}), svcClaim("2001:db8:1b::1", "lb", api),
			"2001:db8:1b::1 is claimed by Service shop/web"},
	} {
		t.Run(name, func(t *testing.T) {
			a := newFakeAPI()
			if err := New(kubeclient.NewFactory(), a, tc.holder.Node, quiet()).Claim(ctx, tc.holder); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.taker.Service != nil {
				err = New(kubeclient.NewFactory(), a, "node-a", quiet()).ClaimService(ctx, tc.taker.IP, tc.taker.Pool, *tc.taker.Service)
			} else {
				err = New(kubeclient.NewFactory(), a, "node-a", quiet()).Claim(ctx, tc.taker)
			}
			var ce *ClaimedError
			if !errors.As(err, &ce) {
				t.Fatalf("%v, want a *ClaimedError", err)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n got %s\nwant %s", err, tc.want)
			}
			ce.Holder.Created = time.Time{}
			if !reflect.DeepEqual(ce.Holder, tc.holder) {
				t.Errorf("holder %+v, want %+v", ce.Holder, tc.holder)
			}
			u, _ := a.get(t, tc.holder.IP.String())
			if got, _ := ClaimOf(u); got.Use != tc.holder.Use || got.ContainerID != tc.holder.ContainerID || !reflect.DeepEqual(got.Service, tc.holder.Service) {
				t.Errorf("the claim is now %+v, want the holder's", got)
			}
		})
	}
}

// A Service's create whose answer is lost is read back as a pod's is: the
// Service's own claim is success, another Service's is a ClaimedError.
func TestClaimServiceReadsBack(t *testing.T) {
	for name, tc := range map[string]struct {
		committed ServiceRef
		wantErr   bool
	}{
		"its own":         {web, false},
		"another Service": {api, true},
	} {
		t.Run(name, func(t *testing.T) {
			a := newFakeAPI()
			a.PrependReactor("create", GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
				u, err := object(svcClaim(lbIP.String(), "lb", tc.committed))
				if err != nil {
					return true, nil, err
				}
				u.SetUID("uid-committed")
				if err := a.Tracker().Create(GVR, u, ""); err != nil {
					return true, nil, err
				}
				return true, nil, apierrors.NewServiceUnavailable("etcd timeout")
			})
			err := New(kubeclient.NewFactory(), a, "", quiet()).ClaimService(context.Background(), lbIP, "lb", web)
			var ce *ClaimedError
			if tc.wantErr != errors.As(err, &ce) || (!tc.wantErr && err != nil) {
				t.Fatalf("ClaimService: %v, want a ClaimedError: %v", err, tc.wantErr)
			}
		})
	}
}

// ReleaseService deletes only that Service's claim, with preconditions;
// a pod's Release never deletes a Service's claim.
func TestReleaseService(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	podIP := netip.MustParseAddr("2001:db8:1b::2")
	if err := c.ClaimService(ctx, lbIP, "lb", web); err != nil {
		t.Fatal(err)
	}
	if err := c.Claim(ctx, claim(podIP.String(), v1alpha1.UseAddresses, "lb", pod("shop", "x"), "", "c1")); err != nil {
		t.Fatal(err)
	}
	// Not theirs: nil, nothing deleted.
	for name, release := range map[string]func() error{
		"another Service": func() error { return c.ReleaseService(ctx, lbIP, api) },
		"another incarnation of the Service": func() error {
			return c.ReleaseService(ctx, lbIP, ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web-2"})
		},
		"the Service, of a pod's claim":     func() error { return c.ReleaseService(ctx, podIP, web) },
		"a container, of a Service's claim": func() error { return c.Release(ctx, lbIP, "c1") },
	} {
		if err := release(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if n := len(a.deletes()); n != 0 {
		t.Fatalf("%d deletes by releasers that hold nothing", n)
	}
	for _, ip := range []netip.Addr{lbIP, podIP} {
		if _, ok := a.get(t, ip.String()); !ok {
			t.Fatalf("%s: released by someone who does not hold it", ip)
		}
	}
	before, _ := a.get(t, lbIP.String())
	if err := c.ReleaseService(ctx, lbIP, web); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.get(t, lbIP.String()); ok {
		t.Fatal("the Service's release left its claim")
	}
	pre := a.deletes()[0].GetDeleteOptions().Preconditions
	if pre == nil || pre.UID == nil || *pre.UID != before.GetUID() || pre.ResourceVersion == nil || *pre.ResourceVersion != before.GetResourceVersion() {
		t.Fatalf("preconditions %+v, want UID %s and resourceVersion %s", pre, before.GetUID(), before.GetResourceVersion())
	}
	// Missing (released twice, never claimed): fine.
	if err := c.ReleaseService(ctx, lbIP, web); err != nil {
		t.Fatal(err)
	}
	// No UID: any incarnation of that name.
	if err := c.ClaimService(ctx, lbIPv4, "lb", web); err != nil {
		t.Fatal(err)
	}
	if err := c.ReleaseService(ctx, lbIPv4, ServiceRef{Namespace: "shop", Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.get(t, lbIPv4.String()); ok {
		t.Fatal("a release by namespace and name left the claim")
	}
	for _, tc := range []struct {
		ip   netip.Addr
		svc  ServiceRef
		want string
	}{
		{netip.Addr{}, web, "no IP"},
		{lbIP, ServiceRef{Namespace: "shop"}, `service "shop/": namespace and name are required`},
		{lbIP, ServiceRef{Name: "web"}, `service "/web": namespace and name are required`},
	} {
		if err := c.ReleaseService(ctx, tc.ip, tc.svc); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReleaseService(%s, %+v): %v, want an error with %q", tc.ip, tc.svc, err, tc.want)
		}
	}
}

// The cache readers: ServiceClaims lists the Services' claims; Node and
// Changed leave them out even for a Claims without a node (the leader's
// may have none); CountByPool and Taken count them.
func TestServiceClaimsInTheCache(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	leader := New(kubeclient.NewFactory(), a, "", quiet())
	nodeA := New(kubeclient.NewFactory(), a, "node-a", quiet())
	start(t, a, leader)
	start(t, a, nodeA)
	for _, cl := range []Claim{
		svcClaim("2001:db8:1b::2", "lb", api),
		svcClaim("203.0.113.128", "lb", web),
		svcClaim("2001:db8:1b::1", "lb", web),
		claim("2001:db8:100::1", v1alpha1.UsePod, "shared", pod("ns", "a1"), "node-a", "ca1"),
		claim("198.51.100.1", v1alpha1.UseAddresses, "lb", pod("ns", "a1"), "node-a", "ca1"),
	} {
		if err := New(kubeclient.NewFactory(), a, cl.Node, quiet()).Claim(ctx, cl); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "the caches hold 5 claims", func() bool { return len(leader.all()) == 5 && len(nodeA.all()) == 5 })
	for _, c := range []*Claims{leader, nodeA} {
		var got []string
		for _, cl := range c.ServiceClaims() {
			if cl.Use != v1alpha1.UseLoadBalancer || cl.Created.IsZero() {
				t.Errorf("ServiceClaims: %+v", cl)
			}
			got = append(got, cl.IP.String()+"="+cl.Service.String())
		}
		if want := "203.0.113.128=shop/web 2001:db8:1b::1=shop/web 2001:db8:1b::2=shop/api"; strings.Join(got, " ") != want {
			t.Errorf("ServiceClaims() = %v, want %s", got, want)
		}
		var pods []string
		for _, cl := range c.PodClaims() {
			pods = append(pods, cl.IP.String()+"="+cl.Pod.String())
		}
		if want := "198.51.100.1=ns/a1 2001:db8:100::1=ns/a1"; strings.Join(pods, " ") != want {
			t.Errorf("PodClaims() = %v, want %s", pods, want)
		}
		if got := c.CountByPool(); !reflect.DeepEqual(got, map[string]int{"lb": 4, "shared": 1}) {
			t.Errorf("CountByPool() = %v, want lb 4 (3 Services' and a pod's), shared 1", got)
		}
		if h, ok := c.Taken(lbIP); !ok || !reflect.DeepEqual(h.Service, &web) {
			t.Errorf("Taken(%s) = %+v, %v", lbIP, h, ok)
		}
	}
	if got := leader.Node(); len(got) != 0 {
		t.Errorf("Node() of a Claims without a node = %+v, want nothing (a Service's claim is no node's)", got)
	}
	if got := nodeA.Node(); len(got) != 2 || got[0].Service != nil || got[1].Service != nil {
		t.Errorf("Node() = %+v, want node-a's 2 pod claims", got)
	}
	// Deleting a Service's claim is no node's change.
	if err := leader.ReleaseService(ctx, lbIP, web); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the release reaches the cache", func() bool { return len(leader.ServiceClaims()) == 2 })
	select {
	case <-leader.Changed():
		t.Fatal("Changed fired for a Service's claim")
	default:
	}
	if err := a.Resource(GVR).Delete(ctx, ClaimName(netip.MustParseAddr("2001:db8:1b::2")), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the delete reaches the cache", func() bool { return len(leader.ServiceClaims()) == 1 })
	select {
	case <-leader.Changed():
		t.Fatal("Changed fired for a Service's claim")
	default:
	}
}

// check: a Service's claim has a Service with namespace and name and no
// pod, container or node; a pod's claim has no Service. Each error names
// the field and its value.
func TestClaimServiceRejectsBadInput(t *testing.T) {
	c := New(kubeclient.NewFactory(), newFakeAPI(), "node-a", quiet())
	good := svcClaim("2001:db8:1b::1", "lb", web)
	for name, tc := range map[string]struct {
		mutate func(*Claim)
		want   string
	}{
		"no service":      {func(c *Claim) { c.Service = nil }, `address claim 2001:db8:1b::1: use "loadBalancer": no service`},
		"no service name": {func(c *Claim) { c.Service = &ServiceRef{Namespace: "shop"} }, `address claim 2001:db8:1b::1: service "shop/": namespace and name are required`},
		"no service ns":   {func(c *Claim) { c.Service = &ServiceRef{Name: "web"} }, `address claim 2001:db8:1b::1: service "/web": namespace and name are required`},
		"a pod":           {func(c *Claim) { c.Pod = pod("ns", "x") }, `address claim 2001:db8:1b::1 for Service shop/web: pod "ns/x": a Service's claim names no pod`},
		"a pod UID only":  {func(c *Claim) { c.Pod.UID = "u" }, `pod "/": a Service's claim names no pod`},
		"a container":     {func(c *Claim) { c.ContainerID = "c1" }, `address claim 2001:db8:1b::1 for Service shop/web: container ID "c1": a Service's claim names no container`},
		"a node":          {func(c *Claim) { c.Node = "node-b" }, `address claim 2001:db8:1b::1 for Service shop/web: node "node-b": a Service's claim names no node`},
		"sharers":         {func(c *Claim) { c.SharingKey, c.Sharers = "k", []ServiceRef{api} }, `a Service joins a shared claim by claiming it under its key`},
		"a pod's claim with a sharing key": {func(c *Claim) {
			*c = claim("2001:db8:1b::1", v1alpha1.UsePod, "p", pod("ns", "x"), "", "c1")
			c.SharingKey = "k"
		}, `address claim 2001:db8:1b::1 for pod ns/x: sharing key "k": a pod's claim is never shared`},
		"no IP":               {func(c *Claim) { c.IP = netip.Addr{} }, "no IP"},
		"zone":                {func(c *Claim) { c.IP = netip.MustParseAddr("fe80::1%eth0") }, "zone"},
		"externalIP":          {func(c *Claim) { c.Use = v1alpha1.UseExternalIP }, `use "externalIP": want "pod", "addresses" or "loadBalancer"`},
		"a pod's use, no pod": {func(c *Claim) { c.Use = v1alpha1.UseAddresses }, `service "shop/web": a claim of use "addresses" is a pod's, not a Service's`},
		"a pod's claim with a Service": {func(c *Claim) {
			*c = claim("2001:db8:1b::1", v1alpha1.UsePod, "p", pod("ns", "x"), "", "c1")
			c.Service = &web
		}, `address claim 2001:db8:1b::1 for pod ns/x: service "shop/web": a claim of use "pod" is a pod's, not a Service's`},
	} {
		t.Run(name, func(t *testing.T) {
			cl := good
			tc.mutate(&cl)
			err := c.Claim(context.Background(), cl)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Claim: %v, want an error with %q", err, tc.want)
			}
		})
	}
	if err := c.ClaimService(context.Background(), lbIP, "lb", ServiceRef{}); err == nil || !strings.Contains(err.Error(), `service "/"`) {
		t.Fatalf("ClaimService without a Service: %v", err)
	}
}

func TestServiceRefSame(t *testing.T) {
	noUID := ServiceRef{Namespace: "shop", Name: "web"}
	for _, tc := range []struct {
		a, b ServiceRef
		want bool
	}{
		{web, web, true},
		{web, noUID, true},
		{noUID, web, true},
		{noUID, noUID, true},
		{web, ServiceRef{Namespace: "shop", Name: "web", UID: "other"}, false},
		{web, api, false},
		{web, ServiceRef{Namespace: "other", Name: "web", UID: "uid-web"}, false},
		{noUID, ServiceRef{Namespace: "shop", Name: "api"}, false},
	} {
		if got := tc.a.Same(tc.b); got != tc.want {
			t.Errorf("%+v.Same(%+v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestClaimedErrorNamesAService(t *testing.T) {
	for _, tc := range []struct {
		holder Claim
		want   string
	}{
		{Claim{Use: v1alpha1.UseLoadBalancer, Service: &web}, "2001:db8:1b::1 is claimed by Service shop/web (uid uid-web)"},
		{Claim{Use: v1alpha1.UseLoadBalancer, Service: &ServiceRef{Namespace: "shop", Name: "web"}}, "2001:db8:1b::1 is claimed by Service shop/web"},
		{Claim{Use: v1alpha1.UseLoadBalancer}, "2001:db8:1b::1 is claimed by a Service (use loadBalancer, none named)"},
	} {
		if got := (&ClaimedError{IP: lbIP, Holder: tc.holder}).Error(); got != tc.want {
			t.Errorf("error\n got %s\nwant %s", got, tc.want)
		}
	}
}

// ServicesChanged fires when a Service's claim comes or goes, never for a
// pod's (those have Changed, for this node's).
func TestServicesChanged(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	start(t, a, c)
	drain := func() {
		select {
		case <-c.ServicesChanged():
		default:
		}
	}
	drain()
	if err := New(kubeclient.NewFactory(), a, "node-a", quiet()).Claim(ctx, claim("2001:db8:100::1", v1alpha1.UsePod, "shared", pod("ns", "a1"), "node-a", "ca1")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the pod claim cached", func() bool { return len(c.all()) == 1 })
	select {
	case <-c.ServicesChanged():
		t.Error("a pod's claim signalled ServicesChanged")
	default:
	}
	if err := c.ClaimService(ctx, lbIP, "lb", web); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "ServicesChanged after a Service's claim", func() bool {
		select {
		case <-c.ServicesChanged():
			return true
		default:
			return false
		}
	})
	if err := c.ReleaseService(ctx, lbIP, web); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "ServicesChanged after its release", func() bool {
		select {
		case <-c.ServicesChanged():
			return true
		default:
			return false
		}
	})
}

// holdersOf reads the holders of ip's stored claim as "ns/name".
func holdersOf(t *testing.T, a *fakeAPI, ip netip.Addr) (key string, holders []string) {
	t.Helper()
	u, ok := a.get(t, ip.String())
	if !ok {
		return "", nil
	}
	cl, err := ClaimOf(u)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range cl.Holders() {
		holders = append(holders, h.String())
	}
	return cl.SharingKey, holders
}

func updates(a *fakeAPI) int {
	n := 0
	for _, act := range a.Actions() {
		if act.GetVerb() == "update" {
			n++
		}
	}
	return n
}

// A shared LoadBalancer address is one claim held by every sharer: a
// Service joins under the same key (idempotently), anyone else is refused
// naming them all, a holder's key and terms are the claim's, and the claim
// is deleted only with its last holder.
func TestSharedServiceClaim(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "", quiet())
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", web); err != nil {
		t.Fatal(err)
	}
	u, _ := a.get(t, lbIP.String())
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	want := map[string]any{"ip": lbIP.String(), "use": "loadBalancer", "pool": "lb", "sharingKey": "k",
		"service": map[string]any{"namespace": "shop", "name": "web", "uid": "uid-web"}}
	if !reflect.DeepEqual(spec, want) {
		t.Fatalf("spec = %v, want %v", spec, want)
	}
	for range 2 { // the second is a no-op
		if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", api); err != nil {
			t.Fatal(err)
		}
	}
	if n := updates(a); n != 1 {
		t.Errorf("%d updates, want 1 (joining again writes nothing)", n)
	}
	if key, h := holdersOf(t, a, lbIP); key != "k" || strings.Join(h, " ") != "shop/web shop/api" {
		t.Fatalf("claim: key %q holders %v, want k, web then api", key, h)
	}
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", web); err != nil {
		t.Fatalf("a sharer claiming again: %v", err)
	}
	held := `2001:db8:1b::1 is claimed by Service shop/web (uid uid-web), Service shop/api (uid uid-api) (sharing key "k")`
	other := ServiceRef{Namespace: "evil", Name: "x", UID: "uid-x"}
	for name, claim := range map[string]func() error{
		"another key": func() error { return c.ClaimSharedService(ctx, lbIP, "lb", "k2", other) },
		"no key":      func() error { return c.ClaimService(ctx, lbIP, "lb", other) },
		"another incarnation of web": func() error {
			return c.ClaimSharedService(ctx, lbIP, "lb", "k2", ServiceRef{Namespace: "shop", Name: "web", UID: "uid-2"})
		},
		"a pod": func() error {
			return c.Claim(ctx, claim(lbIP.String(), v1alpha1.UseAddresses, "lb", pod("shop", "p"), "node-a", "c1"))
		},
		"a new Service, key of a pod": func() error { return c.ClaimSharedService(ctx, lbIP, "lb", "", other) },
	} {
		var ce *ClaimedError
		if err := claim(); !errors.As(err, &ce) || err.Error() != held {
			t.Errorf("%s: %v, want %s", name, err, held)
		}
	}
	if key, h := holdersOf(t, a, lbIP); key != "k" || strings.Join(h, " ") != "shop/web shop/api" {
		t.Fatalf("after the refusals: key %q holders %v", key, h)
	}
	// A holder's key and terms are the claim's (the assigner lets a
	// sharer change its key only with the others).
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", ServiceRef{Namespace: "shop", Name: "api", UID: "uid-api", Terms: "t2"}); err != nil {
		t.Fatal(err)
	}
	if u, _ := a.get(t, lbIP.String()); func() bool { cl, _ := ClaimOf(u); return cl.Sharers[0].Terms != "t2" }() {
		t.Fatal("the sharer's terms were not recorded")
	}
	// A holder takes another key (or none) only while it holds the
	// address alone: with sharers, the claim would have sharers and no
	// key (which the API refuses) or a key they do not hold it under. A
	// Service of another namespace never joins, whatever its key.
	for _, tc := range []struct {
		key string
		svc ServiceRef
	}{{"k2", web}, {"", web}, {"k", ServiceRef{Namespace: "other", Name: "web", UID: "uid-o"}}} {
		var ce *ClaimedError
		if err := c.ClaimSharedService(ctx, lbIP, "lb", tc.key, tc.svc); !errors.As(err, &ce) {
			t.Fatalf("%s under key %q while shop/api shares it: %v, want refused", tc.svc, tc.key, err)
		}
		if key, h := holdersOf(t, a, lbIP); key != "k" || strings.Join(h, " ") != "shop/web shop/api" {
			t.Fatalf("key %q holders %v after %s claimed under %q", key, h, tc.svc, tc.key)
		}
	}
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", web); err != nil {
		t.Fatal(err)
	}
	// The first holder leaves: the sharer holds it alone, under the key.
	if err := c.ReleaseService(ctx, lbIP, web); err != nil {
		t.Fatal(err)
	}
	if key, h := holdersOf(t, a, lbIP); key != "k" || strings.Join(h, " ") != "shop/api" {
		t.Fatalf("after web left: key %q holders %v", key, h)
	}
	if n := len(a.deletes()); n != 0 {
		t.Fatalf("%d deletes while a sharer holds it", n)
	}
	// Alone, it may drop its key (MetalLB: a sole holder changes it in
	// place).
	api := ServiceRef{Namespace: "shop", Name: "api", UID: "uid-api"}
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "", api); err != nil {
		t.Fatal(err)
	}
	if key, h := holdersOf(t, a, lbIP); key != "" || strings.Join(h, " ") != "shop/api" {
		t.Fatalf("the sole holder dropped its key: key %q holders %v", key, h)
	}
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", api); err != nil {
		t.Fatal(err)
	}
	// A sole holder's new key.
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k3", api); err != nil {
		t.Fatal(err)
	}
	if key, h := holdersOf(t, a, lbIP); key != "k3" || strings.Join(h, " ") != "shop/api" {
		t.Fatalf("after api's new key: key %q holders %v", key, h)
	}
	if err := c.ReleaseService(ctx, lbIP, api); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.get(t, lbIP.String()); ok {
		t.Fatal("the last holder's release left the claim")
	}
}

// A claim written before sharing existed (no sharingKey, no sharers) reads
// as its one Service's and is not shareable until that Service claims it
// under its key.
func TestLegacyServiceClaimShared(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	legacy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": v1alpha1.AddressClaimKind,
		"metadata": map[string]any{"name": ClaimName(lbIP)},
		"spec": map[string]any{"ip": lbIP.String(), "use": "loadBalancer", "pool": "lb",
			"service": map[string]any{"namespace": "shop", "name": "web", "uid": "uid-web"}},
	}}
	if _, err := a.Resource(GVR).Create(ctx, legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	u, _ := a.get(t, lbIP.String())
	cl, err := ClaimOf(u)
	if err != nil || !cl.HeldBy(web) || len(cl.Holders()) != 1 || cl.SharingKey != "" {
		t.Fatalf("ClaimOf(legacy) = %+v, %v", cl, err)
	}
	c := New(kubeclient.NewFactory(), a, "", quiet())
	var ce *ClaimedError
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", api); !errors.As(err, &ce) {
		t.Fatalf("joining a legacy claim: %v, want a ClaimedError", err)
	}
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", web); err != nil {
		t.Fatal(err)
	}
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", api); err != nil {
		t.Fatal(err)
	}
	if key, h := holdersOf(t, a, lbIP); key != "k" || strings.Join(h, " ") != "shop/web shop/api" {
		t.Fatalf("key %q holders %v", key, h)
	}
}

// Joins and leaves that race another writer of the claim (its
// resourceVersion changed between our read and our write) read it again:
// no sharer is lost or resurrected.
func TestSharedServiceClaimRaces(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "", quiet())
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", web); err != nil {
		t.Fatal(err)
	}
	third := ServiceRef{Namespace: "shop", Name: "third", UID: "uid-third"}
	fourth := ServiceRef{Namespace: "shop", Name: "fourth", UID: "uid-fourth"}
	// Before our next update lands, another writer adds a sharer.
	var race *ServiceRef
	a.PrependReactor("update", GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
		if race != nil {
			r := *race
			race = nil
			if err := a.mutate(ClaimName(lbIP), func(cl *Claim) { cl.Sharers = append(cl.Sharers, r) }); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	race = &third
	if err := c.ClaimSharedService(ctx, lbIP, "lb", "k", api); err != nil {
		t.Fatal(err)
	}
	if _, h := holdersOf(t, a, lbIP); strings.Join(h, " ") != "shop/web shop/third shop/api" {
		t.Fatalf("after a racing join: holders %v", h)
	}
	race = &fourth
	if err := c.ReleaseService(ctx, lbIP, web); err != nil {
		t.Fatal(err)
	}
	if _, h := holdersOf(t, a, lbIP); strings.Join(h, " ") != "shop/third shop/api shop/fourth" {
		t.Fatalf("after a racing leave: holders %v", h)
	}
}

// mutate rewrites a stored claim as another writer's update would: the
// same object (UID), a new resourceVersion. Call it only from a reactor
// (under the fake's lock) or with no reactor running.
func (a *fakeAPI) mutate(name string, edit func(*Claim)) error {
	obj, err := a.Tracker().Get(GVR, "", name)
	if err != nil {
		return err
	}
	u := obj.(*unstructured.Unstructured)
	cl, err := ClaimOf(u)
	if err != nil {
		return err
	}
	edit(&cl)
	next, err := object(cl)
	if err != nil {
		return err
	}
	v := u.DeepCopy()
	v.Object["spec"] = next.Object["spec"]
	v.SetResourceVersion(strconv.FormatInt(a.seq.Add(1), 10))
	return a.Tracker().Update(GVR, v, "")
}
