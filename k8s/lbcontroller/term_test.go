package lbcontroller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/lbassign"
	"code.fritzlab.net/fritzlab/flock/k8s/loadbalancers/elect"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
)

const thisNode = "n1"

type fakeNamespaces struct {
	kubeclient.ListerWatcher[*corev1.NamespaceList]
}

func (fakeNamespaces) IsWatchListSemanticsUnSupported() bool { return true }

// candidate is a Controller over fakes: the typed one has the Services,
// namespaces and the Lease, the dynamic one the AddressPools, NodeConfigs
// and AddressClaims (and takes the Services' status patches to the typed
// one).
type candidate struct {
	cs  *fake.Clientset
	dyn *dynfake.FakeDynamicClient
	c   *Controller
	// failRenew makes this candidate's writes of the Lease fail (it loses
	// it, and cannot take it again).
	failRenew atomic.Bool
}

func newCandidate(t *testing.T, objs ...runtime.Object) *candidate {
	t.Helper()
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "AddressPool",
		"metadata": map[string]any{"name": "lb", "resourceVersion": "1"},
		"spec": map[string]any{"cidrs": []any{"2001:db8:1b::100/124"}, "use": []any{"loadBalancer"},
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"team": "shop"}}},
	}}
	nc := func(name string, defaultClass bool) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "NodeConfig",
			"metadata": map[string]any{"name": name, "generation": int64(1)},
			"spec": map[string]any{"asn": int64(65001), "routerID": "192.0.2.1",
				"services": map[string]any{"defaultLoadBalancerClass": defaultClass}},
		}}
	}
	k := &candidate{
		cs:  fake.NewClientset(append([]runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "shop"}}}}, objs...)...),
		dyn: claimsAPI(pool, nc(thisNode, true), nc("other", false)),
	}
	k.dyn.PrependReactor("patch", "services", func(act clienttesting.Action) (bool, runtime.Object, error) {
		p := act.(clienttesting.PatchAction)
		var patch struct {
			Metadata struct{ UID string }
			Status   corev1.ServiceStatus
		}
		if p.GetSubresource() != "status" {
			return true, nil, fmt.Errorf("patch of %v %q", p.GetResource(), p.GetSubresource())
		}
		if err := json.Unmarshal(p.GetPatch(), &patch); err != nil {
			return true, nil, err
		}
		svc, err := k.cs.CoreV1().Services(p.GetNamespace()).Get(context.Background(), p.GetName(), metav1.GetOptions{})
		if err != nil {
			return true, nil, err
		}
		if string(svc.UID) != patch.Metadata.UID {
			return true, nil, fmt.Errorf("uid %s, patch for %s", svc.UID, patch.Metadata.UID)
		}
		svc.Status.LoadBalancer = patch.Status.LoadBalancer
		_, err = k.cs.CoreV1().Services(p.GetNamespace()).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{})
		return true, nil, err
	})
	k.cs.PrependReactor("update", "leases", func(act clienttesting.Action) (bool, runtime.Object, error) {
		l := act.(clienttesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if k.failRenew.Load() && ptr.Deref(l.Spec.HolderIdentity, "") == thisNode {
			return true, nil, errors.New("injected: the API server does not answer " + thisNode)
		}
		return false, nil, nil
	})
	k.c = newController(clients{
		services: fakeSvcs{k.cs.CoreV1().Services("")}, namespaces: fakeNamespaces{k.cs.CoreV1().Namespaces()},
		dyn: k.dyn, leases: k.cs.CoordinationV1(),
	}, Config{Node: thisNode, Namespace: "flock-system", Log: quietLog(),
		// A long LeaseDuration: only the injected failures end a term.
		LeaseDuration: 30 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond,
		Resync: time.Hour})
	return k
}

// reads counts the lists and watches of each resource but the Lease.
func (k *candidate) reads() map[string]int {
	out := map[string]int{}
	for _, a := range slices.Concat(k.cs.Actions(), k.dyn.Actions()) {
		if (a.GetVerb() == "list" || a.GetVerb() == "watch") && a.GetResource().Resource != "leases" {
			out[a.GetVerb()+" "+a.GetResource().Resource]++
		}
	}
	return out
}

// allRead is every cache of a term read n times.
func allRead(n int) map[string]int {
	out := map[string]int{}
	for _, r := range []string{"services", "namespaces", addresspools.GVR.Resource, nodeconfigs.GVR.Resource, claims.GVR.Resource} {
		out["list "+r], out["watch "+r] = n, n
	}
	return out
}

func (k *candidate) ingress(name string) []string {
	s, err := k.cs.CoreV1().Services("shop").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, i := range s.Status.LoadBalancer.Ingress {
		out = append(out, i.IP)
	}
	return out
}

func (k *candidate) waitIngress(t *testing.T, name string, want ...string) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%s ingress %v", name, want), func() (bool, string) {
		got := k.ingress(name)
		return slices.Equal(got, want), fmt.Sprint(got)
	})
}

// metrics are the Collector's series, "name{labels}" → value.
func (k *candidate) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(k.c.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += fmt.Sprintf("{%s=%s}", l.GetName(), l.GetValue())
			}
			out[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

// A candidate that does not hold the Lease lists and watches nothing but
// the Lease: no Services, AddressPools, namespaces, NodeConfigs or
// AddressClaims. Once it wins, a term fills those caches and assigns;
// once it loses, the term stops and nothing is read; winning again, a new
// term lists everything afresh and assigns what changed meanwhile.
// Before, every candidate filled every cache at start.
func TestCachesOnlyWhileLeading(t *testing.T) {
	now := metav1.NewMicroTime(time.Now())
	held := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "flock-system", Name: elect.LeaseName},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("other"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &now, RenewTime: &now},
	}
	noClass := func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil } // ours by this node's NodeConfig
	bad := func(s *corev1.Service) {
		s.Annotations = map[string]string{lbassign.AnnotationLoadBalancerIPs: "2001:db8:ff::1"} // in no pool
	}
	k := newCandidate(t, held, lbService("web", noClass), lbService("bad", bad))
	_, stop := testutil.Run(t, k.c.Run)

	// Another holds the Lease: this one only competes.
	testutil.Eventually(t, "competing for the Lease", func() (bool, string) {
		n := 0
		for _, a := range k.cs.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "leases" {
				n++
			}
		}
		return n >= 3, fmt.Sprint(n, " gets")
	})
	for _, a := range slices.Concat(k.cs.Actions(), k.dyn.Actions()) {
		if a.GetResource().Resource != "leases" {
			t.Errorf("before leading: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if k.c.Leading() || k.metrics(t)["flock_loadbalancer_leader"] != 0 {
		t.Fatal("leading while another holds the Lease")
	}

	// The holder gives the Lease up: a term.
	held.Spec.HolderIdentity = nil
	if _, err := k.cs.CoordinationV1().Leases("flock-system").Update(context.Background(), held, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "leading", func() (bool, string) { return k.c.Leading(), "" })
	k.waitIngress(t, "web", "2001:db8:1b::100")
	if got, want := k.reads(), allRead(1); !maps.Equal(got, want) {
		t.Errorf("the first term's lists and watches: %v, want %v", got, want)
	}
	testutil.Eventually(t, "the term's metrics", func() (bool, string) {
		m := k.metrics(t)
		return m["flock_loadbalancer_leader"] == 1 && m["flock_loadbalancer_pool_addresses{pool=lb}{state=used}"] == 1 &&
			m["flock_loadbalancer_assignment_failures_total{reason=NotInPool}"] >= 1, fmt.Sprint(m)
	})

	// Lost: the term stops, and nothing is read while this one competes.
	k.failRenew.Store(true)
	testutil.EventuallyWithin(t, 10*time.Second, "the Lease lost", func() (bool, string) { return !k.c.Leading(), "" })
	k.c.mu.Lock()
	current := k.c.current
	k.c.mu.Unlock()
	if current != nil {
		t.Fatal("the term outlived the leadership")
	}
	m := k.metrics(t)
	if m["flock_loadbalancer_leader"] != 0 || m["flock_loadbalancer_pool_addresses{pool=lb}{state=used}"] != 0 ||
		m["flock_loadbalancer_assignment_failures_total{reason=NotInPool}"] < 1 {
		t.Errorf("metrics between terms (the failures go on): %v", m)
	}
	if _, err := k.cs.CoreV1().Services("shop").Create(context.Background(), lbService("api"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Consistently(t, "nothing read between terms", 500*time.Millisecond, func() (bool, string) {
		got := k.reads()
		return !k.c.Leading() && maps.Equal(got, allRead(1)), fmt.Sprint(got)
	})

	// Won again: a new term, with caches of its own.
	k.failRenew.Store(false)
	testutil.EventuallyWithin(t, 10*time.Second, "leading again", func() (bool, string) { return k.c.Leading(), "" })
	k.waitIngress(t, "api", "2001:db8:1b::101")
	if got := k.ingress("web"); !slices.Equal(got, []string{"2001:db8:1b::100"}) {
		t.Errorf("web moved to %v in the new term", got)
	}
	if got, want := k.reads(), allRead(2); !maps.Equal(got, want) {
		t.Errorf("after the second win, lists and watches: %v, want %v", got, want)
	}
	stop()
	if k.c.Leading() {
		t.Error("leading after Run returned")
	}
}

// The term watches this node's NodeConfig alone (readClass reads nothing
// else): its lists and watches carry the field selector
// metadata.name=<node>. Before, every NodeConfig of the cluster was
// cached, and every write to one reached every node.
func TestNodeConfigOfThisNodeOnly(t *testing.T) {
	k := newCandidate(t, lbService("web", func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil }))
	testutil.Run(t, k.c.Run)
	// Unclassed, web is ours by this node's NodeConfig only.
	k.waitIngress(t, "web", "2001:db8:1b::100")
	var got []string
	for _, a := range k.dyn.Actions() {
		if a.GetResource() != nodeconfigs.GVR {
			continue
		}
		switch a := a.(type) {
		case clienttesting.ListAction:
			got = append(got, "list "+a.GetListRestrictions().Fields.String())
		case clienttesting.WatchAction:
			got = append(got, "watch "+a.GetWatchRestrictions().Fields.String())
		default:
			got = append(got, a.GetVerb())
		}
	}
	if want := []string{"list metadata.name=" + thisNode, "watch metadata.name=" + thisNode}; !slices.Equal(got, want) {
		t.Errorf("NodeConfig requests %q, want %q", got, want)
	}
}
