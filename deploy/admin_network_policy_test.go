package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The optional component deploy/admin-network-policy: the
// AdminNetworkPolicy and BaselineAdminNetworkPolicy CRDs (copied from
// sigs.k8s.io/network-policy-api by `make third-party`) and both APIs
// turned on in the policy container.

const (
	anpComponent = "admin-network-policy"
	npaGroup     = "policy.networking.k8s.io"
)

// anpFlags are what the component appends to the policy container's command.
var anpFlags = []string{"--admin-network-policy", "--baseline-admin-network-policy"}

// anpCRDs are the CRDs the component ships, by file.
var anpCRDs = map[string]struct{ kind, plural string }{
	anpComponent + "/crd/policy.networking.k8s.io_adminnetworkpolicies.yaml":         {"AdminNetworkPolicy", "adminnetworkpolicies"},
	anpComponent + "/crd/policy.networking.k8s.io_baselineadminnetworkpolicies.yaml": {"BaselineAdminNetworkPolicy", "baselineadminnetworkpolicies"},
}

// kustFile is the part of a kustomization (or component) file the
// renderer below implements; strict decoding refuses anything more, so a
// kustomization that grows a feature fails here rather than renders wrong.
type kustFile struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Components []string `json:"components"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
	Patches []struct {
		Target struct {
			Group     string `json:"group"`
			Version   string `json:"version"`
			Kind      string `json:"kind"`
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"target"`
		// Patch is an inline JSON6902 patch (YAML list of operations).
		Patch string `json:"patch"`
	} `json:"patches"`
}

// object is a rendered document.
type object struct {
	doc
	apiVersion, namespace string
	obj                   map[string]any
}

func (o object) id() string { return o.apiVersion + " " + o.kind + " " + o.namespace + "/" + o.name }

// kustomizeBuild renders dir as `kustomize build` does for what
// kustFile has: resources (files and directories), then components (their
// resources added, their patches applied to everything so far), then the
// kustomization's own patches and images.
func kustomizeBuild(t *testing.T, dir string) []object {
	t.Helper()
	objs, k := kustomizeLoad(t, dir)
	if k.Kind != "Kustomization" {
		t.Fatalf("%s: kind %s, want Kustomization", dir, k.Kind)
	}
	return objs
}

func kustomizeLoad(t *testing.T, dir string) ([]object, *kustFile) {
	t.Helper()
	file := filepath.Join(dir, "kustomization.yaml")
	docs := readDocs(t, file)
	if len(docs) != 1 {
		t.Fatalf("%s: %d documents", file, len(docs))
	}
	k := strict[kustFile](t, docs[0])
	var objs []object
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if st, err := os.Stat(p); err != nil {
			t.Fatalf("%s: resource %s: %v", file, r, err)
		} else if st.IsDir() {
			objs = append(objs, kustomizeBuild(t, p)...)
			continue
		}
		for _, d := range readDocs(t, p) {
			objs = append(objs, decodeObject(t, d))
		}
	}
	for _, c := range k.Components {
		p := filepath.Join(dir, c)
		cobjs, ck := kustomizeLoad(t, p)
		if ck.APIVersion != "kustomize.config.k8s.io/v1alpha1" || ck.Kind != "Component" {
			t.Fatalf("%s: %s %s, want kustomize.config.k8s.io/v1alpha1 Component", p, ck.APIVersion, ck.Kind)
		}
		// A component's patches apply to what it is added to as well.
		objs = applyPatches(t, p, ck, append(objs, cobjs...))
	}
	if k.Kind == "Kustomization" {
		objs = applyPatches(t, dir, k, objs)
	}
	return objs, k
}

// applyPatches applies k's patches to objs (a component's own patches are
// applied by its user, see kustomizeLoad) and its image overrides.
func applyPatches(t *testing.T, dir string, k *kustFile, objs []object) []object {
	t.Helper()
	for _, p := range k.Patches {
		var ops []struct {
			Op    string `json:"op"`
			Path  string `json:"path"`
			Value any    `json:"value"`
		}
		if err := yaml.UnmarshalStrict([]byte(p.Patch), &ops); err != nil {
			t.Fatalf("%s: patch %+v: want an inline JSON6902 patch: %v", dir, p.Target, err)
		}
		tg := p.Target
		n := 0
		for i, o := range objs {
			group, version, _ := strings.Cut(o.apiVersion, "/")
			if !strings.Contains(o.apiVersion, "/") {
				group, version = "", o.apiVersion
			}
			if tg.Kind != o.kind || tg.Name != "" && tg.Name != o.name || tg.Namespace != "" && tg.Namespace != o.namespace ||
				tg.Group != "" && tg.Group != group || tg.Version != "" && tg.Version != version {
				continue
			}
			n++
			for _, op := range ops {
				toks := pointer(t, op.Path)
				switch op.Op {
				case "test":
					got, ok := pointerGet(o.obj, toks)
					if !ok || !reflect.DeepEqual(got, op.Value) {
						t.Fatalf("%s: patch on %s: test %s: %v, want %v", dir, o.id(), op.Path, got, op.Value)
					}
				case "add":
					if err := pointerAdd(o.obj, toks, op.Value); err != nil {
						t.Fatalf("%s: patch on %s: add %s: %v", dir, o.id(), op.Path, err)
					}
				case "replace":
					if err := pointerReplace(o.obj, toks, op.Value); err != nil {
						t.Fatalf("%s: patch on %s: replace %s: %v", dir, o.id(), op.Path, err)
					}
				default:
					t.Fatalf("%s: patch op %q: the renderer implements test, add and replace", dir, op.Op)
				}
			}
			objs[i] = reencode(t, o)
		}
		if n == 0 {
			t.Fatalf("%s: patch target %+v matches nothing", dir, tg)
		}
	}
	for _, im := range k.Images {
		for i, o := range objs {
			if setImages(o.obj, im.Name, im.NewName, im.NewTag) {
				objs[i] = reencode(t, o)
			}
		}
	}
	return objs
}

func decodeObject(t *testing.T, d doc) object {
	t.Helper()
	o := object{doc: d}
	if err := yaml.Unmarshal(d.data, &o.obj); err != nil {
		t.Fatalf("%s: %v", d.file, err)
	}
	o.apiVersion, _ = o.obj["apiVersion"].(string)
	if md, ok := o.obj["metadata"].(map[string]any); ok {
		o.namespace, _ = md["namespace"].(string)
	}
	return o
}

func reencode(t *testing.T, o object) object {
	t.Helper()
	b, err := yaml.Marshal(o.obj)
	if err != nil {
		t.Fatal(err)
	}
	o.data = b
	return o
}

// pointer splits a JSON pointer (RFC 6901) into its tokens.
func pointer(t *testing.T, p string) []string {
	t.Helper()
	if !strings.HasPrefix(p, "/") {
		t.Fatalf("JSON pointer %q", p)
	}
	toks := strings.Split(p[1:], "/")
	for i, s := range toks {
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return toks
}

func pointerGet(v any, toks []string) (any, bool) {
	for _, tok := range toks {
		switch n := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = n[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(n) {
				return nil, false
			}
			v = n[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// pointerReplace is RFC 6902's replace: the target must exist.
func pointerReplace(root map[string]any, toks []string, val any) error {
	if _, ok := pointerGet(root, toks); !ok {
		return fmt.Errorf("no /%s", strings.Join(toks, "/"))
	}
	parent, _ := pointerGet(root, toks[:len(toks)-1])
	last := toks[len(toks)-1]
	switch p := parent.(type) {
	case map[string]any:
		p[last] = val
	case []any:
		i, _ := strconv.Atoi(last)
		p[i] = val
	}
	return nil
}

// pointerAdd is RFC 6902's add: set a member, or insert into an array
// ("-" appends).
func pointerAdd(root map[string]any, toks []string, val any) error {
	parentToks, last := toks[:len(toks)-1], toks[len(toks)-1]
	parent, ok := pointerGet(root, parentToks)
	if !ok {
		return fmt.Errorf("no /%s", strings.Join(parentToks, "/"))
	}
	switch p := parent.(type) {
	case map[string]any:
		p[last] = val
		return nil
	case []any:
		i := len(p)
		if last != "-" {
			var err error
			if i, err = strconv.Atoi(last); err != nil || i < 0 || i > len(p) {
				return fmt.Errorf("index %q out of 0..%d", last, len(p))
			}
		}
		grown := slices.Insert(slices.Clone(p), i, val)
		if len(parentToks) == 0 {
			return fmt.Errorf("the root is no array")
		}
		gp, _ := pointerGet(root, parentToks[:len(parentToks)-1])
		switch g := gp.(type) {
		case map[string]any:
			g[parentToks[len(parentToks)-1]] = grown
		case []any:
			j, _ := strconv.Atoi(parentToks[len(parentToks)-1])
			g[j] = grown
		}
		return nil
	default:
		return fmt.Errorf("/%s is neither object nor array", strings.Join(parentToks, "/"))
	}
}

// setImages is kustomize's images transformer for (init) containers.
func setImages(v any, name, newName, newTag string) bool {
	changed := false
	switch n := v.(type) {
	case map[string]any:
		for k, c := range n {
			if k == "containers" || k == "initContainers" {
				for _, ci := range c.([]any) {
					cm, _ := ci.(map[string]any)
					img, _ := cm["image"].(string)
					base, _, _ := strings.Cut(img, ":")
					if img != "" && base == name {
						if newName == "" {
							newName = name
						}
						cm["image"] = newName + ":" + newTag
						changed = true
					}
				}
				continue
			}
			changed = setImages(c, name, newName, newTag) || changed
		}
	case []any:
		for _, c := range n {
			changed = setImages(c, name, newName, newTag) || changed
		}
	}
	return changed
}

// withComponent writes a kustomization in a temporary directory, as an
// operator would: deploy/ as a resource and the component, by relative
// paths (kustomize refuses absolute ones).
func withComponent(t *testing.T) string {
	t.Helper()
	return withComponentOf(t, anpComponent)
}

// withComponentOf is withComponent for the component in directory comp.
func withComponentOf(t *testing.T, comp string) string {
	t.Helper()
	dir := t.TempDir()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, here)
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\ncomponents:\n- %s\n",
		filepath.ToSlash(rel), filepath.ToSlash(filepath.Join(rel, comp)))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func ids(objs []object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.id())
	}
	sort.Strings(out)
	return out
}

func renderedDaemonSet(t *testing.T, objs []object) *appsv1.DaemonSet {
	t.Helper()
	var ds []*appsv1.DaemonSet
	for _, o := range objs {
		if o.kind == "DaemonSet" {
			ds = append(ds, strict[appsv1.DaemonSet](t, o.doc))
		}
	}
	if len(ds) != 1 || ds[0].Name != "flock" || ds[0].Namespace != namespace {
		t.Fatalf("want one DaemonSet %s/flock, got %d", namespace, len(ds))
	}
	return ds[0]
}

func policyCommand(t *testing.T, ds *appsv1.DaemonSet) []string {
	t.Helper()
	cs := ds.Spec.Template.Spec.Containers
	i := slices.IndexFunc(cs, func(c corev1.Container) bool { return c.Name == "policy" })
	if i < 0 {
		t.Fatal("no policy container")
	}
	return append(slices.Clone(cs[i].Command), cs[i].Args...)
}

// TestAdminNetworkPolicyComponent renders deploy/ alone and with the
// component: the component adds the two CRDs and nothing else, appends
// both flags to the policy container and changes nothing else in the
// DaemonSet, and the RBAC the flock ServiceAccount has covers what the
// engine then reads.
func TestAdminNetworkPolicyComponent(t *testing.T) {
	// The component file: every CRD in its crd/ is a resource of it.
	_, ck := kustomizeLoad(t, anpComponent)
	if ck.APIVersion != "kustomize.config.k8s.io/v1alpha1" || ck.Kind != "Component" {
		t.Errorf("%s: %s %s, want kustomize.config.k8s.io/v1alpha1 Component", anpComponent, ck.APIVersion, ck.Kind)
	}
	files, err := filepath.Glob(anpComponent + "/crd/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for f := range anpCRDs {
		want = append(want, f)
	}
	for _, r := range ck.Resources {
		got = append(got, filepath.Join(anpComponent, r))
	}
	sort.Strings(want)
	sort.Strings(got)
	sort.Strings(files)
	if !slices.Equal(got, want) || !slices.Equal(files, want) {
		t.Errorf("component resources %v, files in crd/ %v: want both %v (run make third-party)", got, files, want)
	}

	base := kustomizeBuild(t, ".")
	comp := kustomizeBuild(t, withComponent(t))

	// Exactly the two CRDs more.
	wantIDs := ids(base)
	for _, c := range anpCRDs {
		wantIDs = append(wantIDs, "apiextensions.k8s.io/v1 CustomResourceDefinition /"+c.plural+"."+npaGroup)
	}
	sort.Strings(wantIDs)
	if g := ids(comp); !slices.Equal(g, wantIDs) {
		t.Errorf("base + component renders\n %q\nwant the base and the two CRDs\n %q", g, wantIDs)
	}

	// The CRDs, as shipped by network-policy-api's standard channel.
	for f, c := range anpCRDs {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatalf("%v (run make third-party)", err)
		}
		// kubectl apply (client-side) keeps the object in an annotation:
		// 256 KiB at most.
		if st.Size() >= 256<<10 {
			t.Errorf("%s: %d bytes: too big for kubectl apply", f, st.Size())
		}
		var crd struct {
			Metadata struct {
				Name        string            `json:"name"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				Group string `json:"group"`
				Names struct {
					Kind     string `json:"kind"`
					ListKind string `json:"listKind"`
					Plural   string `json:"plural"`
				} `json:"names"`
				Scope    string `json:"scope"`
				Versions []struct {
					Name    string `json:"name"`
					Served  bool   `json:"served"`
					Storage bool   `json:"storage"`
				} `json:"versions"`
			} `json:"spec"`
		}
		var found []object
		for _, o := range comp {
			if o.kind == "CustomResourceDefinition" && o.name == c.plural+"."+npaGroup {
				found = append(found, o)
			}
		}
		if len(found) != 1 {
			t.Errorf("%d CRDs %s.%s rendered, want 1", len(found), c.plural, npaGroup)
			continue
		}
		if err := yaml.Unmarshal(found[0].data, &crd); err != nil {
			t.Fatal(err)
		}
		s := crd.Spec
		if s.Group != npaGroup || s.Names.Kind != c.kind || s.Names.ListKind != c.kind+"List" || s.Names.Plural != c.plural || s.Scope != "Cluster" {
			t.Errorf("%s: group %s kind %s listKind %s plural %s scope %s, want %s %s %sList %s Cluster",
				f, s.Group, s.Names.Kind, s.Names.ListKind, s.Names.Plural, s.Scope, npaGroup, c.kind, c.kind, c.plural)
		}
		// The engine's clients speak v1alpha1.
		if !slices.ContainsFunc(s.Versions, func(v struct {
			Name    string `json:"name"`
			Served  bool   `json:"served"`
			Storage bool   `json:"storage"`
		}) bool {
			return v.Name == "v1alpha1" && v.Served && v.Storage
		}) {
			t.Errorf("%s: versions %+v: want v1alpha1 served and stored", f, s.Versions)
		}
		if ch := crd.Metadata.Annotations[npaGroup+"/channel"]; ch != "standard" {
			t.Errorf("%s: channel %q, want standard", f, ch)
		}
	}

	// The DaemonSet: base alone runs neither API; with the component the
	// policy container's command is the base's and both flags, once each,
	// and nothing else differs.
	bds, cds := renderedDaemonSet(t, base), renderedDaemonSet(t, comp)
	checkPolicyContainer(t, bds.Spec.Template.Spec.Containers[1])
	for _, ds := range []*appsv1.DaemonSet{bds, daemonSet(t)} {
		for _, c := range append(slices.Clone(ds.Spec.Template.Spec.InitContainers), ds.Spec.Template.Spec.Containers...) {
			for _, f := range anpFlags {
				if slices.Contains(append(slices.Clone(c.Command), c.Args...), f) {
					t.Errorf("base: container %s has %s: only the component turns it on", c.Name, f)
				}
			}
		}
	}
	bcmd, ccmd := policyCommand(t, bds), policyCommand(t, cds)
	if w := append(slices.Clone(bcmd), anpFlags...); !slices.Equal(ccmd, w) {
		t.Errorf("with the component the policy container runs %q, want %q", ccmd, w)
	}
	for _, f := range anpFlags {
		if n := len(slices.DeleteFunc(slices.Clone(ccmd), func(a string) bool { return a != f })); n != 1 {
			t.Errorf("policy command %q has %s %d times, want once", ccmd, f, n)
		}
	}
	same := cds.DeepCopy()
	for i := range same.Spec.Template.Spec.Containers {
		if same.Spec.Template.Spec.Containers[i].Name == "policy" {
			same.Spec.Template.Spec.Containers[i].Command = bds.Spec.Template.Spec.Containers[i].Command
		}
	}
	if !reflect.DeepEqual(same, bds) {
		t.Error("the component changes the DaemonSet beyond the policy container's command")
	}

	// RBAC: what the flock ServiceAccount may do, through the
	// ClusterRoleBindings rendered. The engine with both APIs on lists and
	// watches both kinds and the nodes (informers); it writes no status.
	roles := map[string]*rbacv1.ClusterRole{}
	for _, o := range comp {
		if o.kind == "ClusterRole" {
			roles[o.name] = strict[rbacv1.ClusterRole](t, o.doc)
		}
	}
	var rules []rbacv1.PolicyRule
	sa := rbacv1.Subject{Kind: "ServiceAccount", Name: "flock", Namespace: namespace}
	for _, o := range comp {
		if o.kind != "ClusterRoleBinding" {
			continue
		}
		b := strict[rbacv1.ClusterRoleBinding](t, o.doc)
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.APIGroup != rbacv1.GroupName || !slices.Contains(b.Subjects, sa) {
			continue
		}
		r, ok := roles[b.RoleRef.Name]
		if !ok {
			t.Errorf("ClusterRoleBinding %s: no ClusterRole %s", b.Name, b.RoleRef.Name)
			continue
		}
		checkRules(t, "ClusterRole "+r.Name, r.Rules)
		rules = append(rules, r.Rules...)
	}
	for _, need := range []struct{ group, resource string }{
		{npaGroup, "adminnetworkpolicies"}, {npaGroup, "baselineadminnetworkpolicies"}, {"", "nodes"},
	} {
		for _, verb := range []string{"list", "watch"} {
			if allows(rules, need.group, need.resource, verb) == nil {
				t.Errorf("the flock ServiceAccount may not %s %s/%s", verb, need.group, need.resource)
			}
		}
	}
	for _, g := range grants(rules) {
		if strings.Contains(g, npaGroup+"/") && !strings.HasPrefix(g, "get ") && !strings.HasPrefix(g, "list ") && !strings.HasPrefix(g, "watch ") {
			t.Errorf("the flock ServiceAccount has %s: the engine only reads the policy API (no status)", g)
		}
	}
}

// TestAdminNetworkPolicyComponentKubectl: kustomize itself (kubectl's)
// renders the operator's kustomization the same as kustomizeBuild, so
// what TestAdminNetworkPolicyComponent checks is what gets applied.
func TestAdminNetworkPolicyComponentKubectl(t *testing.T) {
	theirs := kubectlRendersAsWeDo(t, anpComponent)
	if cmd := policyCommand(t, renderedDaemonSet(t, theirs)); !slices.Equal(cmd[len(cmd)-2:], anpFlags) {
		t.Errorf("kubectl kustomize: the policy container runs %q", cmd)
	}
}

// kubectlRendersAsWeDo renders deploy/ with component comp through
// kubectl kustomize and fails t unless kustomizeBuild renders the same;
// it returns kubectl's objects.
func kubectlRendersAsWeDo(t *testing.T, comp string) []object {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	dir := withComponentOf(t, comp)
	out, err := exec.Command("kubectl", "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	f := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	var theirs []object
	for _, d := range readDocs(t, f) {
		theirs = append(theirs, decodeObject(t, d))
	}
	ours := kustomizeBuild(t, dir)
	if a, b := ids(theirs), ids(ours); !slices.Equal(a, b) {
		t.Fatalf("kubectl kustomize renders\n %q\nkustomizeBuild\n %q", a, b)
	}
	byID := map[string]object{}
	for _, o := range ours {
		byID[o.id()] = o
	}
	for _, o := range theirs {
		if !reflect.DeepEqual(o.obj, byID[o.id()].obj) {
			t.Errorf("%s: kubectl kustomize and kustomizeBuild differ", o.id())
		}
	}
	return theirs
}

// TestAdminNetworkPolicyExamples: policies of the shapes the e2e test
// applies (e2e/k8sanp_test.go) pass the shipped CRDs' schemas (the
// structural part; the CEL rules are the API server's).
func TestAdminNetworkPolicyExamples(t *testing.T) {
	for _, c := range []struct{ crd, yaml string }{
		{anpComponent + "/crd/policy.networking.k8s.io_adminnetworkpolicies.yaml", `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: flock-e2e}
spec:
  priority: 10
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: server}}
  ingress:
  - name: client
    action: Pass
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: client}}
    ports:
    - portNumber: {protocol: TCP, port: 8080}
`},
		{anpComponent + "/crd/policy.networking.k8s.io_baselineadminnetworkpolicies.yaml", `apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: server}}
      podSelector: {matchLabels: {app: server}}
  ingress:
  - name: client
    action: Deny
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: client}}
`},
	} {
		var obj any
		if err := yaml.Unmarshal([]byte(c.yaml), &obj); err != nil {
			t.Fatal(err)
		}
		for _, e := range validate("", obj, crdSchema(t, c.crd)) {
			t.Errorf("%s: %s", c.crd, e)
		}
		// And a wrong one is refused (the checker is not blind to these).
		bad := strings.Replace(c.yaml, "action: ", "action: Drop", 1)
		if err := yaml.Unmarshal([]byte(bad), &obj); err != nil {
			t.Fatal(err)
		}
		if len(validate("", obj, crdSchema(t, c.crd))) == 0 {
			t.Errorf("%s: action Drop… passes the schema", c.crd)
		}
	}
}
