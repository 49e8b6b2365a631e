package check

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// startServer runs a probe server on a free port of the loopback for t
// and returns its address.
func startServer(t *testing.T) string {
	t.Helper()
	// The listener itself, not its port: a port closed and bound again
	// may be another test's by then.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, func(ctx context.Context) error { return serve(ctx, l) })
	return l.Addr().String()
}

// The probe: a server answers, a closed port is refused, and the outcomes
// survive the termination message's round trip.
func TestProbe(t *testing.T) {
	open := startServer(t)
	closed := "127.0.0.1:1"
	var out []Outcome
	testutil.Eventually(t, "the server to answer", func() (bool, string) {
		out = Connect(context.Background(), []string{open, closed}, Answered, time.Second, 2*time.Second)
		return out[0].OK, out[0].Detail
	})
	if out[1].OK || out[1].Got != Refused {
		t.Errorf("closed port: %+v, want refused, not ok", out[1])
	}
	path := t.TempDir() + "/report"
	if err := WriteOutcomes(path, out); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadOutcomes("not json"); err == nil {
		t.Error("a garbled report parsed")
	}
}

// Missing rights are named, every one, before anything is made.
func TestRightsNamed(t *testing.T) {
	c := fake.NewClientset()
	asked := map[string]bool{}
	c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		ra := r.Spec.ResourceAttributes
		asked[ra.Verb+" "+ra.Resource] = true
		r.Status.Allowed = !(ra.Resource == "pods" && ra.Verb == "create") && ra.Resource != "networkpolicies"
		return true, r, nil
	})
	defer func() {
		// What the cleanup and the leftovers use is asked up front too.
		for _, w := range []string{"get namespaces", "delete namespaces", "patch namespaces", "list addressclaims"} {
			if !asked[w] {
				t.Errorf("the check never asks for %s", w)
			}
		}
	}()
	_, err := Run(context.Background(), Options{Client: c, Dynamic: dynfake.NewSimpleDynamicClient(runtime.NewScheme()), Image: "x"})
	if !errors.Is(err, ErrRights) || !strings.Contains(err.Error(), "create pods in namespace flock-check-") || !strings.Contains(err.Error(), "create networkpolicies.networking.k8s.io") || strings.Contains(err.Error(), "get namespaces") {
		t.Fatalf("Run without rights: %v", err)
	}
	if ns, _ := c.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{}); len(ns.Items) != 0 {
		t.Errorf("namespaces made without the rights: %v", ns.Items)
	}
}

func allowAll(c *fake.Clientset) {
	c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		r.Status.Allowed = true
		return true, r, nil
	})
}

func unstr(gvk schema.GroupVersionKind, name string, spec, status map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": name}}}
	u.SetGroupVersionKind(gvk)
	if spec != nil {
		u.Object["spec"] = spec
	}
	if status != nil {
		u.Object["status"] = status
	}
	return u
}

func dyn(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		nodeConfigs: "NodeConfigList", addressPools: "AddressPoolList", claimsGVR: "AddressClaimList"}, objs...)
}

// A namespace a check cut short left is removed first; no Ready flock pod
// is an error that says where to look; sessions and reconcilers are
// judged from the NodeConfigs' status.
func TestLeftoversAndSessions(t *testing.T) {
	c := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flock-check-old", Labels: map[string]string{Label: "true"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
	allowAll(c)
	_, err := Run(context.Background(), Options{Client: c, Dynamic: dyn(), Image: "x", Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "no Ready flock pod") {
		t.Fatalf("Run with no flock: %v", err)
	}
	if _, err := c.CoreV1().Namespaces().Get(context.Background(), "flock-check-old", metav1.GetOptions{}); err == nil {
		t.Error("the leftover namespace is still there")
	}
	if _, err := c.CoreV1().Namespaces().Get(context.Background(), "other", metav1.GetOptions{}); err != nil {
		t.Errorf("another namespace went: %v", err)
	}

	ncGVK := schema.GroupVersionKind{Group: "flock.fritzlab.net", Version: "v1alpha1", Kind: "NodeConfig"}
	r := &run{o: Options{Dynamic: dyn(
		unstr(ncGVK, "good", nil, map[string]any{"peersEstablished": int64(2), "peersConfigured": int64(2)}),
		unstr(ncGVK, "down", nil, map[string]any{"peersEstablished": int64(1), "peersConfigured": int64(2)}),
		unstr(ncGVK, "failing", nil, map[string]any{"peersEstablished": int64(1), "peersConfigured": int64(1),
			"reconcilers": []any{map[string]any{"target": "kernel", "failing": true, "lastError": "route: no such device"}}}),
	)}}
	r.sessions(context.Background())
	got := map[string]Result{}
	for _, res := range r.results {
		got[strings.TrimPrefix(res.Check, "BGP sessions and routes: ")] = res
	}
	if got["good"].Result != Pass || got["down"].Result != Fail || !strings.Contains(got["down"].Detail, "1 of 2") ||
		got["failing"].Result != Fail || !strings.Contains(got["failing"].Detail, "no such device") || got["down"].Why == "" {
		t.Errorf("session results: %+v", got)
	}
	if !Failed(r.results) || Failed([]Result{{Result: Pass}, {Result: Skip}}) {
		t.Error("Failed")
	}
}

// Only pools whose namespaceSelector selects the check's namespace
// count; the address picked is one no claim holds, IPv6 first, never the
// subnet's own.
func TestPoolsAndFreeAddress(t *testing.T) {
	poolGVK := schema.GroupVersionKind{Group: "flock.fritzlab.net", Version: "v1alpha1", Kind: "AddressPool"}
	claimGVK := schema.GroupVersionKind{Group: "flock.fritzlab.net", Version: "v1alpha1", Kind: "AddressClaim"}
	d := dyn(
		unstr(poolGVK, "for-checks", map[string]any{"cidrs": []any{"203.0.113.0/30", "2001:db8:c::/126"}, "use": []any{"addresses"},
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{Label: "true"}}}, nil),
		unstr(poolGVK, "named", map[string]any{"cidrs": []any{"2001:db8:d::/64"}, "use": []any{"addresses"}, "namespaces": []any{"shop"}}, nil),
		unstr(poolGVK, "lb", map[string]any{"cidrs": []any{"2001:db8:e::/64"}, "use": []any{"loadBalancer"}, "namespaceSelector": map[string]any{}}, nil),
		unstr(claimGVK, "a", map[string]any{"ip": "2001:db8:c::3", "use": "addresses"}, nil),
	)
	r := &run{o: Options{Dynamic: d}, ns: "flock-check-abc"}
	pools, err := r.pools(context.Background(), "addresses")
	if err != nil || len(pools) != 1 || pools[0].name != "for-checks" {
		t.Fatalf("pools = %+v, %v", pools, err)
	}
	if lb, _ := r.pools(context.Background(), "loadBalancer"); len(lb) != 1 {
		t.Errorf("an empty selector selects every namespace: %+v", lb)
	}
	a, err := r.freeAddress(context.Background(), pools)
	if err != nil || a != netip.MustParseAddr("2001:db8:c::2") {
		t.Errorf("freeAddress = %v, %v; want 2001:db8:c::2 (::3 is claimed)", a, err)
	}
	if got := lastAddr(netip.MustParsePrefix("198.51.100.64/26")); got.String() != "198.51.100.127" {
		t.Errorf("lastAddr = %v", got)
	}
}

// Each target has its own time: a target that never answers does not
// fail the one after it.
func TestConnectEachTargetItsTime(t *testing.T) {
	open := startServer(t)
	testutil.Eventually(t, "the server", func() (bool, string) {
		return Connect(context.Background(), []string{open}, Answered, time.Second, time.Second)[0].OK, ""
	})
	out := Connect(context.Background(), []string{"127.0.0.1:1", open}, Answered, time.Second, 2*time.Second)
	if out[0].OK || !out[1].OK {
		t.Errorf("outcomes %+v: want the closed port failed and the server answered", out)
	}
}

// A namespace whose check is alive (another operator's) stays; one whose
// mark is stale, or that has none, goes.
func TestLeftoversSpareARunningCheck(t *testing.T) {
	// The API server's clock: this machine's may be off by anything.
	server := time.Date(2026, 11, 29, 4, 0, 0, 0, time.UTC)
	marked := func(name string, at time.Time) *corev1.Namespace {
		t := metav1.NewTime(at)
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{Label: "true"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl-label", Time: &t}, {Manager: fieldManager, Time: &t}}}}
	}
	c := fake.NewClientset(
		marked("flock-check-running", server.Add(-10*time.Second)),
		marked("flock-check-stale", server.Add(-5*time.Minute)),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flock-check-unmarked", Labels: map[string]string{Label: "true"}}})
	r := &run{o: Options{Client: c, Timeout: 5 * time.Second}}
	if err := r.leftovers(context.Background(), server); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"flock-check-running": true, "flock-check-stale": false, "flock-check-unmarked": false} {
		_, err := c.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
		if (err == nil) != want {
			t.Errorf("%s: there %v, want %v", name, err == nil, want)
		}
	}
}

// Extra IPs come only from pools for checks: an anycast pool every
// namespace may use is production's (its IPs are shared and unclaimed).
func TestExtraIPsOnlyFromCheckPools(t *testing.T) {
	poolGVK := schema.GroupVersionKind{Group: "flock.fritzlab.net", Version: "v1alpha1", Kind: "AddressPool"}
	r := &run{o: Options{Dynamic: dyn(unstr(poolGVK, "everyone", map[string]any{"cidrs": []any{"2001:db8:a::/120"}, "use": []any{"anycast"}, "namespaceSelector": map[string]any{}}, nil))}, ns: "flock-check-abc"}
	if pools, err := r.pools(context.Background(), "anycast"); err != nil || len(pools) != 0 {
		t.Errorf("pools = %+v, %v: want none (every namespace's pool)", pools, err)
	}
}
