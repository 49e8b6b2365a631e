package pods

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

type recorder struct {
	mu    sync.Mutex
	ready map[string]bool
	gone  []string
}

func (r *recorder) PodReady(id podmeta.ID, ready bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ready[id.String()] = ready
}

func (r *recorder) PodGone(id podmeta.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gone = append(r.gone, id.String())
}

func (r *recorder) get(k string) (bool, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.ready[k]
	return v, ok
}

// podsOf is the typed fake's pod API in the shape New takes.
func podsOf(cs *fake.Clientset) func(string) Client {
	return func(ns string) Client { return fakePods{cs.CoreV1().Pods(ns)} }
}

// fakePods is the fake's pod client, saying what the fake clientset says:
// it cannot stream a list through a watch (WatchList).
type fakePods struct{ Client }

func (fakePods) IsWatchListSemanticsUnSupported() bool { return true }

func pod(name, node string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	ctrl := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "shop", UID: types.UID("uid-" + name),
			Annotations:     map[string]string{"flock.fritzlab.net/ipv4": "false"},
			Labels:          map[string]string{"pod-template-hash": "abc12"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-abc12", Controller: &ctrl}},
		},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Image: "registry.example/web:1"}}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// run runs s until the test ends and waits for it to list and to watch
// (the fake drops events between its list and its watch).
func run(t *testing.T, s *Source, cs *fake.Clientset) context.Context {
	t.Helper()
	ctx := testutil.RunInformer(t, s.informer)
	testutil.WaitWatching(t, cs, "pods")
	return ctx
}

func TestLookupReadinessAndDeletion(t *testing.T) {
	cs := fake.NewClientset(pod("web-abc12-x", "vm", false))
	rec := &recorder{ready: map[string]bool{}}
	s := New(kubeclient.NewFactory(), podsOf(cs), "vm", rec)
	s.Wait = 300 * time.Millisecond
	ctx := run(t, s, cs)
	args := podmeta.Args{podmeta.ArgNamespace: "shop", podmeta.ArgName: "web-abc12-x", podmeta.ArgUID: "uid-web-abc12-x"}
	p, err := s.Lookup(ctx, args)
	if err != nil {
		t.Fatal(err)
	}
	if p.App != "web" || p.Image != "registry.example/web:1" || p.Annotations["flock.fritzlab.net/ipv4"] != "false" || p.UID != "uid-web-abc12-x" {
		t.Errorf("lookup: %+v", p)
	}
	testutil.WaitFor(t, "the initial readiness report", func() bool { _, ok := rec.get("shop/web-abc12-x"); return ok })

	// Ready transition reported.
	up := pod("web-abc12-x", "vm", true)
	if _, err := cs.CoreV1().Pods("shop").UpdateStatus(ctx, up, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "Ready=true", func() bool { v, _ := rec.get("shop/web-abc12-x"); return v })

	// A UID the API does not have: not found, after the bounded wait.
	args[podmeta.ArgUID] = "another"
	if _, err := s.Lookup(ctx, args); !errors.Is(err, ErrNotFound) {
		t.Errorf("stale UID: want ErrNotFound, got %v", err)
	}
	// A pod created a moment after the ADD started is found, in the cache:
	// the sleep makes it late, and Wait is long enough for any load.
	s.Wait = testutil.Timeout
	gets := podGets(cs)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = cs.CoreV1().Pods("shop").Create(ctx, pod("late", "vm", false), metav1.CreateOptions{})
	}()
	if _, err := s.Lookup(ctx, podmeta.Args{podmeta.ArgNamespace: "shop", podmeta.ArgName: "late"}); err != nil {
		t.Errorf("late pod: %v", err)
	}
	if n := podGets(cs) - gets; n != 0 {
		t.Errorf("late pod: %d API GETs, want it found in the cache", n)
	}
	// Missing CNI_ARGS.
	var me *podmeta.MissingArgError
	if _, err := s.Lookup(ctx, podmeta.Args{podmeta.ArgNamespace: "shop"}); !errors.As(err, &me) {
		t.Errorf("missing name: %v", err)
	}

	if ok, err := s.Exists(ctx, podmeta.ID{Namespace: "shop", Name: "web-abc12-x", UID: "uid-web-abc12-x"}); !ok || err != nil {
		t.Errorf("Exists: %v %v", ok, err)
	}
	if ok, _ := s.Exists(ctx, podmeta.ID{Namespace: "shop", Name: "web-abc12-x", UID: "old-uid"}); ok {
		t.Error("Exists with another UID should be false")
	}
	if err := cs.CoreV1().Pods("shop").Delete(ctx, "web-abc12-x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "PodGone", func() bool { rec.mu.Lock(); defer rec.mu.Unlock(); return len(rec.gone) == 1 })
	if ok, err := s.Exists(ctx, podmeta.ID{Namespace: "shop", Name: "web-abc12-x"}); ok || err != nil {
		t.Errorf("Exists after delete: %v %v", ok, err)
	}
}

// mirror is the API's mirror pod of a static pod whose UID (the one the
// runtime passes in K8S_POD_UID) is staticUID.
func mirror(name, node, staticUID string) *corev1.Pod {
	p := pod(name, node, true)
	p.UID = "mirror-uid"
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "Node", Name: node}}
	p.Annotations[MirrorAnnotation] = staticUID
	return p
}

func podGets(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

// Defect 12: static pods never got a network. The runtime passes the static
// pod's UID; the mirror pod in the API has another UID and carries the
// static one in kubernetes.io/config.mirror. Both the cache path and the
// API fallback must accept it; the result carries the mirror's UID and the
// static one (what readiness matches on: mirrors come and go).
func TestLookupStaticPodByMirrorAnnotation(t *testing.T) {
	args := podmeta.Args{podmeta.ArgNamespace: "shop", podmeta.ArgName: "etcd-vm", podmeta.ArgUID: "static-uid"}
	check := func(t *testing.T, p podmeta.Pod, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		want := podmeta.ID{Namespace: "shop", Name: "etcd-vm", UID: "mirror-uid", StaticUID: "static-uid"}
		if p.ID != want || p.Annotations["flock.fritzlab.net/ipv4"] != "false" {
			t.Errorf("lookup: %+v, want ID %+v", p, want)
		}
	}

	t.Run("cache", func(t *testing.T) {
		cs := fake.NewClientset(mirror("etcd-vm", "vm", "static-uid"))
		rec := &recorder{ready: map[string]bool{}}
		s := New(kubeclient.NewFactory(), podsOf(cs), "vm", rec)
		s.Wait = 0 // one look at the cache, then the API
		ctx := run(t, s, cs)
		before := podGets(cs)
		p, err := s.Lookup(ctx, args)
		check(t, p, err)
		if n := podGets(cs) - before; n != 0 {
			t.Errorf("answered by %d API GETs, want the cache", n)
		}
	})

	t.Run("API fallback", func(t *testing.T) {
		cs := fake.NewClientset(mirror("etcd-vm", "vm", "static-uid"))
		s := New(kubeclient.NewFactory(), podsOf(cs), "vm", nil) // never run: the cache stays empty
		s.Wait = 0
		p, err := s.Lookup(context.Background(), args)
		check(t, p, err)
		if podGets(cs) != 1 {
			t.Errorf("API GETs: %d, want 1", podGets(cs))
		}
	})

	t.Run("other static pod", func(t *testing.T) {
		cs := fake.NewClientset(mirror("etcd-vm", "vm", "static-uid"))
		s := New(kubeclient.NewFactory(), podsOf(cs), "vm", nil)
		s.Wait = 0
		bad := podmeta.Args{podmeta.ArgNamespace: "shop", podmeta.ArgName: "etcd-vm", podmeta.ArgUID: "older-static-uid"}
		_, err := s.Lookup(context.Background(), bad)
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "older-static-uid") {
			t.Errorf("want ErrNotFound naming the UID, got %v", err)
		}
	})
}

// A deleted mirror pod is re-created by kubelet with a new UID while the
// static pod keeps running: the leak GC must not release its allocation.
func TestExistsMirrorRecreated(t *testing.T) {
	cs := fake.NewClientset(mirror("etcd-vm", "vm", "static-uid"))
	s := New(kubeclient.NewFactory(), podsOf(cs), "vm", nil)
	ctx := context.Background()
	for _, uid := range []string{"mirror-uid", "static-uid", "an-earlier-mirror-uid"} {
		if ok, err := s.Exists(ctx, podmeta.ID{Namespace: "shop", Name: "etcd-vm", UID: uid}); !ok || err != nil {
			t.Errorf("Exists(%s): %v %v", uid, ok, err)
		}
	}
	// Known as a static pod: any mirror of it, and only of it.
	if ok, err := s.Exists(ctx, podmeta.ID{Namespace: "shop", Name: "etcd-vm", UID: "an-earlier-mirror-uid", StaticUID: "static-uid"}); !ok || err != nil {
		t.Errorf("Exists(earlier mirror of the same static pod): %v %v", ok, err)
	}
	if ok, err := s.Exists(ctx, podmeta.ID{Namespace: "shop", Name: "etcd-vm", UID: "an-earlier-mirror-uid", StaticUID: "older-static-uid"}); ok || err != nil {
		t.Errorf("Exists(mirror of a replaced static pod): %v %v", ok, err)
	}
	if ok, err := s.Exists(ctx, podmeta.ID{Namespace: "shop", Name: "gone", UID: "x"}); ok || err != nil {
		t.Errorf("Exists(gone): %v %v", ok, err)
	}
}
