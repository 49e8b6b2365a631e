package netpol

import (
	"log/slog"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts"
)

// severalFixture: pod x (app=x) of node-a may send to pods app=web (any
// namespace) on TCP 80; pods d/b and d/c (app=web, node-b) hold the
// anycast IP severalAnycast; d/e (app=other) and d/f, d/g (app=web) exist,
// not holding it. load is load()'s steps in its order (seq, gen, input,
// CompileDeps, stored) without nftables, mid run between the listing and
// the store.
func severalFixture(t *testing.T) (k *kernelVerdicts, extra *modelExtra, load func(mid func()) *verdicts.Program) {
	pods, nss, nps := stores()
	const node = "node-a"
	for _, n := range []string{"a", "d"} {
		_ = nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	mk := func(ns, name, app, nodeName, ip string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}}}
		p.Spec.NodeName = nodeName
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		return p
	}
	for _, p := range []*corev1.Pod{mk("a", "x", "x", node, "fd00:10::1"), mk("d", "b", "web", "node-b", "fd00:20::2"),
		mk("d", "c", "web", "node-b", "fd00:20::3"), mk("d", "e", "other", "node-b", "fd00:20::4"),
		mk("d", "f", "web", "node-c", "fd00:20::5"), mk("d", "g", "web", "node-c", "fd00:20::6")} {
		_ = pods.Add(trim.NewPod(p)) // as the informer's transform caches it
	}
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(80)
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "x-out"}}
	np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
		To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, NamespaceSelector: &metav1.LabelSelector{}}},
	}}
	_ = nps.Add(np)
	extra = &modelExtra{}
	extra.toggle("d/b", severalAnycast)
	extra.toggle("d/c", severalAnycast)
	k = newKernelVerdicts(node, trim.NewPodLister(pods), corelisters.NewNamespaceLister(nss), networkinglisters.NewNetworkPolicyLister(nps), extra, nil, slog.New(slog.DiscardHandler))
	indexPods(k, pods)
	k.primeLocal()
	load = func(mid func()) *verdicts.Program {
		seq, gen := k.seq.Load(), k.gen.Load()
		_, _ = k.takeDirty()
		in, err := k.input()
		if err != nil {
			t.Fatal(err)
		}
		prog, deps := verdicts.CompileDeps(in)
		mid()
		k.stored(prog, deps, gen, seq)
		return prog
	}
	return k, extra, load
}

const severalAnycast = "2001:db8:a::1"

// severalPacket is x → severalAnycast, TCP 80.
var severalPacket = verdicts.Packet{Src: netip.MustParseAddr("fd00:10::1"), Dst: netip.MustParseAddr(severalAnycast), Proto: 6, DstPort: 80}

// An anycast holder change that ClassifyExtra calls Unchanged against the
// stored Deps (compiled from state S0), made while a load is compiling
// state S1 (listed after an earlier change that asked for it), is not
// lost: a load stays pending, or the kernel's program is a compile of the
// cluster now. The load is load()'s steps in its order (gen, seq, input,
// CompileDeps, then k.last/k.deps/k.done), without nftables. (Found by
// review.)
func TestSeveralUnchangedDuringLoadIsNotLost(t *testing.T) {
	k, extra, load := severalFixture(t)
	const anycast = severalAnycast
	pkt := severalPacket

	// S0: the anycast IP held by b and c (app=web): x may send to it.
	p0 := load(func() {})
	if !p0.Allows(pkt) {
		t.Fatalf("S0: x → %s:80 denied", anycast)
	}
	// e1: e (app=other) holds it too: x may not (Group.Several
	// intersects); ClassifyExtra asks for a compile.
	seq := k.seq.Load()
	k.extraChanged(extra.toggle("d/e", anycast))
	if k.seq.Load() == seq {
		t.Fatalf("e1 (a holder read otherwise) asked for no compile")
	}
	// The load for e1 lists S1; while it compiles, e2: e lets go again.
	skipped := k.skipped.Load()
	p1 := load(func() { k.extraChanged(extra.toggle("d/e", anycast)) })
	if k.skipped.Load() > skipped {
		t.Errorf("e2, during a load, was skipped (Unchanged against the Deps the load replaces)")
	}

	in, _ := k.input()
	now := verdicts.Compile(in)
	pending := k.done.Load() < k.seq.Load()
	if !pending && p1.Allows(pkt) != now.Allows(pkt) {
		t.Fatalf("no load pending, but the kernel's program says x → %s TCP 80 allowed=%v, a compile of the cluster now %v",
			anycast, p1.Allows(pkt), now.Allows(pkt))
	}
}

// Anycast replicas alike the others (same namespace, labels and ports)
// that join while a load is asked for or under way ask for no load after
// it: the change waits for that load's Deps and is judged again against
// them, Unchanged. Asking for another load at once
// kept loads back to back under an anycast workload's churn at 1,700
// nodes. A replica read otherwise still asks for one.
func TestSeveralAlikeDuringLoadAsksNoMore(t *testing.T) {
	k, extra, load := severalFixture(t)
	const anycast = severalAnycast
	pkt := severalPacket
	load(func() {})

	// A load is asked for (some other change); f, alike b and c, joins
	// before it lists, and g while it compiles.
	k.recompile()
	k.extraChanged(extra.toggle("d/f", anycast))
	seq := k.seq.Load()
	load(func() { k.extraChanged(extra.toggle("d/g", anycast)) })
	if k.seq.Load() != seq || k.done.Load() != seq {
		t.Errorf("replicas alike the others asked for another load (seq %d → %d, done %d)", seq, k.seq.Load(), k.done.Load())
	}
	if !k.last.Load().Allows(pkt) {
		t.Errorf("x → %s:80 denied with b, c and f (app=web) holding it", anycast)
	}

	// Again, with e (app=other) joining during the load asked for: the
	// rule no longer lets x send to the IP (Group.Several intersects), and
	// the kernel's program must come to say so.
	k.recompile()
	k.extraChanged(extra.toggle("d/e", anycast))
	for range 3 {
		if k.done.Load() == k.seq.Load() {
			break
		}
		load(func() {})
	}
	if k.done.Load() != k.seq.Load() {
		t.Fatal("loads pending after three")
	}
	in, _ := k.input()
	if got, want := k.last.Load().Allows(pkt), verdicts.Compile(in).Allows(pkt); got != want || got {
		t.Errorf("with e (app=other) holding it too: the kernel's program allows x → %s:80 = %v, a compile of now %v (want false)", anycast, got, want)
	}
}

// What waits for a load's Deps is a set of addresses: an anycast
// workload's churn while loads fail (nftables broken) holds one entry an
// address, not one a change. (Found by review.)
func TestRecheckHoldsAnAddressOnce(t *testing.T) {
	k, extra, load := severalFixture(t)
	load(func() {})
	k.recompile() // a load asked for that never stores
	for range 1000 {
		k.extraChanged(extra.toggle("d/f", severalAnycast))
	}
	k.rmu.Lock()
	n := len(k.recheck)
	k.rmu.Unlock()
	if n != 1 {
		t.Fatalf("%d addresses wait for the load after 1,000 changes of one address's holders, want 1", n)
	}
}
