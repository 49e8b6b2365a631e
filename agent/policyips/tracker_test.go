package policyips

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

// switchAgent is an agent's admin API that answers its bindings, or waits
// for its NodeConfig (503 through the real handler).
type switchAgent struct {
	admin.Source
	mu      sync.Mutex
	pods    []admin.Pod
	waiting bool
}

func (a *switchAgent) Pods() []admin.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.pods)
}

func (a *switchAgent) NotServing() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.waiting {
		return errors.New("waiting for NodeConfig")
	}
	return nil
}

// trackerWorld is what a tracker reads: pod p in its namespace (as the
// informer caches it, trim.Transform), and no claims or pools yet.
func trackerWorld(p *corev1.Pod) (pods, namespaces cache.Indexer, dyn *dynfake.FakeDynamicClient) {
	pods = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	namespaces = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	_ = pods.Add(trim.NewPod(p))
	_ = namespaces.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace}})
	dyn = dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		claims.GVR: "AddressClaimList", addresspools.GVR: "AddressPoolList"})
	return pods, namespaces, dyn
}

// A pod bound anycast 2001:db8:a::1 at ADD; its annotation asks for ::2
// now (an edit after ADD changes nothing on the node). The agent restarts
// and waits for its NodeConfig, and flock-policy restarts too (a rollout
// replaces both): the bound IP must stay the pod's. Without the bindings
// file a new flock-policy knows only claims and annotations, and ::1 is
// nobody's: traffic to and from it escapes the pod's policies.
func TestTrackerRestartWhileAgentWaits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    func(dir string) string
		covered bool
	}{
		{"bindings kept", func(dir string) string { return filepath.Join(dir, "bindings.json") }, true},
		{"no bindings file", func(string) string { return "" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := tc.file(dir)
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "a", UID: "u1",
				Annotations: map[string]string{annotations.Anycast: "2001:db8:a::2"}},
				Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			podIdx, nsIdx, dyn := trackerWorld(p)
			agent := &switchAgent{pods: []admin.Pod{{ID: pods.ID(p), Phase: "committed", Anycast: []string{"2001:db8:a::1"}}}}
			socket := filepath.Join(dir, "admin.sock")
			l, err := net.Listen("unix", socket)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: admin.Handler(agent)}
			go func() { _ = srv.Serve(l) }()
			t.Cleanup(func() { _ = srv.Close() })

			run := func() (*Tracker, func()) {
				tr := NewTracker(node, dyn, socket, slog.New(slog.NewTextHandler(io.Discard, nil)))
				tr.BindingsFile = file
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					_ = tr.Run(ctx, trim.NewPodLister(podIdx), corelisters.NewNamespaceLister(nsIdx), nil, func(_, _ []string) {})
				}()
				return tr, func() { cancel(); <-done }
			}
			holds := func(tr *Tracker) bool { return slices.Contains(tr.ExtraPodIPs(trim.NewPod(p)), "2001:db8:a::1") }
			waitFor := func(what string, f func() bool) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for !f() {
					if time.Now().After(deadline) {
						t.Fatalf("timed out waiting for %s", what)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}

			tr, stop := run()
			waitFor("the agent's binding", func() bool { return tr.HasSynced() && holds(tr) })
			agent.mu.Lock()
			agent.waiting = true
			agent.mu.Unlock()
			// The same flock-policy keeps what the agent said, file or not.
			time.Sleep(3 * AgentPollInterval)
			if !holds(tr) {
				t.Fatalf("agent waiting: 2001:db8:a::1 dropped (ExtraPodIPs %v)", tr.ExtraPodIPs(trim.NewPod(p)))
			}
			stop()

			tr, stop = run()
			defer stop()
			waitFor("the new tracker's first answer", tr.HasSynced)
			if holds(tr) != tc.covered {
				t.Fatalf("flock-policy restarted while the agent waits: 2001:db8:a::1 covered %v, want %v (ExtraPodIPs %v)", holds(tr), tc.covered, tr.ExtraPodIPs(trim.NewPod(p)))
			}
		})
	}
}

// A bindings file that cannot be used (corrupt, another format, another
// node's) is ignored: the tracker syncs and judges by claims and pools.
func TestTrackerBadBindingsFile(t *testing.T) {
	for name, content := range map[string]string{
		"corrupt":        "{not json",
		"other version":  `{"version": 99, "node": "` + node + `", "pods": [{"namespace": "prod", "name": "a", "uid": "u1", "phase": "committed", "anycast": ["2001:db8:a::1"]}]}`,
		"another node's": `{"version": 1, "node": "elsewhere", "pods": [{"namespace": "prod", "name": "a", "uid": "u1", "phase": "committed", "anycast": ["2001:db8:a::1"]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "bindings.json")
			if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "a", UID: "u1"},
				Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			podIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			_ = podIdx.Add(trim.NewPod(p))
			dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
				claims.GVR: "AddressClaimList", addresspools.GVR: "AddressPoolList"})
			// No agent answers.
			tr := NewTracker(node, dyn, filepath.Join(t.TempDir(), "none.sock"), slog.New(slog.NewTextHandler(io.Discard, nil)))
			tr.BindingsFile = file
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = tr.Run(ctx, trim.NewPodLister(podIdx), corelisters.NewNamespaceLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})), nil, func(_, _ []string) {})
			}()
			defer func() { cancel(); <-done }()
			deadline := time.Now().Add(10 * time.Second)
			for !tr.HasSynced() {
				if time.Now().After(deadline) {
					t.Fatal("the tracker never synced")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := tr.ExtraPodIPs(trim.NewPod(p)); len(got) != 0 {
				t.Fatalf("a %s bindings file was read: %v", name, got)
			}
		})
	}
}

// Another node's pod holds its `addresses` IP by its claim; when the pod
// is replaced (a new incarnation the claim does not name), that pod change
// alone must take the IP away: the handler skips only pods that can hold
// nothing, and a claimed one can.
func TestTrackerFollowsClaimedPodElsewhere(t *testing.T) {
	const ip = "2001:db8:b::9"
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "web", UID: "u1"},
		Spec: corev1.PodSpec{NodeName: "n2"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	podIdx, nsIdx, dyn := trackerWorld(p)
	c := claim(ip, "b", "web", "u1", "n2")
	if _, err := dyn.Resource(claims.GVR).Create(context.Background(), toUnstructured(t, &c, v1alpha1.GroupVersion.WithKind("AddressClaim")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := NewTracker(node, dyn, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := tr.Handler()
	h.OnAdd(trim.NewPod(p), true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tr.Run(ctx, trim.NewPodLister(podIdx), corelisters.NewNamespaceLister(nsIdx), nil, func(_, _ []string) {})
	}()
	defer func() { cancel(); <-done }()
	waitHolders := func(what string, want ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !tr.HasSynced() || !slices.Equal(tr.PodsForIP(ip), want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s held by %v, want %v", what, ip, tr.PodsForIP(ip), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitHolders("claimed", "b/web")
	// A pod of another node that nothing names changes: no recompute is
	// needed, and the answer stands.
	// (The informer caches and hands on pods as trim.Transform makes them.)
	other := trim.NewPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "other", UID: "o1"}, Spec: corev1.PodSpec{NodeName: "n2"}})
	_ = podIdx.Add(other)
	h.OnAdd(other, false)
	next := p.DeepCopy()
	next.UID = "u2"
	_ = podIdx.Update(trim.NewPod(next))
	h.OnUpdate(trim.NewPod(p), trim.NewPod(next))
	waitHolders("the pod replaced")
}
