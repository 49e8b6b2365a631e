package main

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// uninstalling decides, as flock-policy stops, whether flock is leaving
// this node: only then are the engine's rules removed. Otherwise (a
// container restart, a rollout, an eviction) they stay, so that new
// connections of selected pods wait for the next engine instead of
// passing unchecked. Removed means: this pod is being deleted and the
// DaemonSet that owns it (by UID) is gone or being deleted (or it has no
// DaemonSet owner left: nothing will replace it), or flock's service
// account was refused (403: its RBAC was deleted with it). A 401 tells
// nothing: a force-deleted pod's token dies with the pod object, and a
// rollout's pod may be force-deleted, so the rules stay then. The reason
// says which, for the log.
func uninstalling(ctx context.Context, c kubernetes.Interface, namespace, name string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pod, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		return true, fmt.Sprintf("no access to pod %s/%s any more (flock's RBAC is gone): %v", namespace, name, err)
	case apierrors.IsUnauthorized(err):
		return false, fmt.Sprintf("pod %s/%s: %v (a force-deleted pod's token): the rules stay", namespace, name, err)
	case apierrors.IsNotFound(err):
		return false, fmt.Sprintf("pod %s/%s not found: its owner cannot be told, the rules stay", namespace, name)
	case err != nil:
		return false, fmt.Sprintf("read pod %s/%s: %v; the rules stay", namespace, name, err)
	case pod.DeletionTimestamp == nil:
		return false, "the pod is not being deleted (a container restart)"
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Kind != "DaemonSet" || ref.Controller == nil || !*ref.Controller {
			continue
		}
		ds, err := c.AppsV1().DaemonSets(namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, fmt.Sprintf("DaemonSet %s/%s is gone", namespace, ref.Name)
		case apierrors.IsForbidden(err):
			return true, fmt.Sprintf("no access to DaemonSet %s/%s any more (flock's RBAC is gone): %v", namespace, ref.Name, err)
		case err != nil:
			return false, fmt.Sprintf("read DaemonSet %s/%s: %v; the rules stay", namespace, ref.Name, err)
		case ds.UID != ref.UID:
			return false, fmt.Sprintf("DaemonSet %s/%s was replaced: its pod takes over the rules", namespace, ref.Name)
		case ds.DeletionTimestamp != nil:
			return true, fmt.Sprintf("DaemonSet %s/%s is being deleted", namespace, ref.Name)
		}
		return false, fmt.Sprintf("DaemonSet %s/%s stays (a rollout or an eviction)", namespace, ref.Name)
	}
	return true, "the pod is being deleted and no DaemonSet owns it: nothing will replace it"
}
