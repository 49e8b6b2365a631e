package netpol

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts"
)

// Changes that come while the stored Deps are of an older context (a
// load asked for by a change of it is on its way) wait for that load's
// Deps and are judged against them: a far policy's update or a pod
// elsewhere asks for no load of its own (on a slow machine each did, and
// the policy's kept the Deps stale for the next: loads came back to
// back), while one that changes what this node judges still asks for
// one. A load whose Deps are stale too leaves them waiting; past
// maxWaiting a change asks at once.
func TestChangesWaitForTheLoadOnItsWay(t *testing.T) {
	pods, nss, nps := stores()
	const node = "node-a"
	mk := func(ns, name, nodeName, app, ip string) *trim.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}}}
		p.Spec.NodeName = nodeName
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		return trim.NewPod(p)
	}
	_ = pods.Add(mk("a", "l", node, "l", "fd00:10::1"))
	_ = pods.Add(mk("d", "d1", "node-b", "x", "fd00:30::1"))
	for _, n := range []string{"a", "c", "d"} {
		_ = nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	block := func(cidr string) []networkingv1.NetworkPolicyPeer {
		return []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr}}}
	}
	policy := func(ns, name, app string, from []networkingv1.NetworkPolicyPeer) *networkingv1.NetworkPolicy {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if app != "" {
			np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
		}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: from}}
		return np
	}
	_ = nps.Add(policy("a", "mine", "l", block("fd00:30::/64")))
	_ = nps.Add(policy("d", "judged-in", "x", block("fd00:10::/64")))
	far := policy("c", "far", "", block("2001:db8::/64"))
	_ = nps.Add(far)

	k := newKernelVerdicts(node, trim.NewPodLister(pods), corelisters.NewNamespaceLister(nss), networkinglisters.NewNetworkPolicyLister(nps), nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	indexPods(k, pods)
	k.primeLocal()
	load := func(gen uint64) {
		t.Helper()
		in, err := k.input()
		if err != nil {
			t.Fatal(err)
		}
		prog, deps := verdicts.CompileDeps(in)
		k.stored(prog, deps, gen, k.seq.Load())
	}
	waiting := func() int { k.rmu.Lock(); defer k.rmu.Unlock(); return len(k.waiting) }
	update := func(old, cur *networkingv1.NetworkPolicy) {
		_ = nps.Update(cur)
		k.policyChanged(old, cur)
	}
	addPod := func(p *trim.Pod) {
		_ = pods.Add(p)
		k.podChanged(nil, p)
	}
	type at struct{ gen, seq, pseq, skipped uint64 }
	now := func() at { return at{k.gen.Load(), k.seq.Load(), k.pseq.Load(), k.policySkipped.Load()} }
	load(k.gen.Load())

	// Current Deps: a far policy's update is skipped at once.
	farther := far.DeepCopy()
	farther.Spec.Ingress[0].From = block("2001:db8:1::/64")
	was := now()
	update(far, farther)
	if got := now(); got != (at{was.gen, was.seq, was.pseq, was.skipped + 1}) {
		t.Fatalf("a far policy's update with current Deps: %+v, was %+v; want skipped", got, was)
	}

	// The context changes: a load is on its way.
	k.changed()
	stale := now()
	farthest := farther.DeepCopy()
	farthest.Spec.Ingress[0].From = block("2001:db8:2::/64")
	update(farther, farthest)
	addPod(mk("d", "d2", "node-b", "x", "fd00:30::2"))
	near := farthest.DeepCopy()
	near.Spec.Ingress[0].From = nil // every peer: this node's pod may now reach c's pods
	update(farthest, near)
	if got := now(); got != stale || waiting() != 3 {
		t.Fatalf("changes while the Deps are stale: %+v and %d waiting, was %+v; want nothing asked, 3 waiting", got, waiting(), stale)
	}

	// The load stores Deps of the context now: the far update is skipped,
	// the pod elsewhere patched, the near update asks for a new context.
	load(stale.gen)
	got := now()
	if waiting() != 0 || got.skipped != stale.skipped+1 || got.pseq != stale.pseq+1 || got.gen != stale.gen+1 || got.seq != stale.seq+1 {
		t.Fatalf("after the load: %+v and %d waiting, was %+v; want 1 more skipped, 1 patch, 1 new context, none waiting", got, waiting(), stale)
	}
	if k.done.Load() != stale.seq {
		t.Errorf("the load's done %d, want %d", k.done.Load(), stale.seq)
	}
	k.mu.Lock()
	dirty := k.dirty[netip.MustParseAddr("fd00:30::2")]
	k.mu.Unlock()
	if !dirty {
		t.Error("the pod elsewhere that waited: its address is not to be patched")
	}

	// A load whose Deps are of the context before the near update: the
	// changes since wait on.
	addPod(mk("d", "d3", "node-b", "x", "fd00:30::3"))
	before := now()
	load(stale.gen)
	if got := now(); got != before || waiting() != 1 {
		t.Fatalf("a load with stale Deps: %+v and %d waiting, was %+v; want them waiting", got, waiting(), before)
	}
	load(k.gen.Load())
	if got := now(); waiting() != 0 || got.pseq != before.pseq+1 || got.seq != before.seq {
		t.Fatalf("the load after: %+v and %d waiting, was %+v; want the pod patched", got, waiting(), before)
	}

	// Past maxWaiting, a change asks for a load after the one on its way.
	k.changed()
	for i := range maxWaiting {
		addPod(mk("d", fmt.Sprintf("w%d", i), "node-b", "x", fmt.Sprintf("fd00:31::%x", i+1)))
	}
	before = now()
	addPod(mk("d", "over", "node-b", "x", "fd00:32::1"))
	if got := now(); waiting() != maxWaiting || got.seq != before.seq+1 {
		t.Fatalf("past maxWaiting: %+v and %d waiting, was %+v; want a load asked", got, waiting(), before)
	}
	load(k.gen.Load())
	if waiting() != 0 {
		t.Errorf("%d still waiting after a current load", waiting())
	}
}
