package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// A shared LoadBalancer address goes out on the node for every Service
// whose status carries it and that holds its claim, the sharers as much
// as the first holder (the node's Holder check read one Service per
// claim); a Service that does not hold it, or another incarnation, does
// not, and the reason names the holders.
func TestServiceHolderSharedAddress(t *testing.T) {
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{claims.GVR: v1alpha1.AddressClaimKind + "List"})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	x, solo := netip.MustParseAddr("2001:db8:1b::1"), netip.MustParseAddr("2001:db8:1b::2")
	web := claims.ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web"}
	api := claims.ServiceRef{Namespace: "shop", Name: "api", UID: "uid-api"}
	leader := claims.New(kubeclient.NewFactory(), dyn, "", quiet)
	for _, s := range []claims.ServiceRef{web, api} {
		if err := leader.ClaimSharedService(ctx, x, "lb", "k", s); err != nil {
			t.Fatal(err)
		}
	}
	if err := leader.ClaimService(ctx, solo, "lb", web); err != nil {
		t.Fatal(err)
	}
	f := kubeclient.NewFactory()
	c := claims.New(f, dyn, "node-a", quiet)
	testutil.Run(t, f.Run)
	testutil.WaitFor(t, "the claims cached", func() bool {
		cl, ok := c.Taken(x)
		_, ok2 := c.Taken(solo)
		return ok && ok2 && len(cl.Holders()) == 2
	})
	d := testDaemon(t)
	d.kube = &kubeMode{claims: c}
	o := d.serviceOptions()
	o.Authorize = func(string, netip.Addr, string) error { return nil }
	for _, tc := range []struct {
		ip        netip.Addr
		name, uid string
		held      bool
		by        string
	}{
		{x, "web", "uid-web", true, ""},
		{x, "api", "uid-api", true, ""},
		{x, "api", "", true, ""},
		{x, "api", "uid-api-2", false, "Services shop/web, shop/api"},
		{x, "evil", "uid-evil", false, "Services shop/web, shop/api"},
		{solo, "web", "uid-web", true, ""},
		{solo, "api", "uid-api", false, "Service shop/web"},
		{netip.MustParseAddr("2001:db8:1b::3"), "web", "uid-web", false, ""},
	} {
		if held, by := o.Holder(tc.ip, "shop", tc.name, tc.uid); held != tc.held || by != tc.by {
			t.Errorf("Holder(%s, shop/%s %s) = %v, %q; want %v, %q", tc.ip, tc.name, tc.uid, held, by, tc.held, tc.by)
		}
	}
	// As the node decides it: both sharers advertise the address.
	eps := []*discoveryv1.EndpointSlice{{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: "eps", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv6,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00:10::1"}, NodeName: ptr.To("node1"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true)}}},
	}}
	for _, name := range []string{"web", "api", "evil"} {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("uid-" + name)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(services.Class),
				ClusterIP: "fd00:96::10", ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: x.String()}}}},
		}
		rows := services.ForService(o, s, eps)
		if len(rows) != 1 {
			t.Fatalf("%s: %+v", name, rows)
		}
		want := services.StateAdvertised
		if name == "evil" {
			want = services.StateNotAdvertised
		}
		if rows[0].State != want {
			t.Errorf("%s: %s (%s), want %s", name, rows[0].State, rows[0].Reason, want)
		}
	}
}
