package authz

import (
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// fuzzPools reads FuzzCompile's compact pool list: one pool a line,
// "name|cidr,cidr|use,use|namespace,namespace|selector", the selector ""
// (none), "*" (every namespace) or comma-separated "key=value" (matchLabels)
// and "key:Operator:value value" (matchExpressions). A name seen before is
// skipped: pool names are unique, in the API server as in the node-config
// file.
func fuzzPools(s string) []v1alpha1.AddressPool {
	list := func(f string) []string {
		if f == "" {
			return nil
		}
		return strings.Split(f, ",")
	}
	var out []v1alpha1.AddressPool
	seen := map[string]bool{}
	for line := range strings.SplitSeq(s, "\n") {
		f := strings.SplitN(line, "|", 5)
		f = append(f, make([]string, 5-len(f))...)
		if seen[f[0]] {
			continue
		}
		seen[f[0]] = true
		ap := v1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: f[0]},
			Spec: v1alpha1.AddressPoolSpec{CIDRs: list(f[1]), Use: list(f[2]), Namespaces: list(f[3])}}
		switch sel := f[4]; sel {
		case "":
		case "*":
			ap.Spec.NamespaceSelector = &metav1.LabelSelector{}
		default:
			ls := &metav1.LabelSelector{}
			for _, item := range strings.Split(sel, ",") {
				if k, v, ok := strings.Cut(item, "="); ok {
					if ls.MatchLabels == nil {
						ls.MatchLabels = map[string]string{}
					}
					ls.MatchLabels[k] = v
					continue
				}
				parts := strings.SplitN(item, ":", 3)
				parts = append(parts, make([]string, 3-len(parts))...)
				ls.MatchExpressions = append(ls.MatchExpressions, metav1.LabelSelectorRequirement{
					Key: parts[0], Operator: metav1.LabelSelectorOperator(parts[1]), Values: strings.Fields(parts[2])})
			}
			ap.Spec.NamespaceSelector = ls
		}
		out = append(out, ap)
	}
	return out
}

// FuzzCompile compiles arbitrary AddressPools and asks one question of the
// set. Every pool is either valid (it passes Validate; masked, plain CIDRs
// that do not overlap each other; known uses once each; namespace names) or
// invalid with an error naming it, never both; the error is nil exactly
// when none is invalid; valid pools never overlap within a use, nor a
// loadBalancer pool with an anycast or externalIP one. Authorize
// allows a value only when a valid pool covers it entirely, has the use
// and allows the namespace, and returns that pool (the only one: they do
// not overlap); otherwise it denies with a *Denied of that use, value and
// namespace.
func FuzzCompile(f *testing.F) {
	f.Fuzz(func(t *testing.T, poolText, use, value, namespace, nsLabels string) {
		in := fuzzPools(poolText)
		set, err := Compile(in)
		if set == nil {
			t.Fatalf("Compile(%+v) returned no set (err %v)", in, err)
		}
		if (err == nil) != (len(set.Invalid()) == 0) {
			t.Fatalf("Compile: error %v with %d invalid pools", err, len(set.Invalid()))
		}
		byName := map[string]v1alpha1.AddressPool{}
		for _, ap := range in {
			byName[ap.Name] = ap
		}
		if len(set.Pools())+len(set.Invalid()) != len(in) {
			t.Fatalf("Compile of %d pools: %d valid, %d invalid", len(in), len(set.Pools()), len(set.Invalid()))
		}
		for name, e := range set.Invalid() {
			if _, ok := byName[name]; !ok {
				t.Fatalf("invalid pool %q was not given", name)
			}
			if !strings.Contains(e.Error(), "addresspool "+strconv.Quote(name)) || !strings.Contains(err.Error(), e.Error()) {
				t.Fatalf("invalid pool %q: error %q (of %q)", name, e, err)
			}
		}
		pools := set.Pools()
		if !slices.IsSortedFunc(pools, func(a, b Pool) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatalf("pools not sorted by name: %v", pools)
		}
		for i, p := range pools {
			ap, ok := byName[p.Name]
			if !ok {
				t.Fatalf("valid pool %q was not given", p.Name)
			}
			if _, bad := set.Invalid()[p.Name]; bad {
				t.Fatalf("pool %q both valid and invalid", p.Name)
			}
			if err := Validate(ap); err != nil {
				t.Fatalf("pool %q is valid in the set but Validate says %v", p.Name, err)
			}
			if p.Name == "" || len(p.CIDRs) == 0 || len(p.CIDRs) != len(ap.Spec.CIDRs) || len(p.Use) == 0 {
				t.Fatalf("valid pool %+v from %+v", p, ap.Spec)
			}
			for j, c := range p.CIDRs {
				if !c.IsValid() || c.Masked() != c || c.Addr().Zone() != "" || c.Addr().Is4In6() {
					t.Fatalf("valid pool %q has CIDR %s", p.Name, c)
				}
				for _, d := range p.CIDRs[:j] {
					if c.Overlaps(d) {
						t.Fatalf("valid pool %q: %s overlaps %s", p.Name, c, d)
					}
				}
			}
			for j, u := range p.Use {
				if !slices.Contains(v1alpha1.Uses, u) || slices.Contains(p.Use[:j], u) {
					t.Fatalf("valid pool %q has uses %v", p.Name, p.Use)
				}
			}
			if (ap.Spec.NamespaceSelector == nil) != (p.Selector == nil) {
				t.Fatalf("valid pool %q: selector %v from %v", p.Name, p.Selector, ap.Spec.NamespaceSelector)
			}
			for _, q := range pools[:i] {
				for _, u := range p.Use {
					for _, v := range q.Use {
						lb := "loadBalancer"
						clash := u == v || u == lb && (v == "anycast" || v == "externalIP") || v == lb && (u == "anycast" || u == "externalIP")
						if !clash {
							continue
						}
						for _, c := range p.CIDRs {
							for _, d := range q.CIDRs {
								if c.Overlaps(d) {
									t.Fatalf("valid pools %q (%s) and %q (%s) overlap: %s and %s", q.Name, v, p.Name, u, d, c)
								}
							}
						}
					}
				}
			}
		}

		want, ok := fuzzValue(value)
		if !ok {
			return
		}
		lbls := labels.Set{}
		for kv := range strings.SplitSeq(nsLabels, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				lbls[k] = v
			}
		}
		// The oracle: the valid pools that cover want entirely, have the
		// use and allow the namespace.
		var allowed []string
		for _, p := range pools {
			covers := false
			for _, c := range p.CIDRs {
				if c.Addr().Is4() == want.Addr().Is4() && c.Bits() <= want.Bits() && c.Contains(want.Masked().Addr()) {
					covers = true
				}
			}
			if covers && slices.Contains(p.Use, use) && (slices.Contains(p.Namespaces, namespace) || (p.Selector != nil && p.Selector.Matches(lbls))) {
				allowed = append(allowed, p.Name)
			}
		}
		if len(allowed) > 1 {
			t.Fatalf("%s as %s for namespace %s is allowed by several pools: %v", want, use, namespace, allowed)
		}
		p, err := set.Authorize(use, want, namespace, lbls)
		if len(allowed) == 0 {
			var d *Denied
			if err == nil || !errors.As(err, &d) {
				t.Fatalf("Authorize(%s, %s, %s, %v) = %q, %v; no valid pool allows it", use, want, namespace, lbls, p.Name, err)
			}
			if d.Use != use || d.Value != want || d.Namespace != namespace || p.Name != "" {
				t.Fatalf("Authorize(%s, %s, %s) denial %+v, pool %q", use, want, namespace, d, p.Name)
			}
			return
		}
		if err != nil || p.Name != allowed[0] {
			t.Fatalf("Authorize(%s, %s, %s, %v) = %q, %v; want pool %q", use, want, namespace, lbls, p.Name, err, allowed[0])
		}
	})
}

// fuzzValue reads a value to authorize: a prefix, or an address as /32 or
// /128.
func fuzzValue(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p, true
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	p := netip.PrefixFrom(a, a.BitLen())
	return p, p.IsValid()
}
