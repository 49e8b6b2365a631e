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
		{"a 401 on the DaemonSet, nothing else known", []runtime.Object{pod(true, "1"), ds("1", false)}, refuse("daemonsets", apierrors.NewUnauthorized("token")), false, "force-deleted"},
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

// What a refusal means is the caller's: the agent, whose uninstall removes
// every pod's network, asks what it saw before the API refused it; a
// container restart under a 403 is then no uninstall. A 401 is a refusal
// too: `kubectl delete -k deploy/` deletes flock's ServiceAccount before
// its DaemonSet, and the pods' tokens die with it.
func TestRefusalIsTheCallers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		resource string
		err      error
	}{
		{"403 on the pod", "pods", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "flock-abc", nil)},
		{"401 on the pod", "pods", apierrors.NewUnauthorized("invalid bearer token")},
		{"403 on the DaemonSet", "daemonsets", apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "flock", nil)},
		{"401 on the DaemonSet", "daemonsets", apierrors.NewUnauthorized("invalid bearer token")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{
				"namespace": "flock-system", "name": "flock-abc", "deletionTimestamp": "2026-11-29T00:00:00Z", "finalizers": []any{"x"},
				"ownerReferences": []any{map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "flock", "uid": "ds-1", "controller": true}},
			}}}
			c := dynfake.NewSimpleDynamicClient(runtime.NewScheme(), pod)
			c.PrependReactor("get", tc.resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.err
			})
			for _, leaving := range []bool{false, true} {
				var asked error
				gone, why := Uninstalling(context.Background(), c, "flock-system", "flock-abc", fakeNamespace{refused: func(err error) (bool, string) {
					asked = err
					return leaving, "the caller's answer"
				}})
				if gone != leaving || asked != tc.err || why != "the caller's answer" {
					t.Errorf("caller says %v: Uninstalling = %v (%s), the caller was asked with %v", leaving, gone, why, asked)
				}
			}
		})
	}
}

// WatchNamespace: a 403 or a 401 means leaving once flock's namespace was
// seen being deleted, not before.
func TestWatchNamespace(t *testing.T) {
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "flock-system"}}}
	c := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{namespacesGVR: "NamespaceList"}, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	forbidden := WatchNamespace(ctx, c, "flock-system").Refused
	refusals := []error{apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "flock-abc", nil), apierrors.NewUnauthorized("invalid bearer token")}
	time.Sleep(200 * time.Millisecond)
	for _, refused := range refusals {
		if gone, why := forbidden(refused); gone {
			t.Errorf("leaving before the namespace was deleted (%v): %s", refused, why)
		}
	}
	ns.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	if _, err := c.Resource(namespacesGVR).Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		gone, why := forbidden(refusals[0])
		if gone && strings.Contains(why, "namespace flock-system is being deleted") {
			if gone, why := forbidden(refusals[1]); !gone {
				t.Errorf("a 401 once the namespace is being deleted: %s", why)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the namespace's deletion was not seen: %s", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type fakeNamespace struct {
	refused  func(error) (bool, string)
	deleting bool
}

func (f fakeNamespace) Refused(err error) (bool, string) { return f.refused(err) }
func (f fakeNamespace) Deleting() bool                   { return f.deleting }
