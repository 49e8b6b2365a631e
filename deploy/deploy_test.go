// Package deploy_test checks the Kubernetes manifests in deploy/: they parse
// strictly into the API types, the kustomization is complete (every CRD
// included), the DaemonSet has what the agent needs, RBAC grants exactly
// what the agent needs, and the example NodeConfig and AddressPools pass the
// agent's own validation and the CRDs' schemas.
package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
)

const (
	namespace    = "flock-system"
	secretName   = "flock-bgp-passwords"
	image        = "docker.io/fritzlab/flock"
	crdFile      = "crd/flock.fritzlab.net_nodeconfigs.yaml"
	poolCRDFile  = "crd/flock.fritzlab.net_addresspools.yaml"
	claimCRDFile = "crd/flock.fritzlab.net_addressclaims.yaml"
	example      = "examples/nodeconfig.yaml"
	poolsExample = "examples/addresspools.yaml"
)

type doc struct {
	file string
	data []byte
	kind string
	name string
}

// readDocs returns every YAML document of a file.
func readDocs(t *testing.T, file string) []doc {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out []doc
	for {
		b, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(b, &head); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if head.Kind == "" && head.APIVersion == "" && len(bytes.TrimSpace(stripComments(b))) == 0 {
			continue // empty document
		}
		if head.Kind == "" || head.APIVersion == "" {
			t.Fatalf("%s: document without apiVersion/kind:\n%s", file, b)
		}
		out = append(out, doc{file: file, data: b, kind: head.Kind, name: head.Metadata.Name})
	}
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l...)
		}
	}
	return out
}

// allDocs reads every YAML file under deploy/.
func allDocs(t *testing.T) []doc {
	t.Helper()
	var out []doc
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			out = append(out, readDocs(t, p)...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func strict[T any](t *testing.T, d doc) *T {
	t.Helper()
	v := new(T)
	if err := yaml.UnmarshalStrict(d.data, v); err != nil {
		t.Fatalf("%s: %s %s: %v", d.file, d.kind, d.name, err)
	}
	return v
}

// find returns the documents of a kind (from the kustomization's files).
func find(t *testing.T, kind string) []doc {
	t.Helper()
	var out []doc
	for _, f := range kustomization(t).Resources {
		for _, d := range readDocs(t, f) {
			if d.kind == kind {
				out = append(out, d)
			}
		}
	}
	return out
}

type kust struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

func kustomization(t *testing.T) *kust {
	t.Helper()
	return strict[kust](t, readDocs(t, "kustomization.yaml")[0])
}

func TestEveryDocumentParses(t *testing.T) {
	kinds := map[string]int{}
	for _, d := range allDocs(t) {
		kinds[d.kind]++
		switch d.kind {
		case "Namespace":
			strict[corev1.Namespace](t, d)
		case "ServiceAccount":
			strict[corev1.ServiceAccount](t, d)
		case "ClusterRole":
			strict[rbacv1.ClusterRole](t, d)
		case "ClusterRoleBinding":
			strict[rbacv1.ClusterRoleBinding](t, d)
		case "Role":
			strict[rbacv1.Role](t, d)
		case "RoleBinding":
			strict[rbacv1.RoleBinding](t, d)
		case "DaemonSet":
			strict[appsv1.DaemonSet](t, d)
		case "Deployment":
			strict[appsv1.Deployment](t, d) // deploy/relay: relay_test.go
		case "NodeConfig":
			strict[v1alpha1.NodeConfig](t, d)
		case "AddressPool":
			strict[v1alpha1.AddressPool](t, d)
		case v1alpha1.NodeConfigTemplateKind:
			strict[v1alpha1.NodeConfigTemplate](t, d)
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			checkAdmissionDoc(t, d) // nodeconfig_policy_test.go
		case "Service", "PodMonitor":
			// deploy/monitoring: packaging_test.go.
		case "Kustomization", "Component", "CustomResourceDefinition":
			// Checked by their own tests.
		default:
			t.Errorf("%s: unexpected kind %s", d.file, d.kind)
		}
	}
	for _, k := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
		"ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet", "Kustomization", "NodeConfig", "AddressPool",
		v1alpha1.NodeConfigTemplateKind, "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in deploy/", k)
		}
	}
}

func TestKustomization(t *testing.T) {
	k := kustomization(t)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization apiVersion/kind = %s %s", k.APIVersion, k.Kind)
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(r); err != nil {
			t.Errorf("kustomization resource %s: %v", r, err)
		}
	}
	// Every manifest in deploy/ but the per-node examples is installed.
	want := []string{}
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Examples are not installed; optional components (kustomize
		// kind Component) are checked by their own tests.
		if d.IsDir() && (p == "examples" || p == "admin-network-policy" || p == policyComponent || p == "monitoring" || p == relayComponent) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".yaml") && p != "kustomization.yaml" {
			want = append(want, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Clone(k.Resources)
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("kustomization resources %v, want the manifests %v", got, want)
	}
	for _, ex := range []string{example, poolsExample} {
		if slices.Contains(k.Resources, ex) {
			t.Errorf("%s is an example (per node, or addresses of your own) and must not be in the kustomization", ex)
		}
	}
	// Every CRD: the ones the agent needs, and whatever `make generate`
	// writes into crd/.
	crds, err := filepath.Glob("crd/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{crdFile, poolCRDFile, claimCRDFile} {
		if !slices.Contains(crds, f) {
			t.Errorf("the CRD %s is missing from deploy/crd (run make generate)", f)
		}
	}
	for _, f := range crds {
		if !slices.Contains(k.Resources, f) {
			t.Errorf("the CRD %s is not in the kustomization", f)
		}
		docs := readDocs(t, f)
		if len(docs) != 1 || docs[0].kind != "CustomResourceDefinition" {
			t.Errorf("%s: want one CustomResourceDefinition", f)
		}
	}
	if len(k.Images) != 1 || k.Images[0].Name != image || k.Images[0].NewTag == "" {
		t.Errorf("images = %+v, want one entry for %s with a tag", k.Images, image)
	}
	for _, d := range find(t, "Namespace") {
		if d.name != namespace {
			t.Errorf("namespace %q, want %q", d.name, namespace)
		}
	}
}

func daemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	ds := find(t, "DaemonSet")
	if len(ds) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(ds))
	}
	return strict[appsv1.DaemonSet](t, ds[0])
}

func TestDaemonSet(t *testing.T) {
	ds := daemonSet(t)
	if ds.Name != "flock" || ds.Namespace != namespace {
		t.Errorf("DaemonSet %s/%s, want %s/flock", ds.Namespace, ds.Name, namespace)
	}
	if ds.Spec.Selector == nil || len(ds.Spec.Selector.MatchLabels) == 0 {
		t.Fatal("no selector")
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the template labels %v", k, v, ds.Spec.Template.Labels)
		}
	}
	u := ds.Spec.UpdateStrategy
	if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil ||
		u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("updateStrategy = %+v, want RollingUpdate maxUnavailable 1", u)
	}
	p := ds.Spec.Template.Spec
	if !p.HostNetwork {
		t.Error("not hostNetwork")
	}
	if p.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("dnsPolicy %q", p.DNSPolicy)
	}
	if p.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", p.PriorityClassName)
	}
	if p.ServiceAccountName != "flock" {
		t.Errorf("serviceAccountName %q", p.ServiceAccountName)
	}
	if !slices.ContainsFunc(p.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Operator == corev1.TolerationOpExists && tl.Key == "" && tl.Effect == ""
	}) {
		t.Errorf("tolerations %+v do not tolerate everything", p.Tolerations)
	}

	vols := map[string]corev1.Volume{}
	for _, v := range p.Volumes {
		vols[v.Name] = v
	}
	// hostPath returns the host path a container's mount at mountPath comes from.
	hostPath := func(c corev1.Container, mountPath string) (string, *corev1.VolumeMount) {
		for i, m := range c.VolumeMounts {
			if m.MountPath == mountPath {
				v, ok := vols[m.Name]
				if !ok || v.HostPath == nil {
					t.Errorf("%s: mount %s: volume %q is not a hostPath", c.Name, mountPath, m.Name)
					return "", nil
				}
				return v.HostPath.Path, &c.VolumeMounts[i]
			}
		}
		return "", nil
	}
	checkMount := func(c corev1.Container, mountPath, host string) *corev1.VolumeMount {
		got, m := hostPath(c, mountPath)
		if got != host {
			t.Errorf("%s: %s comes from host %q, want %q", c.Name, mountPath, got, host)
		}
		return m
	}

	if len(p.InitContainers) != 1 || p.InitContainers[0].Name != "install-cni" {
		t.Fatalf("initContainers %d, want install-cni", len(p.InitContainers))
	}
	ic := p.InitContainers[0]
	checkImage(t, ic)
	wantCmd := "/usr/local/bin/flock-installer --plugin /usr/local/bin/flock --cni-bin-dir /host/opt/cni/bin " +
		"--cni-conf-dir /host/etc/cni/net.d --socket /run/flock/cni.sock --portmap --bandwidth " +
		"--host-root /host --status-file /run/flock/installer.json --stage-dir /run/flock --node-name=$(NODE_NAME)"
	if got := strings.Join(append(slices.Clone(ic.Command), ic.Args...), " "); got != wantCmd {
		t.Errorf("install-cni runs %q, want %q", got, wantCmd)
	}
	if len(ic.Env) != 1 || ic.Env[0].Name != "NODE_NAME" || ic.Env[0].ValueFrom == nil || ic.Env[0].ValueFrom.FieldRef == nil ||
		ic.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("install-cni env %+v: want NODE_NAME from spec.nodeName (its runtime is read from the API)", ic.Env)
	}
	if m := checkMount(ic, "/host", "/"); m != nil && !m.ReadOnly {
		t.Error("install-cni: the host's / is not read-only")
	}
	checkMount(ic, "/host/opt/cni/bin", "/opt/cni/bin")
	checkMount(ic, "/host/etc/cni/net.d", "/etc/cni/net.d")
	checkMount(ic, "/run/flock", "/run/flock")

	if len(p.Containers) != 2 || p.Containers[0].Name != "agent" || p.Containers[1].Name != "policy" {
		t.Fatalf("containers %d, want agent and policy", len(p.Containers))
	}
	checkPolicyContainer(t, p.Containers[1])
	c := p.Containers[0]
	checkImage(t, c)
	args := append(slices.Clone(c.Command), c.Args...)
	if len(args) == 0 || args[0] != "/usr/local/bin/flock-agent" {
		t.Errorf("agent runs %v", args)
	}
	joined := " " + strings.Join(args, " ") + " "
	for _, a := range []string{"--kubernetes", "--node-name=$(NODE_NAME)", "--cni-socket /run/flock/cni.sock",
		"--admin-socket /run/flock/admin.sock", "--state-dir /var/lib/flock", "--metrics-address 127.0.0.1:9476",
		"--installer-status /run/flock/installer.json", // where install-cni writes it
		"--cni-conf-dir /host/etc/cni/net.d"} {         // where it publishes the staged conflist
		if !strings.Contains(joined, " "+a+" ") {
			t.Errorf("agent args %v lack %q", args, a)
		}
	}
	checkMount(c, "/host/etc/cni/net.d", "/etc/cni/net.d")
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["NODE_NAME"] != "spec.nodeName" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("env fieldRefs %v", env)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("agent is not privileged")
	}
	checkHTTPProbe(t, "agent startup", c.StartupProbe, 9476, "/healthz")
	checkHTTPProbe(t, "agent readiness", c.ReadinessProbe, 9476, "/readyz")
	checkHTTPProbe(t, "agent liveness", c.LivenessProbe, 9476, "/healthz")
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 9476 }) {
		t.Errorf("ports %+v lack metrics 9476", c.Ports)
	}
	if q := c.Resources.Requests.Cpu(); q.String() != "50m" {
		t.Errorf("cpu request %s", q)
	}
	if q := c.Resources.Requests.Memory(); q.String() != "64Mi" {
		t.Errorf("memory request %s", q)
	}
	if q := c.Resources.Limits.Memory(); q.String() != "256Mi" {
		t.Errorf("memory limit %s", q)
	}
	if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Error("a CPU limit throttles the node's networking: leave it out")
	}
	checkMount(c, "/run/flock", "/run/flock")
	if _, m := hostPath(c, "/host"); m != nil {
		t.Error("agent mounts the host's /: only install-cni needs it")
	}
	checkMount(c, "/var/lib/flock", "/var/lib/flock")
	if m := checkMount(c, "/var/run/netns", "/run/netns"); m != nil &&
		(m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer) {
		t.Error("/var/run/netns lacks mountPropagation HostToContainer: netns created after the agent started would be empty mount points")
	}
	if m := checkMount(c, "/lib/modules", "/lib/modules"); m != nil && !m.ReadOnly {
		t.Error("/lib/modules is not read-only")
	}
	for _, name := range []string{"run", "state"} {
		if v, ok := vols[name]; !ok || v.HostPath == nil || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
			t.Errorf("volume %s is not a DirectoryOrCreate hostPath", name)
		}
	}
}

func checkImage(t *testing.T, c corev1.Container) {
	t.Helper()
	if !strings.HasPrefix(c.Image, image+":") {
		t.Errorf("%s: image %q, want %s:<tag> (retagged by the kustomization)", c.Name, c.Image, image)
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("%s: imagePullPolicy %q", c.Name, c.ImagePullPolicy)
	}
}

func TestExampleNodeConfig(t *testing.T) {
	docs := readDocs(t, example)
	if len(docs) != 1 || docs[0].kind != "NodeConfig" {
		t.Fatalf("%s: want one NodeConfig", example)
	}
	nc := strict[v1alpha1.NodeConfig](t, docs[0])
	if nc.APIVersion != v1alpha1.GroupVersion.String() {
		t.Errorf("apiVersion %q", nc.APIVersion)
	}
	if err := nodeconfig.Validate(&nc.Spec); err != nil {
		t.Errorf("nodeconfig.Validate: %v", err)
	}
	// It shows the current way: AddressPools, not deprecated shared pools.
	if _, warnings := nodeconfig.LegacyPools(&nc.Spec); len(warnings) > 0 {
		t.Errorf("the example uses deprecated shared pools: %q", warnings)
	}
	// The same object is a valid standalone node-config file.
	if _, err := nodeconfig.Parse(docs[0].data); err != nil {
		t.Errorf("nodeconfig.Parse: %v", err)
	}
	s := nc.Spec
	if len(s.BGP.Peers) == 0 || !s.BGP.Peers[0].BFD.Enabled || s.BGP.Peers[0].GracefulRestart.Disabled {
		t.Errorf("the example should show a peer with BFD and graceful restart: %+v", s.BGP.Peers)
	}
	// And it passes the CRD's OpenAPI schema (the structural part; the
	// CEL rules are the API server's to evaluate).
	var obj any
	if err := yaml.Unmarshal(docs[0].data, &obj); err != nil {
		t.Fatal(err)
	}
	sch := crdSchema(t, crdFile)
	for _, e := range validate("", obj, sch) {
		t.Errorf("%s: %s", example, e)
	}
}

// docRanges are the documentation ranges the examples must stay in.
var docRanges = []netip.Prefix{
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
}

func TestExampleAddressPools(t *testing.T) {
	docs := readDocs(t, poolsExample)
	var pools []v1alpha1.AddressPool
	sch := crdSchema(t, poolCRDFile)
	for _, d := range docs {
		if d.kind != "AddressPool" {
			t.Fatalf("%s: %s %s, want only AddressPools", poolsExample, d.kind, d.name)
		}
		ap := strict[v1alpha1.AddressPool](t, d)
		if ap.APIVersion != v1alpha1.GroupVersion.String() || ap.Namespace != "" {
			t.Errorf("%s: apiVersion %q namespace %q: want %s, cluster-scoped", d.name, ap.APIVersion, ap.Namespace, v1alpha1.GroupVersion)
		}
		pools = append(pools, *ap)
		var obj any
		if err := yaml.Unmarshal(d.data, &obj); err != nil {
			t.Fatal(err)
		}
		for _, e := range validate("", obj, sch) {
			t.Errorf("%s: %s: %s", poolsExample, d.name, e)
		}
		// The CRD's CEL rule (the checker above is structural only).
		if ap.Spec.Namespaces == nil && ap.Spec.NamespaceSelector == nil {
			t.Errorf("%s: says neither namespaces nor namespaceSelector: the API server refuses it", d.name)
		}
	}
	// The agent's own validation, the whole set at once (overlaps).
	if _, err := authz.Compile(pools); err != nil {
		t.Errorf("authz.Compile: %v", err)
	}
	// A worked example per use, one use each so each is plain to read.
	for _, use := range v1alpha1.Uses {
		n := 0
		for _, p := range pools {
			if slices.Equal(p.Spec.Use, []string{use}) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("no example AddressPool for use %s alone", use)
		}
	}
	// Documentation addresses only, both families per pool, and none in
	// the example node's summaries (summaries and AddressPools must not
	// overlap).
	nc := strict[v1alpha1.NodeConfig](t, readDocs(t, example)[0])
	summaries := nodeconfig.Summaries(&nc.Spec)
	for _, p := range pools {
		fams := map[bool]bool{}
		for _, c := range p.Spec.CIDRs {
			pfx := netip.MustParsePrefix(c)
			fams[pfx.Addr().Is4()] = true
			if !slices.ContainsFunc(docRanges, func(r netip.Prefix) bool { return r.Bits() <= pfx.Bits() && r.Contains(pfx.Addr()) }) {
				t.Errorf("%s: %s is outside the documentation ranges %v", p.Name, pfx, docRanges)
			}
			for _, s := range summaries {
				if s.Overlaps(pfx) {
					t.Errorf("%s: %s overlaps the example node's summary %s", p.Name, pfx, s)
				}
			}
		}
		if len(fams) != 2 {
			t.Errorf("%s: CIDRs %v: show both families", p.Name, p.Spec.CIDRs)
		}
	}

	// In standalone mode the same documents follow the NodeConfig in the
	// node-config file.
	ncRaw, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	poolsRaw, err := os.ReadFile(poolsExample)
	if err != nil {
		t.Fatal(err)
	}
	f, err := nodeconfig.Parse(append(append(ncRaw, "---\n"...), poolsRaw...))
	if err != nil {
		t.Fatalf("example NodeConfig + AddressPools as a node-config file: %v", err)
	}
	if !reflect.DeepEqual(f.AddressPools, pools) {
		t.Errorf("node-config file AddressPools\n %+v\nwant\n %+v", f.AddressPools, pools)
	}
}

// schema is the subset of OpenAPI v3 the CRD uses.
type schema struct {
	Type       string            `json:"type"`
	Format     string            `json:"format"`
	Properties map[string]schema `json:"properties"`
	Items      *schema           `json:"items"`
	Required   []string          `json:"required"`
	Enum       []any             `json:"enum"`
	Pattern    string            `json:"pattern"`
	Minimum    *float64          `json:"minimum"`
	Maximum    *float64          `json:"maximum"`
	MinItems   *int              `json:"minItems"`
	MaxItems   *int              `json:"maxItems"`
	MinLength  *int              `json:"minLength"`
	MaxLength  *int              `json:"maxLength"`
	// AdditionalProperties is the schema of a map's values.
	AdditionalProperties *schema `json:"additionalProperties"`
}

var ipv4 = regexp.MustCompile(`^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$`)

// checkPolicyContainer: flock-policy runs from the same image for its
// node, with NET_ADMIN (nftables, NFQUEUE) and no more.
func checkPolicyContainer(t *testing.T, c corev1.Container) {
	t.Helper()
	checkImage(t, c)
	args := strings.Join(append(slices.Clone(c.Command), c.Args...), " ")
	if args != "/usr/local/bin/flock-policy --node-name=$(NODE_NAME) --metrics-address=127.0.0.1:9477 --admin-socket=/run/flock/policy.sock" {
		t.Errorf("policy runs %q", args)
	}
	// The node, and its own pod (uninstall is told by the pod's owner).
	wantEnv := [][2]string{{"NODE_NAME", "spec.nodeName"}, {"POD_NAME", "metadata.name"}, {"POD_NAMESPACE", "metadata.namespace"}}
	if len(c.Env) != len(wantEnv) {
		t.Errorf("policy env %+v: want %v", c.Env, wantEnv)
	}
	for i, w := range wantEnv {
		if i >= len(c.Env) || c.Env[i].Name != w[0] || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != w[1] {
			t.Errorf("policy env %+v: want %s from %s", c.Env, w[0], w[1])
		}
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) {
		t.Errorf("policy securityContext %+v: want NET_ADMIN only, not privileged", sc)
	}
	// Its admin socket (flockctl policy) is beside the agent's; the run
	// volume is checked as the agent's /run/flock hostPath.
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "run" || c.VolumeMounts[0].MountPath != "/run/flock" || c.VolumeMounts[0].ReadOnly {
		t.Errorf("policy mounts %+v: want the run volume at /run/flock, writable, and nothing else", c.VolumeMounts)
	}
	// Metrics and health on the host's loopback, next to the agent's 9476.
	checkHTTPProbe(t, c.Name+" startup", c.StartupProbe, 9477, "/healthz")
	checkHTTPProbe(t, c.Name+" liveness", c.LivenessProbe, 9477, "/healthz")
	checkHTTPProbe(t, c.Name+" readiness", c.ReadinessProbe, 9477, "/readyz")
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "policy-metrics" && p.ContainerPort == 9477 }) {
		t.Errorf("policy ports %+v lack policy-metrics 9477", c.Ports)
	}
}

// checkHTTPProbe: an httpGet probe of 127.0.0.1:port path (hostNetwork:
// the kubelet reaches the host's loopback).
func checkHTTPProbe(t *testing.T, what string, pr *corev1.Probe, port int, path string) {
	t.Helper()
	if pr == nil || pr.HTTPGet == nil {
		t.Errorf("%s probe missing or not httpGet", what)
		return
	}
	g := pr.HTTPGet
	if g.Path != path || g.Port.IntValue() != port || g.Host != "127.0.0.1" {
		t.Errorf("%s probe = %s:%s%s, want 127.0.0.1:%d%s", what, g.Host, g.Port.String(), g.Path, port, path)
	}
}
