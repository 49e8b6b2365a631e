package nodeconfig_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

const goodYAML = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: node-a
spec:
  asn: 4200000001
  routerID: 192.0.2.11
  pools:
    - cidr: fd00:10:1::/64
    - cidr: 10.1.1.0/24
    - cidr: 2001:db8:100::/120
      shared: true
      namespaces: [prod, staging]
  defaults:
    ipv6: true
    ipv4: true
    ipAlgo: embed:ns/8,app/16
`

func TestParseGood(t *testing.T) {
	f, err := nodeconfig.Parse([]byte(goodYAML))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if f.APIVersion != nodeconfig.APIVersion || f.Kind != nodeconfig.Kind || f.Metadata.Name != "node-a" {
		t.Errorf("header = %q %q %q", f.APIVersion, f.Kind, f.Metadata.Name)
	}
	s := f.Spec
	if s.ASN != 4200000001 {
		t.Errorf("ASN = %d", s.ASN)
	}
	if s.RouterID != "192.0.2.11" {
		t.Errorf("RouterID = %q", s.RouterID)
	}
	wantPools := []v1alpha1.Pool{
		{CIDR: "fd00:10:1::/64"},
		{CIDR: "10.1.1.0/24"},
		{CIDR: "2001:db8:100::/120", Shared: true, Namespaces: []string{"prod", "staging"}},
	}
	if !reflect.DeepEqual(s.Pools, wantPools) {
		t.Errorf("Pools = %+v, want %+v", s.Pools, wantPools)
	}
	if s.Defaults.IPv6 == nil || !*s.Defaults.IPv6 || !s.Defaults.WantIPv6() {
		t.Errorf("Defaults.IPv6 = %v", s.Defaults.IPv6)
	}
	if !s.Defaults.IPv4 {
		t.Error("Defaults.IPv4 = false")
	}
	if s.Defaults.IPAlgo != "embed:ns/8,app/16" {
		t.Errorf("Defaults.IPAlgo = %q", s.Defaults.IPAlgo)
	}

	pools, err := nodeconfig.Pools(&s)
	if err != nil {
		t.Fatalf("Pools: %v", err)
	}
	wantIPAM := []ipam.Pool{
		{Prefix: netip.MustParsePrefix("fd00:10:1::/64"), Summary: true},
		{Prefix: netip.MustParsePrefix("10.1.1.0/24"), Summary: true},
		{Prefix: netip.MustParsePrefix("2001:db8:100::/120"), Summary: false, Namespaces: []string{"prod", "staging"}},
	}
	if !reflect.DeepEqual(pools, wantIPAM) {
		t.Errorf("Pools() = %+v, want %+v", pools, wantIPAM)
	}
	wantSum := []netip.Prefix{netip.MustParsePrefix("fd00:10:1::/64"), netip.MustParsePrefix("10.1.1.0/24")}
	if got := nodeconfig.Summaries(&s); !reflect.DeepEqual(got, wantSum) {
		t.Errorf("Summaries() = %v, want %v", got, wantSum)
	}
}

func TestParseMinimalDefaults(t *testing.T) {
	f, err := nodeconfig.Parse([]byte(`apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
spec:
  asn: 65001
  routerID: 10.0.0.1
  pools:
  - cidr: fd00::/48
`))
	if err != nil {
		t.Fatal(err)
	}
	d := f.Spec.Defaults
	if d.IPv6 != nil || !d.WantIPv6() || d.IPv4 || d.IPAlgo != "" {
		t.Errorf("defaults = %+v (WantIPv6 %v), want IPv6 on, IPv4 off, no algo", d, d.WantIPv6())
	}
	f, err = nodeconfig.Parse([]byte(`apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
spec:
  asn: 65001
  routerID: 10.0.0.1
  pools:
  - cidr: fd00::/48
  - cidr: 10.0.0.0/24
  defaults:
    ipv6: false
    ipv4: true
`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Spec.Defaults.WantIPv6() {
		t.Error("ipv6: false not honoured")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(p, []byte(goodYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := nodeconfig.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if f.Spec.ASN != 4200000001 {
		t.Errorf("ASN = %d", f.Spec.ASN)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(goodYAML, "asn: 4200000001", "asn: 0", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = nodeconfig.Load(bad)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "spec.asn") {
		t.Errorf("Load(bad) error %v: want it to name the file and spec.asn", err)
	}
	missing := filepath.Join(dir, "missing.yaml")
	if _, err := nodeconfig.Load(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Load(missing) error %v: want it to name the file", err)
	}
}

// replace returns goodYAML with old replaced by new (old must occur).
func replace(t *testing.T, old, new string) string {
	t.Helper()
	if !strings.Contains(goodYAML, old) {
		t.Fatalf("goodYAML lacks %q", old)
	}
	return strings.Replace(goodYAML, old, new, 1)
}

const header = "apiVersion: flock.fritzlab.net/v1alpha1\nkind: NodeConfig\n"

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml func(t *testing.T) string
		want []string // substrings of the error: field path and value
	}{
		{
			name: "unknown spec field (pool typo)",
			yaml: func(t *testing.T) string { return replace(t, "  pools:\n", "  pool:\n") },
			want: []string{`spec.pool: unknown field (did you mean pools?)`},
		},
		{
			name: "unknown top-level field",
			yaml: func(t *testing.T) string { return goodYAML + "status: {}\n" },
			want: []string{`: status: unknown field`},
		},
		{
			name: "unknown pool field",
			yaml: func(t *testing.T) string { return replace(t, "      shared: true\n", "      sharde: true\n") },
			want: []string{`spec.pools[2].sharde: unknown field (did you mean shared?)`},
		},
		{
			name: "unknown defaults field",
			yaml: func(t *testing.T) string { return replace(t, "    ipAlgo:", "    ipAlgorithm:") },
			want: []string{`spec.defaults.ipAlgorithm: unknown field`},
		},
		{
			name: "not YAML",
			yaml: func(t *testing.T) string { return "spec: [\n" },
			want: []string{"yaml"},
		},
		{
			name: "wrong apiVersion",
			yaml: func(t *testing.T) string {
				return replace(t, "apiVersion: flock.fritzlab.net/v1alpha1", "apiVersion: flock.fritzlab.net/v1")
			},
			want: []string{"apiVersion", `"flock.fritzlab.net/v1"`, nodeconfig.APIVersion},
		},
		{
			name: "missing apiVersion",
			yaml: func(t *testing.T) string { return replace(t, "apiVersion: flock.fritzlab.net/v1alpha1\n", "") },
			want: []string{"apiVersion", `""`},
		},
		{
			name: "wrong kind",
			yaml: func(t *testing.T) string { return replace(t, "kind: NodeConfig", "kind: NodeConfigs") },
			want: []string{"kind", `"NodeConfigs"`},
		},
		{
			name: "asn 0",
			yaml: func(t *testing.T) string { return replace(t, "asn: 4200000001", "asn: 0") },
			want: []string{"spec.asn", ": 0 "},
		},
		{
			name: "asn missing",
			yaml: func(t *testing.T) string { return replace(t, "  asn: 4200000001\n", "") },
			want: []string{"spec.asn", ": 0 "},
		},
		{
			name: "asn reserved 4294967295",
			yaml: func(t *testing.T) string { return replace(t, "asn: 4200000001", "asn: 4294967295") },
			want: []string{"spec.asn", "4294967295"},
		},
		{
			name: "asn out of uint32 range",
			yaml: func(t *testing.T) string { return replace(t, "asn: 4200000001", "asn: 4294967296") },
			want: []string{"asn"},
		},
		{
			name: "routerID IPv6",
			yaml: func(t *testing.T) string { return replace(t, "routerID: 192.0.2.11", "routerID: fd00::1") },
			want: []string{"spec.routerID", `"fd00::1"`},
		},
		{
			name: "routerID garbage",
			yaml: func(t *testing.T) string { return replace(t, "routerID: 192.0.2.11", "routerID: router-1") },
			want: []string{"spec.routerID", `"router-1"`},
		},
		{
			name: "routerID missing",
			yaml: func(t *testing.T) string { return replace(t, "  routerID: 192.0.2.11\n", "") },
			want: []string{"spec.routerID", `""`},
		},
		{
			name: "routerID IPv4-mapped",
			yaml: func(t *testing.T) string { return replace(t, "routerID: 192.0.2.11", `routerID: "::ffff:192.0.2.11"`) },
			want: []string{"spec.routerID", `"::ffff:192.0.2.11"`},
		},
		{
			name: "no pools",
			yaml: func(t *testing.T) string {
				return header + "spec:\n  asn: 65001\n  routerID: 10.0.0.1\n  pools: []\n"
			},
			want: []string{"spec.pools", "at least one pool"},
		},
		{
			name: "pools absent",
			yaml: func(t *testing.T) string { return header + "spec:\n  asn: 65001\n  routerID: 10.0.0.1\n" },
			want: []string{"spec.pools", "at least one pool"},
		},
		{
			name: "pool cidr garbage",
			yaml: func(t *testing.T) string { return replace(t, "cidr: 10.1.1.0/24", "cidr: ten-one-one") },
			want: []string{"spec.pools[1].cidr", `"ten-one-one"`, "not a CIDR"},
		},
		{
			name: "pool cidr empty",
			yaml: func(t *testing.T) string { return replace(t, "cidr: 10.1.1.0/24", `cidr: ""`) },
			want: []string{"spec.pools[1].cidr", `""`, "not a CIDR"},
		},
		{
			name: "pool host bits set",
			yaml: func(t *testing.T) string { return replace(t, "cidr: 10.1.1.0/24", "cidr: 10.1.1.5/24") },
			want: []string{"spec.pools[1].cidr", `"10.1.1.5/24"`, "did you mean 10.1.1.0/24?"},
		},
		{
			name: "pool IPv6 host bits set",
			yaml: func(t *testing.T) string { return replace(t, "cidr: 2001:db8:100::/120", "cidr: 2001:db8:100::1/120") },
			want: []string{"spec.pools[2].cidr", `"2001:db8:100::1/120"`, "did you mean 2001:db8:100::/120?"},
		},
		{
			name: "overlapping pools",
			yaml: func(t *testing.T) string {
				return replace(t, "cidr: 2001:db8:100::/120", "cidr: fd00:10:1:0:8000::/65")
			},
			want: []string{"spec.pools[2].cidr", "fd00:10:1:0:8000::/65", "overlaps", "spec.pools[0]", "fd00:10:1::/64"},
		},
		{
			name: "duplicate pools",
			yaml: func(t *testing.T) string { return replace(t, "cidr: 2001:db8:100::/120", "cidr: 10.1.1.0/24") },
			want: []string{"spec.pools[2].cidr", "10.1.1.0/24", "overlaps", "spec.pools[1]"},
		},
		{
			name: "pool with no usable address",
			yaml: func(t *testing.T) string { return replace(t, "cidr: 10.1.1.0/24", "cidr: 10.1.1.0/31") },
			want: []string{"spec.pools", "10.1.1.0/31", "no usable address"},
		},
		{
			name: "ipv4 default without an IPv4 summary",
			yaml: func(t *testing.T) string { return replace(t, "    - cidr: 10.1.1.0/24\n", "") },
			want: []string{"spec.defaults.ipv4", "no pool is a (non-shared) IPv4 node summary"},
		},
		{
			name: "ipv6 default without an IPv6 summary",
			yaml: func(t *testing.T) string { return replace(t, "    - cidr: fd00:10:1::/64\n", "") },
			want: []string{"spec.defaults.ipv6", "no pool is a (non-shared) IPv6 node summary"},
		},
		{
			name: "namespace with spaces",
			yaml: func(t *testing.T) string { return replace(t, "namespaces: [prod, staging]", `namespaces: [" prod"]`) },
			want: []string{"spec.pools[2].namespaces[0]", `" prod"`, "surrounding spaces"},
		},
		{
			name: "empty namespace entry",
			yaml: func(t *testing.T) string { return replace(t, "namespaces: [prod, staging]", `namespaces: [prod, ""]`) },
			want: []string{"spec.pools[2].namespaces[1]", `""`, "empty namespace"},
		},
		{
			name: "blank namespace entry",
			yaml: func(t *testing.T) string {
				return replace(t, "namespaces: [prod, staging]", `namespaces: ["  ", prod]`)
			},
			want: []string{"spec.pools[2].namespaces[0]", `"  "`, "empty namespace"},
		},
		{
			name: "bad defaults.ipAlgo",
			yaml: func(t *testing.T) string { return replace(t, "ipAlgo: embed:ns/8,app/16", "ipAlgo: bogus") },
			want: []string{"spec.defaults.ipAlgo", `"bogus"`},
		},
		{
			name: "bad defaults.ipAlgo embed field",
			yaml: func(t *testing.T) string { return replace(t, "ipAlgo: embed:ns/8,app/16", "ipAlgo: embed:ns/99") },
			want: []string{"spec.defaults.ipAlgo", `"embed:ns/99"`, "out of range"},
		},
		{
			name: "several errors reported together",
			yaml: func(t *testing.T) string {
				return header + "spec:\n  asn: 0\n  routerID: nope\n  pools:\n  - cidr: bad\n  defaults:\n    ipAlgo: bogus\n"
			},
			want: []string{"spec.asn", "spec.routerID", `"nope"`, "spec.pools[0].cidr", `"bad"`, "spec.defaults.ipAlgo", `"bogus"`},
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
		})
	}
}

// Validate is what the Kubernetes path uses: same checks on a spec built in
// Go.
func TestValidate(t *testing.T) {
	good := func() v1alpha1.NodeConfigSpec {
		return v1alpha1.NodeConfigSpec{
			ASN: 65001, RouterID: "10.0.0.1",
			Pools: []v1alpha1.Pool{{CIDR: "fd00:10:1::/64"}, {CIDR: "10.1.1.0/24"}},
		}
	}
	s := good()
	if err := nodeconfig.Validate(&s); err != nil {
		t.Fatalf("good spec: %v", err)
	}
	tests := []struct {
		name   string
		modify func(*v1alpha1.NodeConfigSpec)
		want   []string
	}{
		{"asn 0", func(s *v1alpha1.NodeConfigSpec) { s.ASN = 0 }, []string{"spec.asn", "0"}},
		{"router ID v6", func(s *v1alpha1.NodeConfigSpec) { s.RouterID = "::1" }, []string{"spec.routerID", `"::1"`}},
		{"no pools", func(s *v1alpha1.NodeConfigSpec) { s.Pools = nil }, []string{"spec.pools", "at least one"}},
		{"pool zone", func(s *v1alpha1.NodeConfigSpec) { s.Pools[0].CIDR = "fd00::%eth0/64" }, []string{"spec.pools[0].cidr", `"fd00::%eth0/64"`}},
		{"overlap", func(s *v1alpha1.NodeConfigSpec) {
			s.Pools = append(s.Pools, v1alpha1.Pool{CIDR: "10.0.0.0/8", Shared: true})
		}, []string{"spec.pools[2].cidr", "10.0.0.0/8", "spec.pools[1]", "10.1.1.0/24"}},
		{"algo", func(s *v1alpha1.NodeConfigSpec) { s.Defaults.IPAlgo = "embed:foo/8" }, []string{"spec.defaults.ipAlgo", "embed:foo/8", `unknown field "foo"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.modify(&s)
			err := nodeconfig.Validate(&s)
			if err == nil {
				t.Fatalf("Validate(%+v) = nil", s)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestSummariesSkipsSharedAndBad(t *testing.T) {
	s := v1alpha1.NodeConfigSpec{Pools: []v1alpha1.Pool{
		{CIDR: "fd00:10:1::/64"},
		{CIDR: "2001:db8:100::/120", Shared: true},
		{CIDR: "garbage"},
		{CIDR: "10.1.1.0/24"},
	}}
	want := []netip.Prefix{netip.MustParsePrefix("fd00:10:1::/64"), netip.MustParsePrefix("10.1.1.0/24")}
	if got := nodeconfig.Summaries(&s); !reflect.DeepEqual(got, want) {
		t.Errorf("Summaries = %v, want %v", got, want)
	}
}
