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
	c.PrependWatchReactor("namespaces", func(k8stesting.Action) (bool, watch.Interface, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewUnauthorized("invalid bearer token")
		}
		return true, fw, nil
	})
	c.PrependReactor("list", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewUnauthorized("invalid bearer token")
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := WatchNamespace(ctx, c, "flock-system")
	time.Sleep(200 * time.Millisecond)
	term := ns.DeepCopy()
	term.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	term.SetResourceVersion("2")
	fw.Modify(term)
	waitLeaving(t, seen.Refused)
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
