package uninstall

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

func namespaceObjs() (ns, pod, ds *unstructured.Unstructured) {
	ns = &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "flock-system"}}}
	pod = &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{
		"namespace": "flock-system", "name": "flock-abc", "deletionTimestamp": "2026-11-29T00:00:00Z", "finalizers": []any{"x"},
		"ownerReferences": []any{map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "flock", "uid": "ds-1", "controller": true}},
	}}}
	ds = &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": map[string]any{"namespace": "flock-system", "name": "flock", "uid": "ds-1"}}}
	return
}

func waitLeaving(t *testing.T, refused func(error) (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if gone, _ := refused(apierrors.NewUnauthorized("x")); gone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the namespace was never seen being deleted")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// refusable makes c's namespace list and watch serve fw until refusal
// returns an error, and that error from then on.
func refusable(c *dynfake.FakeDynamicClient, fw watch.Interface, refusal func() error) {
	c.PrependWatchReactor("namespaces", func(k8stesting.Action) (bool, watch.Interface, error) {
		if err := refusal(); err != nil {
			return true, nil, err
		}
		return true, fw, nil
	})
	c.PrependReactor("list", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
		if err := refusal(); err != nil {
			return true, nil, err
		}
		return false, nil, nil
	})
}

// terminate sends ns's deletion through fw, once the informer watches,
// and waits until seen has it.
func terminate(t *testing.T, fw *watch.RaceFreeFakeWatcher, ns *unstructured.Unstructured, seen Namespace, watching time.Duration) {
	t.Helper()
	time.Sleep(watching)
	term := ns.DeepCopy()
	term.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	term.SetResourceVersion("2")
	fw.Modify(term)
	waitLeaving(t, seen.Refused)
}

// `kubectl delete namespace flock-system`, or `kubectl delete -k deploy/`
// whose SIGTERM reaches the pod before kubectl deleted the RBAC and the
// DaemonSet: the namespace controller (OrderedNamespaceDeletion, GA in
// 1.34) deletes the pods first and the DaemonSet only once they are gone.
// The pod is read (200), it is being deleted, its DaemonSet is there and
// not being deleted; the namespace is known to be Terminating.
func TestTerminatingNamespaceButDaemonSetStillThere(t *testing.T) {
	ns, pod, ds := namespaceObjs()
	ns.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	c := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{namespacesGVR: "NamespaceList"}, ns, pod, ds)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := WatchNamespace(ctx, c, "flock-system")
	waitLeaving(t, seen.Refused)
	if gone, why := Uninstalling(ctx, c, "flock-system", "flock-abc", seen); !gone {
		t.Errorf("flock's namespace is Terminating (nothing will replace the pod), yet: not leaving: %s", why)
	}
}

// The old pod saw its namespace Terminating; its namespace watch then ends
// and every list/watch is refused (401: its ServiceAccount is gone). The
// pod is force-deleted (the namespace was stuck on it), the namespace goes,
// flock is installed again (same namespace name, a new DaemonSet). When
// the kubelet finally stops the old container, its token is refused (401)
// and WatchNamespace still holds the old Terminating namespace.
func TestStaleTerminatingNamespaceAfterReinstall(t *testing.T) {
	ns, _, _ := namespaceObjs()
	c := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{namespacesGVR: "NamespaceList"}, ns)
	fw := watch.NewRaceFreeFake()
	var refuse atomic.Bool
	refusable(c, fw, func() error {
		if refuse.Load() {
			return apierrors.NewUnauthorized("invalid bearer token")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := WatchNamespace(ctx, c, "flock-system")
	terminate(t, fw, ns, seen, 200*time.Millisecond)
	// The ServiceAccount is deleted: the watch ends, every relist is a 401.
	refuse.Store(true) // (set before Stop: the reflector relists after it)
	fw.Stop()
	time.Sleep(200 * time.Millisecond)
	// force-delete, namespace gone, `kubectl apply -k deploy/` again: the
	// API now has a live namespace and a new DaemonSet; the old pod's own
	// Get is a 401 (its pod object is gone).
	c.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewUnauthorized("invalid bearer token")
	})
	if gone, why := Uninstalling(ctx, c, "flock-system", "flock-abc", seen); gone {
		t.Errorf("a force-deleted pod of a flock since reinstalled takes the node's network away: %s", why)
	}
}

// A 403 at the stop after the namespace's watch failed (its re-watch,
// every 5 to 10 minutes, came after kubectl deleted the RBAC) is still an
// uninstall: the token was accepted, so the pod and its namespace exist.
func Test403AfterTheWatchFailedIsAnUninstall(t *testing.T) {
	ns, pod, ds := namespaceObjs()
	c := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{namespacesGVR: "NamespaceList"}, ns, pod, ds)
	fw := watch.NewRaceFreeFake()
	var rbacGone atomic.Bool
	forbidden := func(r string) error { return apierrors.NewForbidden(schema.GroupResource{Resource: r}, "", nil) }
	refusable(c, fw, func() error {
		if rbacGone.Load() {
			return forbidden("namespaces")
		}
		return nil
	})
	c.PrependReactor("get", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if rbacGone.Load() {
			return true, nil, forbidden(a.GetResource().Resource)
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := WatchNamespace(ctx, c, "flock-system")
	terminate(t, fw, ns, seen, 1200*time.Millisecond)
	rbacGone.Store(true)
	fw.Stop() // its timeout ends the watch; the re-watch gets a 403
	w := seen.(*watchedNamespace)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		w.mu.Lock()
		stale := w.stale
		w.mu.Unlock()
		if stale {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the failed re-watch was not seen")
		}
	}
	if gone, why := Uninstalling(ctx, c, "flock-system", "flock-abc", seen); !gone {
		t.Errorf("an uninstall taken as a restart: %s", why)
	}
}

// A view that failed, then listed again and saw the namespace still
// being deleted, is current again: a 401 at the stop is an uninstall.
func TestARecoveredViewIsCurrent(t *testing.T) {
	ns, pod, ds := namespaceObjs()
	ns.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	c := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{namespacesGVR: "NamespaceList"}, ns, pod, ds)
	var lists, watches atomic.Int32
	fw1, fw2 := watch.NewRaceFreeFake(), watch.NewRaceFreeFake()
	c.PrependWatchReactor("namespaces", func(k8stesting.Action) (bool, watch.Interface, error) {
		if watches.Add(1) == 1 {
			return true, fw1, nil
		}
		return true, fw2, nil
	})
	c.PrependReactor("list", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) == 2 {
			return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := WatchNamespace(ctx, c, "flock-system")
	waitLeaving(t, seen.Refused)
	fw1.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired})
	for deadline := time.Now().Add(10 * time.Second); lists.Load() < 3 || watches.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no successful relist")
		}
	}
	time.Sleep(100 * time.Millisecond)
	c.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewUnauthorized("invalid bearer token")
	})
	if gone, why := Uninstalling(ctx, c, "flock-system", "flock-abc", seen); !gone {
		t.Errorf("the view was current again (listed again, being deleted), yet: %s", why)
	}
}
