package netpol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
	npav1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	policylisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1alpha1"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// testNS is a new network namespace (probe's, removed when t ends).
func testNS(t *testing.T) netns.NsHandle { return probe.New(t).NS }

// chains lists the chains of table flock-netpol in ns.
func chains(t *testing.T, ns netns.NsHandle) map[string]bool {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, ch := range all {
		if ch.Table.Name == Table {
			out[ch.Name] = true
		}
	}
	return out
}

// testKernel is node-a's kernelVerdicts on empty caches (its pods,
// namespaces and policies), keeping ns's table.
func testKernel(ns netns.NsHandle) (kv *kernelVerdicts, pods, nss, nps cache.Indexer) {
	pods = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	nss = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	nps = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	kv = newKernelVerdicts("node-a", trim.NewPodLister(pods), corelisters.NewNamespaceLister(nss), networkinglisters.NewNetworkPolicyLister(nps), nil,
		nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	kv.netns = int(ns)
	return kv, pods, nss, nps
}

func setElems(t *testing.T, ns netns.NsHandle, set string) int {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	// The program's sets carry their generation, "<name>-v<gen>"; the
	// previous one stays until the next load.
	sets, err := c.GetSets(&nftables.Table{Name: Table, Family: nftables.TableFamilyINet})
	if err != nil {
		t.Fatal(err)
	}
	var s *nftables.Set
	newest := -1
	for _, x := range sets {
		if g, err := strconv.Atoi(strings.TrimPrefix(x.Name, set+"-v")); err == nil && strings.HasPrefix(x.Name, set+"-v") && g > newest {
			s, newest = x, g
		}
	}
	if s == nil {
		t.Fatalf("no set %s", set)
	}
	e, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	return len(e)
}

// A restarted flock-policy leaves the previous program deciding until
// its caches are synced, then replaces it in one step; each change after
// that loads a new one.
func TestKernelVerdictsReplaceNotRebuild(t *testing.T) {
	ns := testNS(t)
	// What the previous process left: a table with its own chain.
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	tbl := c.AddTable(&nftables.Table{Name: Table, Family: nftables.TableFamilyINet})
	c.AddChain(&nftables.Chain{Name: "previous", Table: tbl})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	nss := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	nps := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	var synced atomic.Bool
	kv := newKernelVerdicts("node-a", trim.NewPodLister(pods), corelisters.NewNamespaceLister(nss), networkinglisters.NewNetworkPolicyLister(nps), nil,
		[]kubeclient.Synced{{Name: "caches", Synced: synced.Load}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	kv.netns = int(ns)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web", Labels: map[string]string{"app": "web"}}}
	pod.Spec.NodeName = "node-a"
	pod.Status.PodIPs = []corev1.PodIP{{IP: "fd00:10::1"}, {IP: "198.51.100.1"}}
	if err := pods.Add(trim.NewPod(pod)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	time.Sleep(300 * time.Millisecond)
	if got := chains(t, ns); !got["previous"] || got["verdicts"] {
		t.Fatalf("before its caches synced the table changed: chains %v", got)
	}
	synced.Store(true)
	select {
	case <-kv.loaded:
	case <-time.After(10 * time.Second):
		t.Fatal("no program loaded after the caches synced")
	}
	if got := chains(t, ns); got["previous"] || !got["verdicts"] || !got["judge"] {
		t.Fatalf("after the first load: chains %v, want the program's (verdicts, judge) only", got)
	}
	if n := setElems(t, ns, "judged6"); n != 0 {
		t.Fatalf("no policy yet, %d addresses judged", n)
	}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if err := nps.Add(np); err != nil {
		t.Fatal(err)
	}
	kv.changed()
	deadline := time.Now().Add(10 * time.Second)
	for setElems(t, ns, "judged6") != 1 || setElems(t, ns, "judged4") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the policy's pod is not judged: judged6 %d, judged4 %d", setElems(t, ns, "judged6"), setElems(t, ns, "judged4"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Readiness follows the loads: not ready before the first, not ready
// while the latest failed (the previous program decides), ready again
// once one succeeds.
func TestVerdictsReadiness(t *testing.T) {
	ns := testNS(t)
	kv, _, _, _ := testKernel(ns)
	var fail atomic.Bool
	kv.fail = func() error {
		if fail.Load() {
			return errors.New("injected")
		}
		return nil
	}
	v := &Verdicts{}
	if err := v.Err(); err != nil {
		t.Fatalf("not compiling: %v, want ready", err)
	}
	v.kv.Store(kv)
	if err := v.Err(); err == nil || !strings.Contains(err.Error(), "not in the kernel yet") {
		t.Fatalf("before the first load: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, ok func(error) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(v.Err()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: readiness says %v", what, v.Err())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("after the first load", func(err error) bool { return err == nil })
	fail.Store(true)
	kv.changed()
	waitFor("after a failed load", func(err error) bool { return err != nil && strings.Contains(err.Error(), "injected") })
	fail.Store(false)
	waitFor("after a load succeeds again", func(err error) bool { return err == nil })
}

// With the admin policies on, the addresses of the pods they apply to
// are queued to the engine (with the verdict the engine's queue takes on
// this kernel) and follow the policies' changes; the rest is compiled.
func TestKernelVerdictsAdmin(t *testing.T) {
	ns := testNS(t)
	native, err := nftQueueWorks()
	if err != nil {
		t.Fatal(err)
	}
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	nss := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	nps := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	anps := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	banps := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	kv := newKernelVerdicts("node-a", trim.NewPodLister(pods), corelisters.NewNamespaceLister(nss), networkinglisters.NewNetworkPolicyLister(nps), nil,
		nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	kv.netns = int(ns)
	kv.admin = &adminListers{anps: policylisters.NewAdminNetworkPolicyLister(anps), banps: policylisters.NewBaselineAdminNetworkPolicyLister(banps)}
	kv.hook.Queue = networkpolicy.QueueVerdict(networkpolicy.Config{QueueID: 100, QueueCompat: !native, FailOpen: true})
	for _, n := range []string{"a", "b"} {
		if err := nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/metadata.name": n}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range []string{"a", "b"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "web"}}
		pod.Spec.NodeName = "node-b" // another node's: the admin policies apply on every node
		pod.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:10::%d", i+1)}}
		if err := pods.Add(trim.NewPod(pod)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitSet := func(set string, want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			select {
			case <-kv.loaded:
				if n := setElems(t, ns, set); n == want && kv.done.Load() == kv.seq.Load() {
					return
				} else if time.Now().After(deadline) {
					t.Fatalf("set %s holds %d addresses, want %d", set, n, want)
				}
			case <-time.After(10 * time.Millisecond):
				if time.Now().After(deadline) {
					t.Fatal("no program loaded")
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitSet("queued6", 0)
	anp := &npav1alpha1.AdminNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: npav1alpha1.AdminNetworkPolicySpec{
		Subject: npav1alpha1.AdminNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "a"}}}}}
	if err := anps.Add(anp); err != nil {
		t.Fatal(err)
	}
	kv.changed()
	waitSet("queued6", 1)
	banp := &npav1alpha1.BaselineAdminNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: npav1alpha1.BaselineAdminNetworkPolicySpec{
		Subject: npav1alpha1.AdminNetworkPolicySubject{Pods: &npav1alpha1.NamespacedPod{}}}}
	if err := banps.Add(banp); err != nil {
		t.Fatal(err)
	}
	kv.changed()
	waitSet("queued6", 2)
	if err := anps.Delete(anp); err != nil {
		t.Fatal(err)
	}
	if err := banps.Delete(banp); err != nil {
		t.Fatal(err)
	}
	kv.changed()
	waitSet("queued6", 0)
}

// Under a stream of changes, loads (each a whole compile) are paced: the
// next starts no sooner than the last one took after it ended, so at
// most half the time goes to loading; loads keep happening meanwhile,
// and the latest change is loaded once the stream stops.
func TestKernelVerdictsPacedUnderChanges(t *testing.T) {
	ns := testNS(t)
	kv, _, _, _ := testKernel(ns)
	const cost = 40 * time.Millisecond // what each load is made to take
	var loads atomic.Int64
	kv.fail = func() error {
		loads.Add(1)
		time.Sleep(cost)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- kv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-kv.loaded:
	case <-time.After(10 * time.Second):
		t.Fatal("no first load")
	}
	before := loads.Load()
	const stream = 1200 * time.Millisecond
	start := time.Now()
	for time.Since(start) < stream {
		kv.changed()
		time.Sleep(time.Millisecond)
	}
	during := loads.Load() - before
	// Unpaced, loads run back to back: stream/cost of them (30). Paced,
	// at most one per 2×cost (15), plus the one running as it began.
	if limit := int64(stream/(2*cost)) + 2; during > limit {
		t.Errorf("%d loads during %v of changes, each taking %v: want at most %d (half the time)", during, stream, cost, limit)
	}
	if during < 3 {
		t.Errorf("%d loads during %v of changes: a stream of changes starves the loads", during, stream)
	}
	deadline := time.Now().Add(10 * time.Second)
	for kv.done.Load() != kv.seq.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("the latest change (%d) not loaded after the stream stopped (loaded %d)", kv.seq.Load(), kv.done.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
