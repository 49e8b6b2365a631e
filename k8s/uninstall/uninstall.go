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
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

var (
	podsGVR       = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	daemonSetsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
)

// Uninstalling decides whether flock is leaving this node, for the pod
// namespace/name that is stopping. Leaving means: the pod is being deleted
// and nothing will replace it: the DaemonSet that owns it (by UID) is gone
// or being deleted, or no DaemonSet owns it any more, or flock's namespace
// is being deleted (the namespace controller deletes the pods first and
// the DaemonSet only once they are gone; a namespace being deleted takes
// no new pod).
//
// A refusal is no answer, and what it means is seen's (nil: not
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
func Uninstalling(ctx context.Context, dyn dynamic.Interface, namespace, name string, seen Namespace) (bool, string) {
	refused := func(err error) (bool, string) {
		if seen != nil {
			return seen.Refused(err)
		}
		if apierrors.IsUnauthorized(err) {
			return false, fmt.Sprintf("pod %s/%s: %v (a force-deleted pod's token, or its ServiceAccount deleted): nothing says flock is leaving", namespace, name, err)
		}
		return false, fmt.Sprintf("the API refuses flock (%v): nothing says it is leaving", err)
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
		case seen != nil && seen.Deleting():
			// This pod still exists: its namespace cannot have been
			// made again since it was seen being deleted.
			return true, fmt.Sprintf("namespace %s is being deleted: DaemonSet %s goes once its pods are gone", namespace, ref.Name)
		}
		return false, fmt.Sprintf("DaemonSet %s/%s stays (a rollout or an eviction)", namespace, ref.Name)
	}
	return true, "the pod is being deleted and no DaemonSet owns it: nothing will replace it"
}

var namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// Namespace is what a stopping pod knows of flock's namespace
// (WatchNamespace).
type Namespace interface {
	// Refused tells what a refusal (403, 401) means.
	Refused(err error) (leaving bool, why string)
	// Deleting tells whether the namespace was seen being deleted.
	Deleting() bool
}

// WatchNamespace follows namespace ns until ctx ends. A refusal then
// means leaving if ns was seen being deleted, as `kubectl delete -k
// deploy/` deletes flock's namespace before its ServiceAccount and RBAC
// (the watch, started while the API still let it, keeps what it saw). A
// 401 needs more: that the view is still current, no list or watch of the
// namespace having failed since the informer last delivered it. A 401 is
// also what a force-deleted pod's token gets, and a view gone stale may
// hold a namespace deleted since and made again by a new install: leaving
// then would take the new install's network away. A 403 needs no more:
// the token was accepted, so this pod and its ServiceAccount still exist,
// and so does the namespace it was seen in.
func WatchNamespace(ctx context.Context, dyn dynamic.Interface, ns string) Namespace {
	sel := fields.OneTermEqualSelector("metadata.name", ns).String()
	w := &watchedNamespace{name: ns, inf: kubeclient.NewDynamicInformer(dyn, namespacesGVR, func(o *metav1.ListOptions) { o.FieldSelector = sel })}
	_ = w.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		w.mu.Lock()
		w.stale = true
		w.mu.Unlock()
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	_, _ = w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj) },
		UpdateFunc: func(_, obj any) { w.observe(obj) }, // a relist's too
	})
	go w.inf.RunWithContext(ctx)
	return w
}

type watchedNamespace struct {
	name string
	inf  cache.SharedIndexInformer

	mu sync.Mutex
	// deleting: the namespace was seen being deleted; stale: a list or
	// watch of it failed after the informer last delivered it.
	deleting, stale bool
}

func (w *watchedNamespace) observe(obj any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stale = false
	if u, ok := obj.(*unstructured.Unstructured); ok && u.GetDeletionTimestamp() != nil {
		w.deleting = true
	}
}

func (w *watchedNamespace) Deleting() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deleting
}

func (w *watchedNamespace) Refused(err error) (bool, string) {
	w.mu.Lock()
	deleting, stale := w.deleting, w.stale
	w.mu.Unlock()
	switch {
	case !deleting:
		return false, fmt.Sprintf("the API refuses flock (%v), but namespace %s was not seen being deleted: a restart", err, w.name)
	case stale && apierrors.IsUnauthorized(err):
		return false, fmt.Sprintf("the API refuses flock's token (%v); namespace %s was seen being deleted, but its watch failed since: it may have been made again (a new install): a restart", err, w.name)
	}
	if obj, ok, _ := w.inf.GetStore().GetByKey(w.name); !ok {
		return false, fmt.Sprintf("the API refuses flock (%v); namespace %s was deleted: a restart", err, w.name)
	} else if u, isU := obj.(*unstructured.Unstructured); !isU || u.GetDeletionTimestamp() == nil {
		return false, fmt.Sprintf("the API refuses flock (%v); namespace %s is not being deleted now: a restart", err, w.name)
	}
	return true, fmt.Sprintf("namespace %s is being deleted, and the API refuses flock (its ServiceAccount or RBAC went with it): %v", w.name, err)
}
