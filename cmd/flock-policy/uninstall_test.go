package main

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestUninstalling(t *testing.T) {
	yes := true
	now := metav1.Now()
	ds := func(uid string, deleting bool) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "flock-system", Name: "flock", UID: types.UID("ds-" + uid)}}
		if deleting {
			d.DeletionTimestamp = &now
			d.Finalizers = []string{"foregroundDeletion"}
		}
		return d
	}
	pod := func(deleting bool, owner string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "flock-system", Name: "flock-abc"}}
		if owner != "" {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "flock", UID: types.UID("ds-" + owner), Controller: &yes}}
		}
		if deleting {
			p.DeletionTimestamp = &now
			p.Finalizers = []string{"x"}
		}
		return p
	}
	refuse := func(resource string, err error) func(*fake.Clientset) {
		return func(c *fake.Clientset) {
			c.PrependReactor("get", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, err
			})
		}
	}
	forbid := func(resource string) func(*fake.Clientset) {
		return refuse(resource, apierrors.NewForbidden(schema.GroupResource{Resource: resource}, "x", nil))
	}
	for _, tc := range []struct {
		name   string
		objs   []runtime.Object
		tweak  func(*fake.Clientset)
		want   bool
		reason string
	}{
		{"container restart", []runtime.Object{pod(false, "1"), ds("1", false)}, nil, false, "not being deleted"},
		{"rollout", []runtime.Object{pod(true, "1"), ds("1", false)}, nil, false, "stays"},
		{"DaemonSet deleted", []runtime.Object{pod(true, "1")}, nil, true, "is gone"},
		{"DaemonSet being deleted (foreground)", []runtime.Object{pod(true, "1"), ds("1", true)}, nil, true, "being deleted"},
		{"DaemonSet replaced", []runtime.Object{pod(true, "1"), ds("2", false)}, nil, false, "replaced"},
		{"RBAC removed (pods)", []runtime.Object{pod(true, "1")}, forbid("pods"), true, "no access to pod"},
		{"RBAC removed (daemonsets)", []runtime.Object{pod(true, "1")}, forbid("daemonsets"), true, "no access to DaemonSet"},
		{"own pod not found", nil, nil, false, "not found"},
		{"no owner left (DaemonSet deleted with --cascade=orphan)", []runtime.Object{pod(true, "")}, nil, true, "no DaemonSet owns it"},
		{"force-deleted pod: its token is refused (401)", []runtime.Object{pod(true, "1"), ds("1", false)}, refuse("pods", apierrors.NewUnauthorized("token")), false, "force-deleted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(tc.objs...)
			if tc.tweak != nil {
				tc.tweak(c)
			}
			got, reason := uninstalling(context.Background(), c, "flock-system", "flock-abc")
			if got != tc.want || !strings.Contains(reason, tc.reason) {
				t.Errorf("uninstalling = %v (%s), want %v (…%s…)", got, reason, tc.want, tc.reason)
			}
		})
	}
}
