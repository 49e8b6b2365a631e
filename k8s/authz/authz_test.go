package authz

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

func pool(name string, cidrs, use, namespaces []string, sel *metav1.LabelSelector) v1alpha1.AddressPool {
	return v1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.AddressPoolSpec{CIDRs: cidrs, Use: use, Namespaces: namespaces, NamespaceSelector: sel}}
}

func ip(s string) netip.Prefix {
	a := netip.MustParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen())
}

// The decision, table-driven: use × pool × namespace × selector.
func TestAuthorize(t *testing.T) {
	set, err := Compile([]v1alpha1.AddressPool{
		pool("shared-pods", []string{"2001:db8:100::/112", "198.51.100.0/28"}, []string{"pod"}, []string{"prod"}, nil),
		pool("anycast", []string{"2001:db8:a::/64", "203.0.113.0/28"}, []string{"anycast"}, nil, &metav1.LabelSelector{MatchLabels: map[string]string{"anycast": "yes"}}),
		pool("public", []string{"2001:db8:aa::/64"}, []string{"addresses", "anycast"}, []string{"edge"}, nil),
		pool("everyone", []string{"2001:db8:ee::/64"}, []string{"addresses"}, nil, &metav1.LabelSelector{}),
		pool("nobody", []string{"2001:db8:ff::/64"}, []string{"anycast"}, nil, nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		use, value, ns string
		labels         labels.Set
		pool           string // "" = denied
		reason         string // substring of the denial
	}{
		{"pod", "2001:db8:100::/120", "prod", nil, "shared-pods", ""},
		{"pod", "2001:db8:100::7/128", "prod", nil, "shared-pods", ""},
		{"pod", "198.51.100.0/29", "prod", nil, "shared-pods", ""},
		{"pod", "2001:db8:100::/120", "tenant-a", nil, "", "no AddressPool allows namespace tenant-a to use 2001:db8:100::/120 as pod (AddressPool shared-pods allows it to namespaces prod)"},
		{"pod", "2001:db8:100::/104", "prod", nil, "", "none covers it"}, // wider than the pool
		{"anycast", "2001:db8:100::7/128", "prod", nil, "", "AddressPool shared-pods covers it for use pod only"},
		{"anycast", "2001:db8:a::1/128", "web", labels.Set{"anycast": "yes"}, "anycast", ""},
		{"anycast", "203.0.113.1/32", "web", labels.Set{"anycast": "yes", "x": "y"}, "anycast", ""},
		{"anycast", "2001:db8:a::1/128", "web", labels.Set{"anycast": "no"}, "", "namespaces labelled anycast=yes"},
		{"anycast", "2001:db8:a::1/128", "web", nil, "", "no AddressPool allows namespace web"},
		{"addresses", "2001:db8:a::1/128", "web", labels.Set{"anycast": "yes"}, "", "covers it for use anycast only"},
		{"anycast", "8.8.8.8/32", "tenant-a", nil, "", "no AddressPool allows namespace tenant-a to use 8.8.8.8 as anycast (none covers it)"},
		{"addresses", "2001:db8:aa::1/128", "edge", nil, "public", ""},
		{"anycast", "2001:db8:aa::1/128", "edge", nil, "public", ""},
		{"addresses", "2001:db8:aa::1/128", "prod", nil, "", "allows it to namespaces edge"},
		{"addresses", "2001:db8:ee::1/128", "anyone", nil, "everyone", ""},
		{"addresses", "2001:db8:ee::1/128", "anyone", labels.Set{"a": "b"}, "everyone", ""},
		{"anycast", "2001:db8:ff::1/128", "prod", nil, "", "allows it to nobody"},
	}
	for _, tc := range tests {
		t.Run(tc.use+" "+tc.value+" "+tc.ns, func(t *testing.T) {
			p, err := set.Authorize(tc.use, netip.MustParsePrefix(tc.value), tc.ns, tc.labels)
			if tc.pool != "" {
				if err != nil || p.Name != tc.pool {
					t.Fatalf("Authorize = %q, %v; want pool %q", p.Name, err, tc.pool)
				}
				return
			}
			var d *Denied
			if !errors.As(err, &d) {
				t.Fatalf("Authorize = %q, %v; want a denial", p.Name, err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("denial %q does not contain %q", err, tc.reason)
			}
			if d.Use != tc.use || d.Namespace != tc.ns {
				t.Errorf("denial %+v", d)
			}
		})
	}
	var empty *Set
	if _, err := empty.Authorize("anycast", ip("2001:db8::1"), "x", nil); err == nil {
		t.Error("an empty set authorized something")
	}
}

// Bad pools: each error names the pool, the field and the value; the bad
// pool authorizes nothing, the good ones still work.
func TestCompileRejects(t *testing.T) {
	tests := []struct {
		name string
		pool v1alpha1.AddressPool
		want string
	}{
		{"bad CIDR", pool("p", []string{"2001:db8::/129"}, []string{"pod"}, []string{"a"}, nil), `addresspool "p": spec.cidrs[0]: "2001:db8::/129" is not a CIDR`},
		{"host bits", pool("p", []string{"10.0.0.1/24"}, []string{"pod"}, []string{"a"}, nil), `spec.cidrs[0]: "10.0.0.1/24" has host bits set (did you mean 10.0.0.0/24?)`},
		{"no CIDRs", pool("p", nil, []string{"pod"}, []string{"a"}, nil), "spec.cidrs: at least one CIDR is required"},
		{"self overlap", pool("p", []string{"10.0.0.0/24", "10.0.0.128/25"}, []string{"pod"}, []string{"a"}, nil), "spec.cidrs[1]: 10.0.0.128/25 overlaps spec.cidrs[0] 10.0.0.0/24"},
		{"empty use", pool("p", []string{"10.0.0.0/24"}, nil, []string{"a"}, nil), "spec.use: empty; want one or more of pod, anycast, addresses"},
		{"unknown use", pool("p", []string{"10.0.0.0/24"}, []string{"pods"}, []string{"a"}, nil), `spec.use[0]: "pods" is not a use`},
		{"use twice", pool("p", []string{"10.0.0.0/24"}, []string{"pod", "pod"}, []string{"a"}, nil), `spec.use[1]: "pod" is listed twice`},
		{"bad namespace", pool("p", []string{"10.0.0.0/24"}, []string{"pod"}, []string{"Prod"}, nil), `spec.namespaces[0]: "Prod" is not a namespace name`},
		{"bad selector", pool("p", []string{"10.0.0.0/24"}, []string{"pod"}, nil, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}), "spec.namespaceSelector"},
		{"aggregate a pod pool", aggregated(pool("p", []string{"10.0.0.0/24"}, []string{"loadBalancer", "pod"}, []string{"a"}, nil)), `spec.aggregate: true with spec.use[1] "pod"; aggregate is for pools of use loadBalancer and externalIP only`},
	}
	good := pool("good", []string{"2001:db8:1::/64"}, []string{"anycast"}, []string{"a"}, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			set, err := Compile([]v1alpha1.AddressPool{tc.pool, good})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Compile error %v, want one containing %q", err, tc.want)
			}
			if _, bad := set.Invalid()["p"]; !bad || len(set.Pools()) != 1 || set.Pools()[0].Name != "good" {
				t.Errorf("pools %v invalid %v", set.Pools(), set.Invalid())
			}
			if _, err := set.Authorize("anycast", ip("2001:db8:1::1"), "a", nil); err != nil {
				t.Errorf("the good pool stopped working: %v", err)
			}
		})
	}
}

// Two pools that share a use must not overlap; pools of different uses may.
func TestCompileOverlap(t *testing.T) {
	set, err := Compile([]v1alpha1.AddressPool{
		pool("b", []string{"2001:db8:1:2::/64"}, []string{"pod", "addresses"}, []string{"x"}, nil),
		pool("a", []string{"2001:db8:1::/48"}, []string{"addresses"}, []string{"x"}, nil),
		pool("c", []string{"2001:db8:1:3::/64"}, []string{"anycast"}, []string{"x"}, nil),
	})
	want := `addresspool "b": spec.cidrs[0]: 2001:db8:1:2::/64 overlaps addresspool "a" spec.cidrs[0] 2001:db8:1::/48, both for use addresses`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Compile error %v, want %q", err, want)
	}
	if len(set.Pools()) != 2 || set.Pools()[0].Name != "a" || set.Pools()[1].Name != "c" {
		t.Errorf("valid pools %v, want a and c (the one sorting first wins)", set.Pools())
	}
	// An address only the invalid pool would allow names it.
	_, err = set.Authorize("pod", ip("2001:db8:1:2::5"), "x", nil)
	if err == nil || !strings.Contains(err.Error(), `AddressPool b covers it but is invalid`) {
		t.Errorf("denial %v, want it to name the invalid pool b", err)
	}
	if _, err := set.Authorize("anycast", ip("2001:db8:1:3::5"), "x", nil); err != nil {
		t.Errorf("a pool of another use may overlap: %v", err)
	}
}

// A loadBalancer pool must not overlap an anycast or externalIP pool (those
// addresses are not claimed, so an assigned one could collide); it may
// overlap a pod or addresses pool (claimed: the claim keeps them apart).
func TestCompileOverlapLoadBalancer(t *testing.T) {
	for _, tc := range []struct {
		other string
		want  string // "" = both valid
	}{
		{"anycast", `addresspool "b": spec.cidrs[0]: 198.51.100.0/25 (use loadBalancer) overlaps addresspool "a" spec.cidrs[0] 198.51.100.0/24 (use anycast): a loadBalancer address must not be an anycast or external IP`},
		{"externalIP", `(use loadBalancer) overlaps addresspool "a" spec.cidrs[0] 198.51.100.0/24 (use externalIP)`},
		{"addresses", ""},
		{"pod", ""},
	} {
		set, err := Compile([]v1alpha1.AddressPool{
			pool("a", []string{"198.51.100.0/24"}, []string{tc.other}, []string{"x"}, nil),
			pool("b", []string{"198.51.100.0/25"}, []string{"loadBalancer"}, []string{"x"}, nil),
		})
		switch {
		case tc.want == "" && (err != nil || len(set.Pools()) != 2):
			t.Errorf("loadBalancer over %s: %v, %d valid pools; want both valid", tc.other, err, len(set.Pools()))
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || len(set.Pools()) != 1):
			t.Errorf("loadBalancer over %s: %v; want %q and only a valid", tc.other, err, tc.want)
		}
	}
	// And the other way round: the loadBalancer pool sorts first.
	_, err := Compile([]v1alpha1.AddressPool{
		pool("a", []string{"2001:db8:5::/64"}, []string{"loadBalancer"}, []string{"x"}, nil),
		pool("b", []string{"2001:db8:5::/48"}, []string{"externalIP"}, []string{"x"}, nil),
	})
	if want := `addresspool "b": spec.cidrs[0]: 2001:db8:5::/48 (use externalIP) overlaps addresspool "a" spec.cidrs[0] 2001:db8:5::/64 (use loadBalancer)`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("externalIP over loadBalancer: %v, want %q", err, want)
	}
	// The new uses authorize like the others.
	set, _ := Compile([]v1alpha1.AddressPool{pool("lb", []string{"203.0.113.0/24"}, []string{"loadBalancer"}, []string{"x"}, nil)})
	if p, err := set.Authorize("loadBalancer", ip("203.0.113.9"), "x", nil); err != nil || p.Name != "lb" {
		t.Errorf("Authorize loadBalancer: %v, %v", p.Name, err)
	}
	if _, err := set.Authorize("externalIP", ip("203.0.113.9"), "x", nil); err == nil || !strings.Contains(err.Error(), "covers it for use loadBalancer only") {
		t.Errorf("Authorize externalIP from a loadBalancer pool: %v", err)
	}
}

func TestSummaryOverlaps(t *testing.T) {
	mine := []netip.Prefix{netip.MustParsePrefix("fd00:10:1::/64"), netip.MustParsePrefix("10.10.1.0/24")}
	others := map[string][]netip.Prefix{
		"me":     mine,
		"node-b": {netip.MustParsePrefix("fd00:10:2::/64"), netip.MustParsePrefix("10.10.0.0/16")},
	}
	pools := []v1alpha1.AddressPool{pool("wide", []string{"fd00:10::/32"}, []string{"anycast"}, []string{"x"}, nil)}
	got := SummaryOverlaps("me", mine, others, pools)
	if len(got) != 2 {
		t.Fatalf("overlaps %v, want both summaries", got)
	}
	if w := "summary 10.10.1.0/24 overlaps node node-b's summary 10.10.0.0/16"; got[mine[1]] != w {
		t.Errorf("IPv4: %q, want %q", got[mine[1]], w)
	}
	if w := "summary fd00:10:1::/64 overlaps AddressPool wide spec.cidrs[0] fd00:10::/32"; got[mine[0]] != w {
		t.Errorf("IPv6: %q, want %q", got[mine[0]], w)
	}
	if got := SummaryOverlaps("me", mine, map[string][]netip.Prefix{"me": mine}, nil); len(got) != 0 {
		t.Errorf("a node overlaps itself: %v", got)
	}
}

func aggregated(p v1alpha1.AddressPool) v1alpha1.AddressPool {
	p.Spec.Aggregate = true
	return p
}

// An aggregating pool of Service addresses compiles, and names the CIDR
// each of its addresses goes out as.
func TestCompileAggregate(t *testing.T) {
	set, err := Compile([]v1alpha1.AddressPool{aggregated(pool("lb", []string{"2001:db8:1b::/64", "203.0.113.128/27"}, []string{"loadBalancer", "externalIP"}, []string{"a"}, nil))})
	if err != nil || len(set.Pools()) != 1 || !set.Pools()[0].Aggregate {
		t.Fatalf("pools %v: %v", set.Pools(), err)
	}
	p := set.Pools()[0]
	for addr, want := range map[string]string{"2001:db8:1b::7": "2001:db8:1b::/64", "203.0.113.130": "203.0.113.128/27", "203.0.113.200": "invalid Prefix"} {
		if got := p.CIDROf(netip.MustParseAddr(addr)); got.String() != want {
			t.Errorf("CIDROf(%s) = %s, want %s", addr, got, want)
		}
	}
}
