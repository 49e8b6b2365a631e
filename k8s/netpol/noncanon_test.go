package netpol

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// hookedPods is a pod cache that runs after, once, right after a List
// of all its pods (what a trim.PodLister's List of every namespace
// reads): what an informer delivering a pod change while a load compiles
// does. The kernel reads it through trim.NewPodLister(hp).
type hookedPods struct {
	cache.Indexer
	mu    sync.Mutex
	after func()
}

func (h *hookedPods) List() []any {
	out := h.Indexer.List()
	h.mu.Lock()
	f := h.after
	h.after = nil
	h.mu.Unlock()
	if f != nil {
		f()
	}
	return out
}

// A local pod's status IP written non-canonically ("FD00::1"), a remote
// pod R holding "fd00::1": R's relabel is a Recompile (not NewContext);
// P's relabel, delivered while that reload compiles (after its List,
// before its Deps are stored), is skipped with the old Deps. At rest the
// kernel holds a program that is not Compile(objects now).
func TestKernelNonCanonicalLocalIP(t *testing.T) {
	lab := probe.New(t)
	pods, nss, nps := stores()
	mk := func(name, node, app, ip string) *trim.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, Labels: map[string]string{"app": app}}}
		p.Spec.NodeName = node
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		return trim.NewPod(p) // as the informer's transform caches it
	}
	const node = "node-a"
	L, R, P := mk("l", node, "l", "FD00::1"), mk("r", "node-b", "x", "fd00::1"), mk("p", "node-b", "p", "fd00::3")
	for _, p := range []*trim.Pod{L, R, P} {
		_ = pods.Add(p)
	}
	_ = nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	PL := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "pl"}}
	PL.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "l"}}
	PL.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	PR := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "pr"}}
	PR.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "r"}}
	PR.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	PR.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "p"}}}}}}
	_ = nps.Add(PL)
	_ = nps.Add(PR)

	hp := &hookedPods{Indexer: pods}
	k := newKernelVerdicts(node, trim.NewPodLister(hp), corelisters.NewNamespaceLister(nss), networkinglisters.NewNetworkPolicyLister(nps), nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	indexPods(k, pods)
	k.netns = int(lab.NS)
	k.hook.Prelude = false
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	rest := func() {
		deadline := time.Now().Add(10 * time.Second)
		for k.last.Load() == nil || k.done.Load() < k.seq.Load() {
			if time.Now().After(deadline) {
				t.Fatal("no load")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	rest()

	// The informer: P leaves PR's peers while the reload for R compiles.
	P2 := P.DeepCopyObject().(*trim.Pod)
	P2.Labels = map[string]string{"app": "q"}
	hp.mu.Lock()
	hp.after = func() { _ = pods.Update(P2); k.podChanged(P, P2) }
	hp.mu.Unlock()
	R1 := R.DeepCopyObject().(*trim.Pod)
	R1.Labels = map[string]string{"app": "r"}
	_ = pods.Update(R1)
	k.podChanged(R, R1)
	rest()

	in := verdicts.Input{Node: node}
	in.Pods, _ = trim.NewPodLister(pods).List(labels.Everything())
	in.Namespaces, _ = corelisters.NewNamespaceLister(nss).List(labels.Everything())
	in.Policies, _ = networkinglisters.NewNetworkPolicyLister(nps).List(labels.Everything())
	want := verdicts.Compile(in)
	pk := probe.Packet{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::3"), Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: 80}
	got := lab.Allows(t, pk)
	t.Logf("skipped %d; fd00::1 → fd00::3 tcp/80: kernel %v, Compile(objects now) %v", k.skipped.Load(), got, want.Allows(verdicts.Packet(pk)))
	if got != want.Allows(verdicts.Packet(pk)) {
		t.Errorf("at rest the kernel lets fd00::1 → fd00::3 %v, Compile(objects now) says %v: P's change was skipped with stale Deps", got, want.Allows(verdicts.Packet(pk)))
	}
}
