package identity

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func owned(name, hash string, kind, owner string, controller bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if hash != "" {
		p.Labels["pod-template-hash"] = hash
	}
	if kind != "" {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: owner, Controller: &controller}}
	}
	return p
}

func TestApp(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"deployment replica", owned("web-7d9f8c6b5-x2x7q", "7d9f8c6b5", "ReplicaSet", "web-7d9f8c6b5", true), "web"},
		{"another replica, same app", owned("web-7d9f8c6b5-abcde", "7d9f8c6b5", "ReplicaSet", "web-7d9f8c6b5", true), "web"},
		{"after a rollout (new hash)", owned("web-5c4b3a2-zzzzz", "5c4b3a2", "ReplicaSet", "web-5c4b3a2", true), "web"},
		{"deployment name with dashes", owned("my-api-v2-66f-q", "66f", "ReplicaSet", "my-api-v2-66f", true), "my-api-v2"},
		{"replicaset named by hand", owned("cache-q1w2e", "", "ReplicaSet", "cache", true), "cache"},
		{"replicaset name not ending in the hash", owned("rs-x", "abc", "ReplicaSet", "custom-rs", true), "custom-rs"},
		{"statefulset", owned("db-0", "", "StatefulSet", "db", true), "db"},
		{"daemonset", owned("agent-x1", "", "DaemonSet", "agent", true), "agent"},
		{"job", owned("migrate-9k2", "", "Job", "migrate", true), "migrate"},
		{"bare pod", owned("debug", "", "", "", false), "debug"},
		{"owner that is not the controller", owned("orphan", "", "ConfigMap", "cm", false), "orphan"},
		{"hash equal to the whole name", owned("x", "abc", "ReplicaSet", "-abc", true), "-abc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := App(tc.pod); got != tc.want {
				t.Errorf("App = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestImage(t *testing.T) {
	p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Image: "registry.example/web:1.2"}, {Image: "sidecar:3"}}}}
	if got := Image(p); got != "registry.example/web:1.2" {
		t.Errorf("Image = %q", got)
	}
	if got := Image(&corev1.Pod{}); got != "" {
		t.Errorf("no containers: %q", got)
	}
}
