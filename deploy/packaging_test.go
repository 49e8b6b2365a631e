package deploy_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The packaging conventions operators expect: the image tag is the
// release (the file VERSION, which also stamps the binaries), not :dev;
// flock runs on Linux nodes only; the installer needs no privilege.
func TestPackaging(t *testing.T) {
	b, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(b))
	if !strings.HasPrefix(version, "v") || strings.Count(version, ".") != 2 {
		t.Fatalf("VERSION %q: want vMAJOR.MINOR.PATCH", version)
	}
	k := kustomization(t)
	if len(k.Images) != 1 || k.Images[0].NewTag != version {
		t.Errorf("kustomization images %+v: want newTag %s (the file VERSION)", k.Images, version)
	}
	ds := daemonSet(t)
	p := ds.Spec.Template.Spec
	for _, c := range append(slices.Clone(p.InitContainers), p.Containers...) {
		if c.Image != image+":"+version {
			t.Errorf("%s: image %q, want %s:%s", c.Name, c.Image, image, version)
		}
	}
	if p.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v: want kubernetes.io/os: linux", p.NodeSelector)
	}
	ic := p.InitContainers[0]
	sc := ic.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SYS_CHROOT"}) {
		t.Errorf("install-cni securityContext %+v: want unprivileged, no escalation, read-only root, only SYS_CHROOT", sc)
	}
}

// deploy/monitoring: the metrics of both containers on every address of
// the node (Prometheus reaches them; the probes still use loopback), a
// headless Service whose ports exist on the pods, and nothing else moved.
func TestMonitoringComponent(t *testing.T) {
	base := kustomizeBuild(t, ".")
	objs, k := kustomizeLoad(t, "monitoring")
	if k.Kind != "Component" {
		t.Fatalf("monitoring: kind %s, want Component", k.Kind)
	}
	objs = applyPatches(t, "monitoring", k, append(base, objs...))
	var ds *object
	var svc *object
	for i := range objs {
		switch objs[i].kind {
		case "DaemonSet":
			ds = &objs[i]
		case "Service":
			svc = &objs[i]
		}
	}
	if ds == nil || svc == nil {
		t.Fatal("the component's build lacks the DaemonSet or the Service")
	}
	spec := ds.obj["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	cs := spec["containers"].([]any)
	cmd := func(i int) string {
		var parts []string
		for _, a := range cs[i].(map[string]any)["command"].([]any) {
			parts = append(parts, a.(string))
		}
		return strings.Join(parts, " ")
	}
	if c := cmd(0); !strings.Contains(c, "--metrics-address :9476") {
		t.Errorf("agent command %q: want --metrics-address :9476", c)
	}
	if c := cmd(1); !strings.Contains(c, "--metrics-address=:9477") {
		t.Errorf("policy command %q: want --metrics-address=:9477", c)
	}
	ports := map[string]bool{}
	for _, c := range cs {
		for _, p := range c.(map[string]any)["ports"].([]any) {
			ports[p.(map[string]any)["name"].(string)] = true
		}
	}
	for _, p := range svc.obj["spec"].(map[string]any)["ports"].([]any) {
		if tp := p.(map[string]any)["targetPort"].(string); !ports[tp] {
			t.Errorf("Service targetPort %s: no such container port (%v)", tp, ports)
		}
	}
	b, err := os.ReadFile("monitoring/podmonitor.yaml")
	if err != nil || !strings.Contains(string(b), "port: metrics") || !strings.Contains(string(b), "port: policy-metrics") {
		t.Errorf("monitoring/podmonitor.yaml: %v", err)
	}
}
