package lbcontroller

import (
	"context"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"

	"code.fritzlab.net/fritzlab/flock/k8s/loadbalancers"
)

// The status patch writes ingress with ipMode VIP; Events are recorded on
// the Service once per (reason, message) however often the assigner
// repeats them.
func TestLoadBalancerStatusAndEvents(t *testing.T) {
	svc := &corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}, ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "uid-web"}}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(svc)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{servicesGVR: "ServiceList", eventsGVR: "EventList"}, &unstructured.Unstructured{Object: raw})
	ref := loadbalancers.ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web"}
	ctx := context.Background()
	if err := (apiStatus{dyn}).SetIngress(ctx, ref, []netip.Addr{netip.MustParseAddr("2001:db8:1b::1"), netip.MustParseAddr("203.0.113.128")}); err != nil {
		t.Fatal(err)
	}
	got, err := dyn.Resource(servicesGVR).Namespace("shop").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ing, _, _ := unstructured.NestedSlice(got.Object, "status", "loadBalancer", "ingress")
	if len(ing) != 2 || ing[0].(map[string]any)["ip"] != "2001:db8:1b::1" || ing[0].(map[string]any)["ipMode"] != "VIP" {
		t.Errorf("ingress %v", ing)
	}

	ev := &apiEvents{dyn: dyn, node: "n1"}
	for range 3 {
		ev.Event(ref, true, "Exhausted", "pool lb: no free IPv6 address")
	}
	ev.Event(ref, false, "AddressAssigned", "assigned 2001:db8:1b::1")
	list, err := dyn.Resource(eventsGVR).Namespace("shop").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("%d Events, want 2 (the repeated Warning once)", len(list.Items))
	}
	var e corev1.Event
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[0].Object, &e); err != nil {
		t.Fatal(err)
	}
	if e.InvolvedObject.Kind != "Service" || e.InvolvedObject.Name != "web" || e.InvolvedObject.UID != "uid-web" {
		t.Errorf("Event on %+v", e.InvolvedObject)
	}
}
