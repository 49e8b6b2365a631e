package uninstall

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestUninstalling(t *testing.T) {
	ds := func(uid string, deleting bool) runtime.Object {
		o := map[string]any{"namespace": "flock-system", "name": "flock", "uid": "ds-" + uid}
		if deleting {
			o["deletionTimestamp"] = "2026-11-29T00:00:00Z"
			o["finalizers"] = []any{"foregroundDeletion"}
		}
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": o}}
	}
	pod := func(deleting bool, owner string) runtime.Object {
		o := map[string]any{"namespace": "flock-system", "name": "flock-abc"}
		if owner != "" {
			o["ownerReferences"] = []any{map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "flock", "uid": "ds-" + owner, "controller": true}}
		}
		if deleting {
			o["deletionTimestamp"] = "2026-11-29T00:00:00Z"
			o["finalizers"] = []any{"x"}
		}
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": o}}
	}
	refuse := func(resource string, err error) func(*dynfake.FakeDynamicClient) {
		return func(c *dynfake.FakeDynamicClient) {
			c.PrependReactor("get", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, err
			})
		}
	}
	forbid := func(resource string) func(*dynfake.FakeDynamicClient) {
		return refuse(resource, apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "x", nil))
	}
	for _, tc := range []struct {
		name   string
		objs   []runtime.Object
		tweak  func(*dynfake.FakeDynamicClient)
		want   bool
		reason string
	}{
		{"container restart", []runtime.Object{pod(false, "1"), ds("1", false)}, nil, false, "not being deleted"},
		{"rollout", []runtime.Object{pod(true, "1"), ds("1", false)}, nil, false, "stays"},
		{"DaemonSet deleted", []runtime.Object{pod(true, "1")}, nil, true, "is gone"},
		{"DaemonSet being deleted (foreground)", []runtime.Object{pod(true, "1"), ds("1", true)}, nil, true, "being deleted"},
		{"DaemonSet replaced", []runtime.Object{pod(true, "1"), ds("2", false)}, nil, false, "replaced"},
		// A 403 alone is no proof (what it means is the caller's: nil
		// says not leaving; WatchNamespace below).
		{"a 403 on the pod, nothing else known", []runtime.Object{pod(true, "1")}, forbid("pods"), false, "nothing says it is leaving"},
		{"a 403 on the DaemonSet, nothing else known", []runtime.Object{pod(true, "1")}, forbid("daemonsets"), false, "nothing says it is leaving"},
		{"own pod not found", nil, nil, false, "not found"},
		{"no owner left (DaemonSet deleted with --cascade=orphan)", []runtime.Object{pod(true, "")}, nil, true, "no DaemonSet owns it"},
		{"force-deleted pod: its token is refused (401)", []runtime.Object{pod(true, "1"), ds("1", false)}, refuse("pods", apierrors.NewUnauthorized("token")), false, "force-deleted"},
		{"the API server fails", []runtime.Object{pod(true, "1"), ds("1", false)}, refuse("pods", apierrors.NewInternalError(context.DeadlineExceeded)), false, "read pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dynfake.NewSimpleDynamicClient(runtime.NewScheme(), tc.objs...)
			if tc.tweak != nil {
				tc.tweak(c)
			}
			got, reason := Uninstalling(context.Background(), c, "flock-system", "flock-abc", nil)
			if got != tc.want || !strings.Contains(reason, tc.reason) {
				t.Errorf("Uninstalling = %v (%s), want %v (…%s…)", got, reason, tc.want, tc.reason)
			}
		})
	}
}

// What a 403 means is the caller's: the agent, whose uninstall removes
// every pod's network, asks what it saw before the API refused it; a
// container restart under a 403 is then no uninstall.
func TestForbiddenIsTheCallers(t *testing.T) {
	pod := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"namespace": "flock-system", "name": "flock-abc"}}}
	c := dynfake.NewSimpleDynamicClient(runtime.NewScheme(), pod)
	c.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "flock-abc", nil)
	})
	asked := false
	gone, why := Uninstalling(context.Background(), c, "flock-system", "flock-abc", func(err error) (bool, string) {
		asked = apierrors.IsForbidden(err)
		return false, "nothing seen says flock is leaving"
	})
	if gone || !asked || why != "nothing seen says flock is leaving" {
		t.Errorf("Uninstalling = %v (%s), asked %v", gone, why, asked)
	}
}

// WatchNamespace: a 403 means leaving once flock's namespace was seen
// being deleted, not before.
func TestWatchNamespace(t *testing.T) {
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "flock-system"}}}
	c := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{namespacesGVR: "NamespaceList"}, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	forbidden := WatchNamespace(ctx, c, "flock-system")
	refused := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "flock-abc", nil)
	time.Sleep(200 * time.Millisecond)
	if gone, why := forbidden(refused); gone {
		t.Errorf("leaving before the namespace was deleted: %s", why)
	}
	ns.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	if _, err := c.Resource(namespacesGVR).Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		gone, why := forbidden(refused)
		if gone && strings.Contains(why, "namespace flock-system is being deleted") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the namespace's deletion was not seen: %s", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
