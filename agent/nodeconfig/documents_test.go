package nodeconfig_test

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
)

// A node-config file of several documents: the pools come first, the
// NodeConfig last, with an empty and a comment-only document in between.
const (
	ncDoc = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: node-a
spec:
  asn: 4200000001
  routerID: 192.0.2.11
  pools:
    - cidr: fd00:10:1::/64
    - cidr: 10.1.1.0/24
`
	podsDoc = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: pods
  labels: {team: net}
spec:
  cidrs: ["2001:db8:100::/112", 198.51.100.128/26]
  use: [pod]
  namespaces: [prod, staging]
`
	anycastDoc = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: dns-anycast
spec:
  cidrs: ["2001:db8:53::/120", 203.0.113.0/28]
  use: [anycast]
  namespaceSelector:
    matchLabels: {flock.fritzlab.net/anycast: "true"}
`
	addressesDoc = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: ingress
spec:
  cidrs: [203.0.113.64/26]
  use: [addresses, anycast]
  namespaces: [ingress]
  namespaceSelector:
    matchExpressions:
    - {key: tier, operator: In, values: [edge]}
`
)

func multiDoc(docs ...string) string { return strings.Join(docs, "---\n") }

var goodMulti = "--- # the pools\n" + multiDoc(podsDoc, anycastDoc, "# nothing here\n", "\n", addressesDoc, ncDoc) + "---\n"

func TestParseMultiDocument(t *testing.T) {
	f, err := nodeconfig.Parse([]byte(goodMulti))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if f.Kind != nodeconfig.Kind || f.Metadata.Name != "node-a" || f.Spec.ASN != 4200000001 || len(f.Spec.Pools) != 2 {
		t.Errorf("NodeConfig = %s %s %+v", f.Kind, f.Metadata.Name, f.Spec)
	}
	tm := metav1.TypeMeta{APIVersion: nodeconfig.APIVersion, Kind: v1alpha1.AddressPoolKind}
	want := []v1alpha1.AddressPool{
		{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: "pods", Labels: map[string]string{"team": "net"}},
			Spec: v1alpha1.AddressPoolSpec{CIDRs: []string{"2001:db8:100::/112", "198.51.100.128/26"}, Use: []string{"pod"}, Namespaces: []string{"prod", "staging"}}},
		{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: "dns-anycast"},
			Spec: v1alpha1.AddressPoolSpec{CIDRs: []string{"2001:db8:53::/120", "203.0.113.0/28"}, Use: []string{"anycast"},
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"flock.fritzlab.net/anycast": "true"}}}},
		{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: "ingress"},
			Spec: v1alpha1.AddressPoolSpec{CIDRs: []string{"203.0.113.64/26"}, Use: []string{"addresses", "anycast"}, Namespaces: []string{"ingress"},
				NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"edge"}}}}}},
	}
	if !reflect.DeepEqual(f.AddressPools, want) {
		t.Errorf("AddressPools\n got %+v\nwant %+v", f.AddressPools, want)
	}

	// The pools are the ones the agent decides with.
	set, err := authz.Compile(f.AddressPools)
	if err != nil {
		t.Fatalf("authz.Compile of parsed pools: %v", err)
	}
	for _, tc := range []struct {
		use, value, ns string
		labels         labels.Set
		pool           string // "" = denied
	}{
		{v1alpha1.UsePod, "2001:db8:100::/120", "prod", nil, "pods"},
		{v1alpha1.UsePod, "2001:db8:100::/120", "tenant-a", nil, ""},
		{v1alpha1.UseAnycast, "203.0.113.1/32", "dns", labels.Set{"flock.fritzlab.net/anycast": "true"}, "dns-anycast"},
		{v1alpha1.UseAnycast, "203.0.113.1/32", "dns", nil, ""},
		{v1alpha1.UseAddresses, "203.0.113.70/32", "ingress", nil, "ingress"},
		{v1alpha1.UseAddresses, "203.0.113.70/32", "web", labels.Set{"tier": "edge"}, "ingress"},
		{v1alpha1.UseAddresses, "203.0.113.1/32", "ingress", nil, ""},
	} {
		p, err := set.Authorize(tc.use, netip.MustParsePrefix(tc.value), tc.ns, tc.labels)
		if p.Name != tc.pool || (err == nil) != (tc.pool != "") {
			t.Errorf("Authorize(%s %s ns %s) = %q, %v; want pool %q", tc.use, tc.value, tc.ns, p.Name, err, tc.pool)
		}
	}

	// A single NodeConfig document has no AddressPools; "---" around it
	// changes nothing.
	for _, data := range []string{goodYAML, "---\n" + goodYAML, goodYAML + "---\n", "# c\n---\n" + goodYAML + "--- # end\n"} {
		f, err := nodeconfig.Parse([]byte(data))
		if err != nil || f.AddressPools != nil || f.Metadata.Name != "node-a" {
			t.Errorf("Parse(%q) = %+v, %v; want node-a and no AddressPools", data, f, err)
		}
	}
}

// A NodeConfig of a wrong apiVersion is reported as such, not as missing;
// an AddressPool that lists no namespace (namespaces: []) is valid and
// allows nobody.
func TestParseEdges(t *testing.T) {
	_, err := nodeconfig.Parse([]byte(strings.Replace(goodYAML, "flock.fritzlab.net/v1alpha1", "flock.fritzlab.net/v1beta1", 1)))
	if err == nil || !strings.Contains(err.Error(), `document 1 (NodeConfig/node-a, line 1): apiVersion: "flock.fritzlab.net/v1beta1"`) ||
		strings.Contains(err.Error(), "no NodeConfig") {
		t.Errorf("wrong apiVersion: error %v", err)
	}

	nobody := strings.Replace(podsDoc, "namespaces: [prod, staging]", "namespaces: []", 1)
	f, err := nodeconfig.Parse([]byte(multiDoc(ncDoc, nobody)))
	if err != nil {
		t.Fatalf("namespaces: []: %v", err)
	}
	set, err := authz.Compile(f.AddressPools)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Authorize(v1alpha1.UsePod, netip.MustParsePrefix("2001:db8:100::1/128"), "prod", nil); err == nil {
		t.Error("a pool with namespaces: [] allowed namespace prod")
	}
}

// Two AddressPools may overlap when they share no use.
func TestParseOverlapAcrossUses(t *testing.T) {
	other := strings.NewReplacer("name: pods", "name: pods-anycast", "use: [pod]", "use: [anycast]").Replace(podsDoc)
	f, err := nodeconfig.Parse([]byte(multiDoc(ncDoc, podsDoc, other)))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(f.AddressPools) != 2 {
		t.Errorf("%d AddressPools, want 2", len(f.AddressPools))
	}
}

func TestLoadMultiDocument(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(p, []byte(goodMulti), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := nodeconfig.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(f.Raw) != goodMulti || len(f.AddressPools) != 3 {
		t.Errorf("Raw %d bytes (want %d), %d AddressPools (want 3)", len(f.Raw), len(goodMulti), len(f.AddressPools))
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(multiDoc(ncDoc, strings.Replace(podsDoc, "use: [pod]", "use: []", 1))), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err = nodeconfig.Load(bad)
	if f != nil || err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "document 2 (AddressPool/pods, line 12)") ||
		!strings.Contains(err.Error(), "spec.use: empty") {
		t.Errorf("Load(bad) = %v, %v: want no file and an error naming the file, document 2 and spec.use", f, err)
	}
}

func TestParseMultiDocumentErrors(t *testing.T) {
	// edit replaces old by new in doc (old must occur).
	edit := func(t *testing.T, doc, old, new string) string {
		t.Helper()
		if !strings.Contains(doc, old) {
			t.Fatalf("%q not in %q", old, doc)
		}
		return strings.Replace(doc, old, new, 1)
	}
	sharedNC := edit(t, ncDoc, "    - cidr: 10.1.1.0/24\n",
		"    - cidr: 10.1.1.0/24\n    - cidr: 2001:db8:100::/120\n      shared: true\n      namespaces: [prod]\n")
	tests := []struct {
		name string
		yaml func(t *testing.T) string
		want []string // substrings of the error: document, field, value
	}{
		{
			name: "empty file",
			yaml: func(t *testing.T) string { return "" },
			want: []string{"no NodeConfig document", "exactly one NodeConfig"},
		},
		{
			name: "only comments and separators",
			yaml: func(t *testing.T) string { return "# nothing\n---\n---\n" },
			want: []string{"no NodeConfig document"},
		},
		{
			name: "AddressPools without a NodeConfig",
			yaml: func(t *testing.T) string { return multiDoc(podsDoc, anycastDoc) },
			want: []string{"no NodeConfig document"},
		},
		{
			name: "a second NodeConfig",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, podsDoc, edit(t, ncDoc, "name: node-a", "name: node-b"))
			},
			want: []string{"document 3 (NodeConfig/node-b, line 22)", "a second NodeConfig", "document 1 (NodeConfig/node-a, line 1) is the first"},
		},
		{
			name: "unknown kind",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "kind: AddressPool", "kind: Service"))
			},
			want: []string{"document 2 (Service/pods, line 12)", `kind: "Service"`, "want NodeConfig or AddressPool"},
		},
		{
			name: "misspelt kind",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "kind: AddressPool", "kind: AddressPools"))
			},
			want: []string{"document 2 (AddressPools/pods, line 12)", `kind: "AddressPools"`},
		},
		{
			name: "missing kind",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, edit(t, podsDoc, "kind: AddressPool\n", "")) },
			want: []string{"document 2 (pods, line 12)", "kind: missing"},
		},
		{
			name: "AddressPool with a wrong apiVersion",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "apiVersion: flock.fritzlab.net/v1alpha1", "apiVersion: flock.fritzlab.net/v1"))
			},
			want: []string{"document 2 (AddressPool/pods, line 12)", "apiVersion", `"flock.fritzlab.net/v1"`},
		},
		{
			name: "unknown AddressPool spec field",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, edit(t, podsDoc, "  namespaces:", "  namespace:")) },
			want: []string{"document 2 (AddressPool/pods, line 12): spec.namespace: unknown field (did you mean namespaces?)"},
		},
		{
			name: "unknown AddressPool top-level field",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, podsDoc+"specs: {}\n") },
			want: []string{"document 2 (AddressPool/pods, line 12): specs: unknown field (did you mean spec?)"},
		},
		{
			name: "unknown AddressPool metadata field",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, edit(t, podsDoc, "  labels:", "  lables:")) },
			want: []string{"document 2 (AddressPool/pods, line 12): metadata.lables: unknown field (did you mean labels?)"},
		},
		{
			name: "unknown NodeConfig field in a later document",
			yaml: func(t *testing.T) string { return multiDoc(podsDoc, edit(t, ncDoc, "  pools:", "  pool:")) },
			want: []string{"document 2 (NodeConfig/node-a, line 11): spec.pool: unknown field (did you mean pools?)"},
		},
		{
			name: "NodeConfig spec error in a later document",
			yaml: func(t *testing.T) string { return multiDoc(podsDoc, edit(t, ncDoc, "asn: 4200000001", "asn: 0")) },
			want: []string{"document 2 (NodeConfig/node-a, line 11): spec.asn: 0"},
		},
		{
			name: "YAML syntax error names the file's line",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "use: [pod]", "use: [pod"))
			},
			want: []string{"document 2 (line 12)", "yaml: line 19:"},
		},
		{
			name: "two AddressPools with one name",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, podsDoc, edit(t, anycastDoc, "name: dns-anycast", "name: pods"))
			},
			want: []string{"document 3 (AddressPool/pods, line 22)", `metadata.name: "pods" is also the name of document 2 (AddressPool/pods, line 12)`},
		},
		{
			name: "AddressPool without a name",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, edit(t, podsDoc, "  name: pods\n", "")) },
			want: []string{"document 2 (AddressPool, line 12)", "metadata.name: empty"},
		},
		{
			name: "AddressPool without a name and a bad field",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, edit(t, podsDoc, "  name: pods\n", ""), "use: [pod]", "use: [pods]"))
			},
			want: []string{"document 2 (AddressPool, line 12)", "metadata.name: empty", `spec.use[0]: "pods" is not a use`},
		},
		{
			name: "AddressPool name not a DNS subdomain",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, edit(t, podsDoc, "name: pods", "name: Pods_1")) },
			want: []string{"document 2 (AddressPool/Pods_1, line 12)", `metadata.name: "Pods_1" is not a valid name`},
		},
		{
			name: "AddressPool with a namespace",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "  name: pods\n", "  name: pods\n  namespace: prod\n"))
			},
			want: []string{"document 2 (AddressPool/pods, line 12)", `metadata.namespace: "prod"`, "cluster-scoped"},
		},
		{
			name: "AddressPool that says nothing of who may use it",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "  namespaces: [prod, staging]\n", ""))
			},
			want: []string{"document 2 (AddressPool/pods, line 12)", "spec: neither namespaces nor namespaceSelector"},
		},
		{
			name: "AddressPool with a status",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, podsDoc+"status: {claims: 3}\n") },
			want: []string{"document 2 (AddressPool/pods, line 12)", "status:", "leave it out"},
		},
		{
			name: "bad CIDR",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "198.51.100.128/26", "198.51.100.128/33"))
			},
			want: []string{"document 2 (AddressPool/pods, line 12)", `addresspool "pods": spec.cidrs[1]: "198.51.100.128/33" is not a CIDR`},
		},
		{
			name: "CIDR with host bits",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "198.51.100.128/26", "198.51.100.130/26"))
			},
			want: []string{"document 2 (AddressPool/pods, line 12)", `spec.cidrs[1]: "198.51.100.130/26" has host bits set`, "198.51.100.128/26"},
		},
		{
			name: "no CIDRs",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, `cidrs: ["2001:db8:100::/112", 198.51.100.128/26]`, "cidrs: []"))
			},
			want: []string{"document 2 (AddressPool/pods, line 12)", "spec.cidrs: at least one CIDR"},
		},
		{
			name: "overlap of a pod pool",
			yaml: func(t *testing.T) string {
				p := edit(t, edit(t, anycastDoc, "name: dns-anycast", "name: tenant-pods"), `"2001:db8:53::/120"`, `"2001:db8:100::80/121"`)
				return multiDoc(ncDoc, podsDoc, edit(t, p, "use: [anycast]", "use: [anycast, pod]"))
			},
			want: []string{"document 3 (AddressPool/tenant-pods, line 22)", `addresspool "tenant-pods": spec.cidrs[0]: 2001:db8:100::80/121 overlaps addresspool "pods" spec.cidrs[0] 2001:db8:100::/112, both for use pod`},
		},
		{
			name: "empty use",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, edit(t, podsDoc, "use: [pod]", "use: []")) },
			want: []string{"document 2 (AddressPool/pods, line 12)", "spec.use: empty"},
		},
		{
			name: "use missing",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, edit(t, podsDoc, "  use: [pod]\n", "")) },
			want: []string{"document 2 (AddressPool/pods, line 12)", "spec.use: empty"},
		},
		{
			name: "unknown use",
			yaml: func(t *testing.T) string { return multiDoc(ncDoc, edit(t, podsDoc, "use: [pod]", "use: [pod, cidr6]")) },
			want: []string{"document 2 (AddressPool/pods, line 12)", `spec.use[1]: "cidr6" is not a use`},
		},
		{
			name: "bad namespace",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, podsDoc, "[prod, staging]", "[prod, Staging]"))
			},
			want: []string{"document 2 (AddressPool/pods, line 12)", `spec.namespaces[1]: "Staging"`},
		},
		{
			name: "bad namespaceSelector",
			yaml: func(t *testing.T) string {
				return multiDoc(ncDoc, edit(t, addressesDoc, "operator: In", "operator: Within"))
			},
			want: []string{"document 2 (AddressPool/ingress, line 12)", "spec.namespaceSelector", `"Within"`},
		},
		{
			name: "AddressPool named like an implicit pool",
			yaml: func(t *testing.T) string {
				return multiDoc(sharedNC, edit(t, anycastDoc, "name: dns-anycast", "name: nodeconfig-pool-2"))
			},
			want: []string{"document 2 (AddressPool/nodeconfig-pool-2, line 15)", `metadata.name: "nodeconfig-pool-2" is the name of the implicit AddressPool`, "spec.pools[2]"},
		},
		{
			name: "AddressPool overlapping a deprecated shared pool",
			yaml: func(t *testing.T) string { return multiDoc(sharedNC, podsDoc) },
			want: []string{"document 2 (AddressPool/pods, line 15)", `overlaps addresspool "nodeconfig-pool-2"`,
				"AddressPool nodeconfig-pool-2 is the NodeConfig's deprecated shared pool spec.pools[2]: move that pool out of the NodeConfig"},
		},
		{
			name: "deprecated shared pool that is no valid AddressPool",
			yaml: func(t *testing.T) string { return edit(t, sharedNC, "namespaces: [prod]", "namespaces: [Prod]") },
			want: []string{"document 1 (NodeConfig/node-a, line 1): spec.pools[2] (deprecated shared pool, read as the implicit AddressPool nodeconfig-pool-2)", `spec.namespaces[0]: "Prod"`},
		},
		{
			name: "every error of every document together",
			yaml: func(t *testing.T) string {
				return multiDoc(edit(t, ncDoc, "asn: 4200000001", "asn: 0"), edit(t, podsDoc, "use: [pod]", "use: []"),
					edit(t, anycastDoc, "kind: AddressPool", "kind: Pool"), edit(t, addressesDoc, "203.0.113.64/26", "bad"))
			},
			want: []string{"document 1 (NodeConfig/node-a, line 1): spec.asn", "document 2 (AddressPool/pods, line 12)", "spec.use: empty",
				`document 3 (Pool/dns-anycast, line 22): kind: "Pool"`, `document 4 (AddressPool/ingress, line 32)`, `spec.cidrs[0]: "bad" is not a CIDR`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.yaml(t)
			f, err := nodeconfig.Parse([]byte(data))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s\n=> %+v", data, f)
			}
			if f != nil {
				t.Errorf("Parse returned a file together with error %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			// One error a line, each naming its document (or the file).
			for _, l := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(l, "document ") && !strings.HasPrefix(l, "no NodeConfig document") {
					t.Errorf("error line %q names no document", l)
				}
			}
		})
	}
}

// The line numbers the errors give are those of the file.
func TestParseDocumentLines(t *testing.T) {
	data := "# header\n---\n" + multiDoc(ncDoc, podsDoc, "# only a comment\n", strings.Replace(anycastDoc, "use: [anycast]", "use: [pod, pod]", 1))
	_, err := nodeconfig.Parse([]byte(data))
	if err == nil {
		t.Fatal("accepted a pool with use pod twice")
	}
	// Lines: 1 comment, 2 "---", 3-12 NodeConfig, 13 "---", 14-22 pods,
	// 23 "---", 24 comment, 25 "---", 26 dns-anycast.
	want := "document 3 (AddressPool/dns-anycast, line 26)"
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `spec.use[1]: "pod" is listed twice`) {
		t.Errorf("error %q, want %q and the field", err, want)
	}
}

func TestLegacyPools(t *testing.T) {
	spec := v1alpha1.NodeConfigSpec{Pools: []v1alpha1.Pool{
		{CIDR: "fd00:10:1::/64"},
		{CIDR: "2001:db8:100::/120", Shared: true, Namespaces: []string{"prod", "staging"}},
		{CIDR: "10.1.1.0/24"},
		{CIDR: "198.51.100.0/28", Shared: true},
	}}
	pools, warnings := nodeconfig.LegacyPools(&spec)
	tm := metav1.TypeMeta{APIVersion: "flock.fritzlab.net/v1alpha1", Kind: "AddressPool"}
	want := []v1alpha1.AddressPool{
		{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: "nodeconfig-pool-1"}, Spec: v1alpha1.AddressPoolSpec{
			CIDRs: []string{"2001:db8:100::/120"}, Use: []string{"pod"}, Namespaces: []string{"prod", "staging"}}},
		{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: "nodeconfig-pool-3"}, Spec: v1alpha1.AddressPoolSpec{
			CIDRs: []string{"198.51.100.0/28"}, Use: []string{"pod"}, NamespaceSelector: &metav1.LabelSelector{}}},
	}
	if !reflect.DeepEqual(pools, want) {
		t.Errorf("LegacyPools\n got %+v\nwant %+v", pools, want)
	}
	if n := nodeconfig.LegacyPoolName(3); n != "nodeconfig-pool-3" {
		t.Errorf("LegacyPoolName(3) = %q", n)
	}
	if len(warnings) != 2 {
		t.Fatalf("%d warnings, want 2: %q", len(warnings), warnings)
	}
	for i, w := range []struct {
		index string
		want  []string
	}{
		{"1", []string{"spec.pools[1]", "2001:db8:100::/120", "deprecated", "nodeconfig-pool-1", "use pod", "namespaces prod, staging", "move it out of the NodeConfig into an AddressPool"}},
		{"3", []string{"spec.pools[3]", "198.51.100.0/28", "deprecated", "nodeconfig-pool-3", "every namespace", "empty namespaces list meant every namespace", "namespaceSelector {}"}},
	} {
		for _, s := range w.want {
			if !strings.Contains(warnings[i], s) {
				t.Errorf("warning %q lacks %q", warnings[i], s)
			}
		}
		// The warning ends with the AddressPool to write: it is that pool.
		_, obj, ok := strings.Cut(warnings[i], "into an AddressPool: ")
		if !ok {
			t.Fatalf("warning %q gives no AddressPool", warnings[i])
		}
		var ap v1alpha1.AddressPool
		dec := json.NewDecoder(strings.NewReader(obj))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ap); err != nil {
			t.Fatalf("warning's AddressPool %s: %v", obj, err)
		}
		if !reflect.DeepEqual(ap, pools[i]) {
			t.Errorf("warning's AddressPool %+v, want %+v", ap, pools[i])
		}
	}

	// The copy does not share the spec's memory.
	pools[0].Spec.Namespaces[0] = "changed"
	if spec.Pools[1].Namespaces[0] != "prod" {
		t.Error("LegacyPools aliases the spec's namespaces")
	}

	// No shared pool, no implicit pool and no warning.
	if p, w := nodeconfig.LegacyPools(&v1alpha1.NodeConfigSpec{Pools: []v1alpha1.Pool{{CIDR: "fd00::/64"}}}); p != nil || w != nil {
		t.Errorf("LegacyPools without shared pools = %v, %v", p, w)
	}
}

// The implicit pools decide as the shared pools' namespaces did: listed
// namespaces only, or every namespace for an empty list.
func TestLegacyPoolsAuthorize(t *testing.T) {
	spec := v1alpha1.NodeConfigSpec{Pools: []v1alpha1.Pool{
		{CIDR: "2001:db8:100::/120", Shared: true, Namespaces: []string{"prod"}},
		{CIDR: "198.51.100.0/28", Shared: true},
	}}
	pools, _ := nodeconfig.LegacyPools(&spec)
	set, err := authz.Compile(pools)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		use, value, ns, pool string
	}{
		{"pod", "2001:db8:100::/124", "prod", "nodeconfig-pool-0"},
		{"pod", "2001:db8:100::/124", "tenant-a", ""},
		{"pod", "198.51.100.0/30", "tenant-a", "nodeconfig-pool-1"},
		{"pod", "198.51.100.0/30", "kube-system", "nodeconfig-pool-1"},
		{"anycast", "198.51.100.1/32", "prod", ""},
		{"addresses", "2001:db8:100::1/128", "prod", ""},
	} {
		p, err := set.Authorize(tc.use, netip.MustParsePrefix(tc.value), tc.ns, nil)
		var denied *authz.Denied
		if p.Name != tc.pool || (tc.pool == "") != errors.As(err, &denied) {
			t.Errorf("Authorize(%s %s ns %s) = %q, %v; want pool %q", tc.use, tc.value, tc.ns, p.Name, err, tc.pool)
		}
	}
}

// The migration the warning asks for: the NodeConfig without its shared
// pools plus the AddressPools the warnings give is a valid file that
// decides the same way.
func TestLegacyPoolsMigration(t *testing.T) {
	old, err := nodeconfig.Parse([]byte(goodYAML)) // spec.pools[2] is shared, namespaces prod, staging
	if err != nil {
		t.Fatal(err)
	}
	legacy, warnings := nodeconfig.LegacyPools(&old.Spec)
	if len(legacy) != 1 || len(warnings) != 1 {
		t.Fatalf("LegacyPools(goodYAML) = %d pools, %d warnings; want 1 each", len(legacy), len(warnings))
	}
	_, obj, _ := strings.Cut(warnings[0], "into an AddressPool: ")
	migrated := strings.Replace(goodYAML, "    - cidr: 2001:db8:100::/120\n      shared: true\n      namespaces: [prod, staging]\n", "", 1) + "---\n" + obj + "\n"
	f, err := nodeconfig.Parse([]byte(migrated))
	if err != nil {
		t.Fatalf("migrated file:\n%s\n%v", migrated, err)
	}
	if p, w := nodeconfig.LegacyPools(&f.Spec); p != nil || w != nil {
		t.Errorf("migrated file still has shared pools: %v", w)
	}
	if !reflect.DeepEqual(f.AddressPools, legacy) {
		t.Errorf("migrated AddressPools %+v, want %+v", f.AddressPools, legacy)
	}
}
