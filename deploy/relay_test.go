package deploy_test

import (
	"path"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"code.fritzlab.net/fritzlab/flock/deploy/release"
	"code.fritzlab.net/fritzlab/flock/k8s/relay"
)

// The optional component deploy/relay: flock-relay's Deployment and RBAC,
// and the node's token for the relays in the policy container.
const relayComponent = "relay"

// relayTokenFile is flock-policy's default --relay-token-file.
const relayTokenFile = "/var/run/secrets/flock-relay/token"

// TestRelayComponent renders deploy/ with the component: the relays run
// the image's flock-relay with what it reads from its environment, their
// RBAC covers every call the relay makes (and no more than that), the
// policy container finds a token for the relays' audience where
// flock-policy looks, and its ServiceAccount may read the directory.
func TestRelayComponent(t *testing.T) {
	base := kustomizeBuild(t, ".")
	comp := kustomizeBuild(t, withComponentOf(t, relayComponent))
	if len(comp) != len(base)+8 {
		t.Errorf("the component adds %d objects, want 8 (a ServiceAccount, a ClusterRole and its binding, two Roles and their bindings, the Deployment): %q", len(comp)-len(base), ids(comp))
	}

	// The Deployment.
	var dep *appsv1.Deployment
	rules := map[string][]rbacv1.PolicyRule{} // by subject: ServiceAccount name
	roles := map[string][]rbacv1.PolicyRule{}
	for _, o := range comp {
		switch o.kind {
		case "Deployment":
			dep = strict[appsv1.Deployment](t, o.doc)
		case "ClusterRole", "Role":
			r := strict[rbacv1.ClusterRole](t, o.doc)
			roles[o.kind+"/"+o.name] = r.Rules
		}
	}
	for _, o := range comp {
		if o.kind == "ClusterRoleBinding" || o.kind == "RoleBinding" {
			b := strict[rbacv1.ClusterRoleBinding](t, o.doc)
			for _, s := range b.Subjects {
				rules[s.Name] = append(rules[s.Name], roles[b.RoleRef.Kind+"/"+b.RoleRef.Name]...)
			}
		}
	}
	if dep == nil {
		t.Fatal("no Deployment")
	}
	ds := renderedDaemonSet(t, comp)
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Command, []string{"/usr/local/bin/flock-relay"}) || !slices.Contains(release.Binaries, "flock-relay") {
		t.Errorf("command %q (image binaries %q): want the image's flock-relay", c.Command, release.Binaries)
	}
	if c.Image != ds.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("image %s, want the DaemonSet's %s", c.Image, ds.Spec.Template.Spec.Containers[0].Image)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	for k, v := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"} {
		if env[k] != v {
			t.Errorf("env %s from %q, want %s (flock-relay's defaults read it)", k, env[k], v)
		}
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["relay"] != 9479 || ports["relay-metrics"] != 9480 {
		t.Errorf("ports %v, want relay 9479 and relay-metrics 9480 (flock-relay's --listen and --metrics-address)", ports)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.HTTPGet.Port.String() != "relay-metrics" {
		t.Errorf("readiness probe %+v, want /readyz on relay-metrics", c.ReadinessProbe)
	}
	if sa := pod.ServiceAccountName; sa != "flock-relay" {
		t.Errorf("service account %q", sa)
	}

	// What the relay calls, and the directory the nodes read.
	for _, want := range []struct{ sa, group, resource, verb string }{
		{"flock-relay", "", "pods", "list"},
		{"flock-relay", "", "pods", "watch"},
		{"flock-relay", "authentication.k8s.io", "tokenreviews", "create"},
		{"flock-relay", "authorization.k8s.io", "subjectaccessreviews", "create"},
		{"flock-relay", "", "configmaps", "create"},
		{"flock-relay", "", "configmaps", "get"},
		{"flock-relay", "", "configmaps", "patch"},
		{"flock", "", "configmaps", "get"},
	} {
		r := allows(rules[want.sa], want.group, want.resource, want.verb)
		if r == nil {
			t.Errorf("%s may not %s %s", want.sa, want.verb, want.resource)
			continue
		}
		if want.resource == "configmaps" && want.verb != "create" && !slices.Equal(r.ResourceNames, []string{relay.ConfigMapName}) {
			t.Errorf("%s may %s configmaps %q, want only %s", want.sa, want.verb, r.ResourceNames, relay.ConfigMapName)
		}
	}
	if allows(rules["flock"], "", "configmaps", "patch") != nil || allows(rules["flock"], "", "configmaps", "create") != nil {
		t.Error("nodes may write the directory: they would choose what certificate their peers trust")
	}

	// The policy container's token.
	var policy *corev1.Container
	for i := range ds.Spec.Template.Spec.Containers {
		if ds.Spec.Template.Spec.Containers[i].Name == "policy" {
			policy = &ds.Spec.Template.Spec.Containers[i]
		}
	}
	var mount *corev1.VolumeMount
	for i := range policy.VolumeMounts {
		if policy.VolumeMounts[i].MountPath == path.Dir(relayTokenFile) {
			mount = &policy.VolumeMounts[i]
		}
	}
	if mount == nil || !mount.ReadOnly {
		t.Fatalf("the policy container mounts nothing (read-only) at %s: %+v", path.Dir(relayTokenFile), policy.VolumeMounts)
	}
	var found bool
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name != mount.Name || v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil && s.ServiceAccountToken.Audience == relay.Audience && s.ServiceAccountToken.Path == path.Base(relayTokenFile) {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("volume %s is no projected token for audience %s at %s", mount.Name, relay.Audience, path.Base(relayTokenFile))
	}
	// Nothing else in the DaemonSet changed.
	if b := renderedDaemonSet(t, base); len(b.Spec.Template.Spec.Volumes)+1 != len(ds.Spec.Template.Spec.Volumes) {
		t.Errorf("volumes %d, want the base's %d and the token", len(ds.Spec.Template.Spec.Volumes), len(b.Spec.Template.Spec.Volumes))
	}
}

// kubectl's kustomize renders the component as the test's renderer does.
func TestRelayComponentKubectl(t *testing.T) {
	kubectlRendersAsWeDo(t, relayComponent)
}
