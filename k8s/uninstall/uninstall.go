// Package uninstall tells, as one of flock's DaemonSet pods stops, whether
// flock is leaving the node (being uninstalled) or only restarting (a
// container restart, a rollout, an eviction). What stops cleans up after
// itself only in the first case: the agent takes its routes, veths and
// files away, flock-policy its nftables table. Anything else must leave
// them, so that pods keep forwarding and stay under their policies until
// the next pod of the DaemonSet takes over.
package uninstall

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

var (
	podsGVR       = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	daemonSetsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
)

// Uninstalling decides whether flock is leaving this node, for the pod
// namespace/name that is stopping. Leaving means: the pod is being deleted
// and the DaemonSet that owns it (by UID) is gone or being deleted (or no
// DaemonSet owns it any more: nothing will replace it).
//
// A refusal is no answer, and what it means is refused's (WatchNamespace:
// leaving once flock's namespace was seen being deleted; nil: not
// leaving). `kubectl delete -k deploy/` deletes flock's namespace first,
// then its ServiceAccount and RBAC, then the DaemonSet, so a pod that
// stops then is refused: a 403 once the bindings are gone, a 401 once its
// ServiceAccount is (the API server drops the account's tokens with it,
// up to 10 s later, as long as it caches an authenticated token). Alone,
// neither proves anything: a 403 may be a ClusterRoleBinding replaced
// during a rollout, a 401 a force-deleted pod's token, which dies with the
// pod object. Any other error, or no answer within 5 s, is "not leaving":
// what stays is safe, what is removed by mistake is an outage. The reason
// says which, for the log.
func Uninstalling(ctx context.Context, dyn dynamic.Interface, namespace, name string, refused func(err error) (bool, string)) (bool, string) {
	if refused == nil {
		refused = func(err error) (bool, string) {
			if apierrors.IsUnauthorized(err) {
				return false, fmt.Sprintf("pod %s/%s: %v (a force-deleted pod's token, or its ServiceAccount deleted): nothing says flock is leaving", namespace, name, err)
			}
			return false, fmt.Sprintf("the API refuses flock (%v): nothing says it is leaving", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pod, err := dyn.Resource(podsGVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return refused(err)
	case apierrors.IsNotFound(err):
		return false, fmt.Sprintf("pod %s/%s not found: its owner cannot be told", namespace, name)
	case err != nil:
		return false, fmt.Sprintf("read pod %s/%s: %v", namespace, name, err)
	case pod.GetDeletionTimestamp() == nil:
		return false, "the pod is not being deleted (a container restart)"
	}
	for _, ref := range pod.GetOwnerReferences() {
		if ref.Kind != "DaemonSet" || ref.Controller == nil || !*ref.Controller {
			continue
		}
		ds, err := dyn.Resource(daemonSetsGVR).Namespace(namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, fmt.Sprintf("DaemonSet %s/%s is gone", namespace, ref.Name)
		case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
			return refused(err)
		case err != nil:
			return false, fmt.Sprintf("read DaemonSet %s/%s: %v", namespace, ref.Name, err)
		case ds.GetUID() != ref.UID:
			return false, fmt.Sprintf("DaemonSet %s/%s was replaced: its pod takes over", namespace, ref.Name)
		case ds.GetDeletionTimestamp() != nil:
			return true, fmt.Sprintf("DaemonSet %s/%s is being deleted", namespace, ref.Name)
		}
		return false, fmt.Sprintf("DaemonSet %s/%s stays (a rollout or an eviction)", namespace, ref.Name)
	}
	return true, "the pod is being deleted and no DaemonSet owns it: nothing will replace it"
}

var namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// WatchNamespace follows namespace ns (until ctx ends) and returns what a
// refusal (403 or 401) means to Uninstalling: leaving if ns was seen being
// deleted, as `kubectl delete -k deploy/` deletes flock's namespace before
// its ServiceAccount and RBAC (the watch, started while the API still let
// it, keeps what it saw). A namespace being deleted takes the DaemonSet
// with it and takes no new pod: nothing replaces the one stopping.
func WatchNamespace(ctx context.Context, dyn dynamic.Interface, ns string) func(error) (bool, string) {
	sel := fields.OneTermEqualSelector("metadata.name", ns).String()
	inf := kubeclient.NewDynamicInformer(dyn, namespacesGVR, func(o *metav1.ListOptions) { o.FieldSelector = sel })
	go inf.RunWithContext(ctx)
	return func(err error) (bool, string) {
		if obj, ok, _ := inf.GetStore().GetByKey(ns); ok {
			if u, isU := obj.(*unstructured.Unstructured); isU && u.GetDeletionTimestamp() != nil {
				return true, fmt.Sprintf("namespace %s is being deleted, and the API refuses flock (its ServiceAccount or RBAC went with it): %v", ns, err)
			}
		}
		return false, fmt.Sprintf("the API refuses flock (%v), but namespace %s was not seen being deleted: a restart", err, ns)
	}
}
