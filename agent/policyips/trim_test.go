package policyips

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

// randInputs is a random cluster with every pod field Compute reads set
// (incarnations, static pods' mirrors, anycast asks, nodes, phases, the
// host's network) and the bulk it does not read, with claims and agent
// records that name the pods' incarnations, or stale ones. The inputs
// have no pods: the pods are returned whole, for withPods to give them.
func randInputs(r *rand.Rand) (Inputs, []*corev1.Pod) {
	pick := func(xs []string) string { return xs[r.IntN(len(xs))] }
	in := Inputs{Node: node, Namespaces: map[string]labels.Set{}}
	for _, ns := range nsNames {
		if r.IntN(2) == 0 {
			in.Namespaces[ns] = labels.Set{"anycast": "yes"}
		}
	}
	in.Pools = compilePools([]v1alpha1.AddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "any"}, Spec: v1alpha1.AddressPoolSpec{
		CIDRs: []string{"2001:db8:a::/64", "203.0.113.0/24"}, Use: []string{v1alpha1.UseAnycast},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"anycast": "yes"}}}}})
	agentAnswered := r.IntN(2) == 0
	if agentAnswered {
		in.Local = []admin.Pod{}
	}
	var ps []*corev1.Pod
	for i := range 6 + r.IntN(8) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pick(nsNames), Name: fmt.Sprintf("p%d", i), UID: types.UID(fmt.Sprintf("u%d", i)),
			Labels:      map[string]string{"app": "x"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "then", annotations.Addresses: pick(addrIPs)}},
			Spec: corev1.PodSpec{NodeName: pick(nodes), HostNetwork: r.IntN(8) == 0,
				Containers: []corev1.Container{{Name: "c", Image: "app:1", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}}},
			Status: corev1.PodStatus{Phase: []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodRunning, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed}[r.IntN(6)],
				PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("fd00:10::%x", i+1)}}, HostIP: "192.0.2.1",
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
		if r.IntN(3) == 0 {
			p.Annotations[pods.MirrorAnnotation] = fmt.Sprintf("static-%d", i)
		}
		if r.IntN(2) == 0 {
			p.Annotations[annotations.Anycast] = pick(anyIPs)
		}
		ps = append(ps, p)
		id := pods.ID(p)
		// A claim naming this incarnation (by UID, or a mirror's by its
		// static UID only), or another one.
		if r.IntN(2) == 0 {
			cp := &v1alpha1.ClaimPod{Namespace: p.Namespace, Name: p.Name, UID: pick([]string{id.UID, id.UID, "stale", ""})}
			if id.StaticUID != "" && r.IntN(2) == 0 {
				cp.UID, cp.StaticUID = "old-mirror", id.StaticUID
			}
			in.Claims = append(in.Claims, v1alpha1.AddressClaim{Spec: v1alpha1.AddressClaimSpec{IP: pick(addrIPs), Use: v1alpha1.UseAddresses,
				Node: pick([]string{p.Spec.NodeName, p.Spec.NodeName, "n3"}), Pod: cp}})
		}
		// What this node's agent bound for it (or said it bound, before
		// it went away), for this incarnation or an old one.
		if p.Spec.NodeName == node && r.IntN(3) > 0 {
			rec := admin.Pod{ID: id, Phase: pick([]string{"committed", "committed", "deleting"}), Addresses: []string{pick(addrIPs)}, Anycast: []string{pick(anyIPs)}}
			switch r.IntN(4) {
			case 0:
				rec.UID = "old"
			case 1:
				if id.StaticUID != "" {
					rec.UID = "old-mirror" // the static pod's, through another mirror
				}
			}
			if agentAnswered {
				in.Local = append(in.Local, rec)
			} else {
				in.Stale = append(in.Stale, rec)
			}
		}
	}
	return in, ps
}

// withPods is in with ps, each as f makes it.
func withPods(in Inputs, ps []*corev1.Pod, f func(*corev1.Pod) *trim.Pod) Inputs {
	out := in
	out.Pods = nil
	for _, p := range ps {
		out.Pods = append(out.Pods, f(p))
	}
	return out
}

// whole is p with all a trim.Pod can hold, untrimmed: all its metadata
// (every annotation and label, the managed fields), every container
// whole, with ports or not. Compute reads no field a trim.Pod has no
// room for (it would not compile), so over these it answers as over
// whole pods: the reference the trimmed pods are checked against.
func whole(p *corev1.Pod) *trim.Pod {
	return &trim.Pod{ObjectMeta: *p.ObjectMeta.DeepCopy(),
		Spec:   trim.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork, Containers: slices.Clone(p.Spec.Containers)},
		Status: trim.PodStatus{Phase: p.Status.Phase, PodIPs: slices.Clone(p.Status.PodIPs)}}
}

// TestComputeTrimmed: flock-policy's pod cache holds trimmed pods
// (package trim); Compute over them is Compute over whole ones (whole:
// the pods untrimmed, as far as a trim.Pod can hold them). Dropping any
// field it reads from the trim fails here: the corpus is checked to tell
// each of them apart.
func TestComputeTrimmed(t *testing.T) {
	seed := uint64(1)
	if s := os.Getenv("FLOCK_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("FLOCK_SEED=%d", seed)
	r := rand.New(rand.NewPCG(seed, 0x7472))
	// Each field Compute reads, dropped: the corpus must notice each.
	without := map[string]func(*trim.Pod){
		"uid":                func(p *trim.Pod) { p.UID = "" },
		"mirror annotation":  func(p *trim.Pod) { delete(p.Annotations, pods.MirrorAnnotation) },
		"anycast annotation": func(p *trim.Pod) { delete(p.Annotations, annotations.Anycast) },
		"nodeName":           func(p *trim.Pod) { p.Spec.NodeName = "" },
		"hostNetwork":        func(p *trim.Pod) { p.Spec.HostNetwork = false },
		"phase":              func(p *trim.Pod) { p.Status.Phase = "" },
		"namespace":          func(p *trim.Pod) { p.Namespace = "" },
	}
	noticed := map[string]int{}
	held := 0
	for i := range 500 {
		in, ps := randInputs(r)
		want := Compute(withPods(in, ps, whole))
		held += want.Len()
		got := Compute(withPods(in, ps, trim.NewPod))
		if !got.Equal(want) {
			t.Fatalf("inputs %d (FLOCK_SEED=%d): over trimmed pods %v, over whole ones %v", i, seed, got.byPod, want.byPod)
		}
		for name, drop := range without {
			cut := Compute(withPods(in, ps, func(p *corev1.Pod) *trim.Pod { q := trim.NewPod(p).DeepCopyObject().(*trim.Pod); drop(q); return q }))
			if !cut.Equal(want) {
				noticed[name]++
			}
		}
	}
	t.Logf("extra IPs held: %d; a dropped field changed the answer: %v", held, noticed)
	for name := range without {
		if noticed[name] == 0 {
			t.Errorf("no input tells %s apart: a trim that drops it would pass", name)
		}
	}
}

// kickedOf reports, each call, whether tr was asked to recompute since.
func kickedOf(tr *Tracker) func() bool {
	return func() bool {
		select {
		case <-tr.kick:
			return true
		default:
			return false
		}
	}
}

// The tracker recomputes for a change of what it reads, not for the
// kubelet's status updates (the ones that change only conditions). The
// handler is given pods as the informer's transform (trim.Transform)
// makes them: trim.NewPod of each one.
func TestHandlerIgnoresUpdatesOfNothingRead(t *testing.T) {
	tr := &Tracker{kick: make(chan struct{}, 1)}
	h := tr.Handler()
	kicked := kickedOf(tr)
	old := pod("a", "web", "u1", node, corev1.PodRunning, "2001:db8:a::1")
	old.ResourceVersion = "1"
	old.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	for name, tc := range map[string]struct {
		f    func(*corev1.Pod)
		kick bool
	}{
		"conditions":  {func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, false},
		"annotation":  {func(p *corev1.Pod) { p.Annotations["x"] = "y" }, false},
		"anycast":     {func(p *corev1.Pod) { p.Annotations[annotations.Anycast] = "2001:db8:a::2" }, true},
		"phase":       {func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, true},
		"uid":         {func(p *corev1.Pod) { p.UID = "u2" }, true},
		"hostNetwork": {func(p *corev1.Pod) { p.Spec.HostNetwork = true }, true},
	} {
		cur := old.DeepCopy()
		cur.ResourceVersion = "2"
		tc.f(cur)
		h.OnUpdate(trim.NewPod(old), trim.NewPod(cur))
		if got := kicked(); got != tc.kick {
			t.Errorf("%s: recompute %v, want %v", name, got, tc.kick)
		}
	}
	nsOld := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "1"}}
	nsNew := nsOld.DeepCopy()
	nsNew.ResourceVersion = "2"
	if h.OnUpdate(nsOld, nsNew); kicked() {
		t.Error("a namespace update of nothing read recomputes")
	}
	nsNew.Labels = map[string]string{"anycast": "yes"}
	if h.OnUpdate(nsOld, nsNew); !kicked() {
		t.Error("a namespace label change does not recompute")
	}
	// Claims and pools (unstructured) always recompute; so do adds and
	// deletes.
	if h.OnUpdate(toUnstructured(t, &v1alpha1.AddressClaim{}, v1alpha1.GroupVersion.WithKind("AddressClaim")),
		toUnstructured(t, &v1alpha1.AddressClaim{}, v1alpha1.GroupVersion.WithKind("AddressClaim"))); !kicked() {
		t.Error("a claim update does not recompute")
	}
	if h.OnAdd(trim.NewPod(old), false); !kicked() {
		t.Error("an add does not recompute")
	}
	if h.OnDelete(trim.NewPod(old)); !kicked() {
		t.Error("a delete does not recompute")
	}
}

// Of another node's pods only those that can hold an extra IP recompute:
// one a claim names (as of the claims the last compute read), one asking
// for anycast (or that asked), and any before the first compute.
func TestHandlerSkipsPodsThatHoldNothing(t *testing.T) {
	tr := &Tracker{node: node, kick: make(chan struct{}, 1)}
	h := tr.Handler()
	kicked := kickedOf(tr)
	remote := pod("a", "web", "u1", "n2", corev1.PodRunning, "")
	if h.OnAdd(trim.NewPod(remote), false); !kicked() {
		t.Error("before the first compute, another node's pod does not recompute")
	}
	tr.claimedPods.Store(&map[string]bool{"a/named": true})
	for name, tc := range map[string]struct {
		p    *corev1.Pod
		kick bool
	}{
		"another node's":          {remote, false},
		"another node's, claimed": {pod("a", "named", "u2", "n2", corev1.PodRunning, ""), true},
		"another node's, anycast": {pod("a", "any", "u3", "n2", corev1.PodRunning, "2001:db8:a::1"), true},
		"this node's":             {pod("a", "mine", "u4", node, corev1.PodRunning, ""), true},
	} {
		if h.OnAdd(trim.NewPod(tc.p), false); kicked() != tc.kick {
			t.Errorf("%s: add recomputes %v, want %v", name, !tc.kick, tc.kick)
		}
		cur := tc.p.DeepCopy()
		cur.Status.Phase = corev1.PodSucceeded
		if h.OnUpdate(trim.NewPod(tc.p), trim.NewPod(cur)); kicked() != tc.kick {
			t.Errorf("%s: update recomputes %v, want %v", name, !tc.kick, tc.kick)
		}
		if h.OnDelete(cache.DeletedFinalStateUnknown{Key: "x", Obj: trim.NewPod(cur)}); kicked() != tc.kick {
			t.Errorf("%s: delete (tombstone) recomputes %v, want %v", name, !tc.kick, tc.kick)
		}
	}
	// The annotation dropped: the pod leaves the anycast set, and that
	// change recomputes (its IP goes); later changes do not.
	anyc := pod("b", "any", "u5", "n2", corev1.PodRunning, "2001:db8:a::1")
	h.OnAdd(trim.NewPod(anyc), false)
	kicked()
	if !tr.anycast["b/any"] {
		t.Fatal("a pod asking for anycast is not in the set a compute reads")
	}
	plain := anyc.DeepCopy()
	delete(plain.Annotations, annotations.Anycast)
	h.OnUpdate(trim.NewPod(anyc), trim.NewPod(plain))
	if k := kicked(); !k || tr.anycast["b/any"] {
		t.Errorf("dropping the anycast annotation: recompute %v, still in the set %v", k, tr.anycast["b/any"])
	}
	again := plain.DeepCopy()
	again.Status.Phase = corev1.PodFailed
	if h.OnUpdate(trim.NewPod(plain), trim.NewPod(again)); kicked() {
		t.Error("a change of a pod that no longer asks for anycast recomputes")
	}
}

// trim keeps the anycast annotation under its own copy of the key (k8s
// packages do not import agent ones): it must be the agent's.
func TestTrimKeepsTheAgentsAnycastKey(t *testing.T) {
	if trim.AnycastAnnotation != annotations.Anycast {
		t.Fatalf("trim keeps %q, the agent reads %q", trim.AnycastAnnotation, annotations.Anycast)
	}
}
