// Package identity derives a pod's workload identity — the app (its top
// stable controller) and the image — which ip-algo embed hashes into the
// address, so every replica of one workload shares a sub-prefix.
package identity

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// App returns the pod's app:
//   - owned by a ReplicaSet whose name ends in "-<pod-template-hash>" (the
//     pod's label, as a Deployment creates it): the ReplicaSet name without
//     that suffix, i.e. the Deployment's name, stable across rollouts;
//   - owned by any other controller (StatefulSet, DaemonSet, Job, a
//     ReplicaSet named by hand, ...): the owner's name;
//   - no controller: the pod's own name.
func App(pod *corev1.Pod) string {
	owner := metav1.GetControllerOf(pod)
	if owner == nil {
		return pod.Name
	}
	if owner.Kind == "ReplicaSet" {
		if hash := pod.Labels["pod-template-hash"]; hash != "" {
			if base, ok := strings.CutSuffix(owner.Name, "-"+hash); ok && base != "" {
				return base
			}
		}
	}
	return owner.Name
}

// Image is the first container's image reference as written in the spec
// (identical for every replica); "" when the pod has no containers, in
// which case the address falls back to hashing the container ID.
func Image(pod *corev1.Pod) string {
	if len(pod.Spec.Containers) == 0 {
		return ""
	}
	return pod.Spec.Containers[0].Image
}
