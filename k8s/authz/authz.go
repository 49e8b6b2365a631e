// Package authz decides who may use which address for what: the
// AddressPools (cluster-scoped objects, or extra documents in the
// standalone node-config file) say which CIDRs may be used as pod
// addresses (cidr6/cidr4), anycast or `addresses` IPs, Service
// LoadBalancer addresses or external IPs, and by which namespaces. Every such value a pod asks for must be covered by a pool
// that allows that use to the pod's namespace; the node's own summary pools
// stay open to every pod and need no AddressPool.
//
// The agent asks it for pods' addresses, k8s/lbcontroller for Services'.
package authz

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// Pool is an AddressPool ready for decisions.
type Pool struct {
	Name       string
	CIDRs      []netip.Prefix
	Use        []string
	Namespaces []string
	// Selector matches more namespaces by label; nil matches none.
	Selector labels.Selector
	// Aggregate: Service addresses go out as the pool's CIDR.
	Aggregate bool
}

// CIDROf is the pool's CIDR holding ip (invalid if none does).
func (p Pool) CIDROf(ip netip.Addr) netip.Prefix {
	for _, c := range p.CIDRs {
		if c.Contains(ip) {
			return c
		}
	}
	return netip.Prefix{}
}

// Uses reports whether the pool allows use.
func (p Pool) Uses(use string) bool { return slices.Contains(p.Use, use) }

// Allows reports whether a namespace (with its labels) may use the pool.
func (p Pool) Allows(namespace string, nsLabels labels.Set) bool {
	if slices.Contains(p.Namespaces, namespace) {
		return true
	}
	return p.Selector != nil && p.Selector.Matches(nsLabels)
}

// covers reports whether one of the pool's CIDRs contains want entirely.
func (p Pool) covers(want netip.Prefix) bool {
	for _, c := range p.CIDRs {
		if c.Addr().Is4() == want.Addr().Is4() && c.Bits() <= want.Bits() && c.Contains(want.Addr()) {
			return true
		}
	}
	return false
}

// Set is an immutable set of valid pools plus the errors of the invalid
// ones (which authorize nothing).
type Set struct {
	pools   []Pool
	invalid map[string]error // pool name → why it is ignored
	// invalidCIDRs are the parseable CIDRs of the invalid pools, to name
	// the pool an operator must fix when an address is refused.
	invalidCIDRs map[string][]netip.Prefix
}

// Pools returns the valid pools, sorted by name.
func (s *Set) Pools() []Pool {
	if s == nil {
		return nil
	}
	return s.pools
}

// Invalid returns why each ignored pool is ignored, by name.
func (s *Set) Invalid() map[string]error {
	if s == nil {
		return nil
	}
	return s.invalid
}

// Compile validates the pools. A pool with a bad field, or one whose CIDR
// overlaps a pool (of a name sorting first) that shares a use, is left out
// and its error returned too; the rest are usable. Every error names the
// pool, the field and the value.
func Compile(in []v1alpha1.AddressPool) (*Set, error) {
	sorted := slices.Clone(in)
	slices.SortFunc(sorted, func(a, b v1alpha1.AddressPool) int { return cmp.Compare(a.Name, b.Name) })
	s := &Set{invalid: map[string]error{}, invalidCIDRs: map[string][]netip.Prefix{}}
	var errs []error
	for _, ap := range sorted {
		p, err := compile(ap)
		if err == nil {
			err = s.overlap(p)
		}
		if err != nil {
			s.invalid[ap.Name] = err
			for _, c := range ap.Spec.CIDRs {
				if pfx, perr := netip.ParsePrefix(c); perr == nil {
					s.invalidCIDRs[ap.Name] = append(s.invalidCIDRs[ap.Name], pfx.Masked())
				}
			}
			errs = append(errs, err)
			continue
		}
		s.pools = append(s.pools, p)
	}
	return s, errors.Join(errs...)
}

// Validate checks one pool on its own (the fields; overlaps need the set).
func Validate(ap v1alpha1.AddressPool) error {
	_, err := compile(ap)
	return err
}

func compile(ap v1alpha1.AddressPool) (Pool, error) {
	name := ap.Name
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("addresspool %q: "+format, append([]any{name}, a...)...))
	}
	if name == "" {
		bad("metadata.name: empty")
	}
	p := Pool{Name: name}
	if len(ap.Spec.CIDRs) == 0 {
		bad("spec.cidrs: at least one CIDR is required")
	}
	for i, c := range ap.Spec.CIDRs {
		pfx, err := netip.ParsePrefix(c)
		switch {
		case err != nil:
			bad("spec.cidrs[%d]: %q is not a CIDR", i, c)
			continue
		case pfx.Masked() != pfx:
			bad("spec.cidrs[%d]: %q has host bits set (did you mean %s?)", i, c, pfx.Masked())
			continue
		case pfx.Addr().Zone() != "" || pfx.Addr().Is4In6():
			bad("spec.cidrs[%d]: %q: use a plain IPv6 or IPv4 prefix", i, c)
			continue
		}
		for j, q := range p.CIDRs {
			if q.Overlaps(pfx) {
				bad("spec.cidrs[%d]: %s overlaps spec.cidrs[%d] %s", i, pfx, j, q)
			}
		}
		p.CIDRs = append(p.CIDRs, pfx)
	}
	if len(ap.Spec.Use) == 0 {
		bad("spec.use: empty; want one or more of %s", strings.Join(v1alpha1.Uses, ", "))
	}
	for i, u := range ap.Spec.Use {
		switch {
		case !slices.Contains(v1alpha1.Uses, u):
			bad("spec.use[%d]: %q is not a use; want %s", i, u, strings.Join(v1alpha1.Uses, ", "))
		case slices.Contains(p.Use, u):
			bad("spec.use[%d]: %q is listed twice", i, u)
		default:
			p.Use = append(p.Use, u)
		}
	}
	for i, ns := range ap.Spec.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			bad("spec.namespaces[%d]: %q is not a namespace name: %s", i, ns, strings.Join(msgs, "; "))
			continue
		}
		p.Namespaces = append(p.Namespaces, ns)
	}
	if ap.Spec.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(ap.Spec.NamespaceSelector)
		if err != nil {
			bad("spec.namespaceSelector: %v", err)
		}
		p.Selector = sel
	}
	if ap.Spec.Aggregate {
		for i, u := range p.Use {
			if u != v1alpha1.UseLoadBalancer && u != v1alpha1.UseExternalIP {
				bad("spec.aggregate: true with spec.use[%d] %q; aggregate is for pools of use %s and %s only", i, u, v1alpha1.UseLoadBalancer, v1alpha1.UseExternalIP)
			}
		}
		p.Aggregate = true
	}
	if len(errs) > 0 {
		return Pool{}, errors.Join(errs...)
	}
	return p, nil
}

// overlap: two pools that share a use must not share addresses (one IP,
// one pool, one answer to "who may use it"). Nor may a loadBalancer pool
// share addresses with an anycast or externalIP one: those uses are not
// claimed cluster-wide, so a Service's assigned address could not be kept
// from colliding with them.
func (s *Set) overlap(p Pool) error {
	for _, q := range s.pools {
		for _, u := range p.Use {
			for _, v := range q.Use {
				if !usesConflict(u, v) {
					continue
				}
				for i, c := range p.CIDRs {
					for j, d := range q.CIDRs {
						if !c.Overlaps(d) {
							continue
						}
						if u == v {
							return fmt.Errorf("addresspool %q: spec.cidrs[%d]: %s overlaps addresspool %q spec.cidrs[%d] %s, both for use %s", p.Name, i, c, q.Name, j, d, u)
						}
						return fmt.Errorf("addresspool %q: spec.cidrs[%d]: %s (use %s) overlaps addresspool %q spec.cidrs[%d] %s (use %s): a loadBalancer address must not be an anycast or external IP", p.Name, i, c, u, q.Name, j, d, v)
					}
				}
			}
		}
	}
	return nil
}

// usesConflict: pools of these two uses must not share addresses.
func usesConflict(u, v string) bool {
	if u == v {
		return true
	}
	if v == v1alpha1.UseLoadBalancer {
		u, v = v, u
	}
	return u == v1alpha1.UseLoadBalancer && (v == v1alpha1.UseAnycast || v == v1alpha1.UseExternalIP)
}

// Denied is an address a pod may not use.
type Denied struct {
	Use   string       // pod, anycast, addresses
	Value netip.Prefix // an IP (as /128, /32) or a cidr6/cidr4 range
	// Namespace of the pod.
	Namespace string
	Reason    string
}

func (e *Denied) Error() string {
	return fmt.Sprintf("%s: %s", value(e.Value), e.Reason)
}

func value(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// Authorize finds the pool that lets namespace (labelled nsLabels) use
// want (an IP as /128 or /32, or a cidr6/cidr4 range) for use, or says
// precisely why none does.
func (s *Set) Authorize(use string, want netip.Prefix, namespace string, nsLabels labels.Set) (Pool, error) {
	deny := func(reason string) (Pool, error) {
		// An invalid pool that covers the value is what to fix, likely.
		if names := s.invalidCovering(want); len(names) > 0 {
			reason += fmt.Sprintf("; AddressPool %s covers it but is invalid: %v", names[0], s.invalid[names[0]])
		}
		return Pool{}, &Denied{Use: use, Value: want, Namespace: namespace, Reason: reason}
	}
	var covering, usable []Pool
	for _, p := range s.Pools() {
		if !p.covers(want) {
			continue
		}
		covering = append(covering, p)
		if p.Uses(use) {
			usable = append(usable, p)
			if p.Allows(namespace, nsLabels) {
				return p, nil
			}
		}
	}
	switch {
	case len(usable) > 0:
		return deny(fmt.Sprintf("no AddressPool allows namespace %s to use %s as %s (AddressPool %s allows it to %s)",
			namespace, value(want), use, usable[0].Name, who(usable[0])))
	case len(covering) > 0:
		return deny(fmt.Sprintf("no AddressPool allows namespace %s to use %s as %s (AddressPool %s covers it for use %s only)",
			namespace, value(want), use, covering[0].Name, strings.Join(covering[0].Use, ", ")))
	}
	return deny(fmt.Sprintf("no AddressPool allows namespace %s to use %s as %s (none covers it)", namespace, value(want), use))
}

// invalidCovering names the invalid pools whose CIDRs (as written) cover
// want, to point an operator at the pool to fix.
func (s *Set) invalidCovering(want netip.Prefix) []string {
	if s == nil {
		return nil
	}
	var out []string
	for name, cidrs := range s.invalidCIDRs {
		if (Pool{CIDRs: cidrs}).covers(want) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func who(p Pool) string {
	var parts []string
	if len(p.Namespaces) > 0 {
		parts = append(parts, "namespaces "+strings.Join(p.Namespaces, ", "))
	}
	if p.Selector != nil {
		if p.Selector.Empty() {
			parts = append(parts, "every namespace")
		} else {
			parts = append(parts, "namespaces labelled "+p.Selector.String())
		}
	}
	if len(parts) == 0 {
		return "nobody"
	}
	return strings.Join(parts, " and ")
}

// SummaryOverlaps finds this node's summaries that overlap another node's
// summary or an AddressPool (valid or not: an operator's intent either
// way). Advertising such a summary could draw another node's or the
// cluster's traffic: the reason names what it overlaps, for the log and
// the NodeConfig status of both nodes.
func SummaryOverlaps(node string, mine []netip.Prefix, others map[string][]netip.Prefix, pools []v1alpha1.AddressPool) map[netip.Prefix]string {
	out := map[netip.Prefix]string{}
	add := func(p netip.Prefix, why string) {
		if out[p] == "" {
			out[p] = why
		} else {
			out[p] += "; " + why
		}
	}
	names := make([]string, 0, len(others))
	for n := range others {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, p := range mine {
		for _, n := range names {
			if n == node {
				continue
			}
			for _, q := range others[n] {
				if p.Overlaps(q) {
					add(p, fmt.Sprintf("summary %s overlaps node %s's summary %s", p, n, q))
				}
			}
		}
		for _, ap := range pools {
			for i, c := range ap.Spec.CIDRs {
				if q, err := netip.ParsePrefix(c); err == nil && p.Overlaps(q.Masked()) {
					add(p, fmt.Sprintf("summary %s overlaps AddressPool %s spec.cidrs[%d] %s", p, ap.Name, i, q.Masked()))
				}
			}
		}
	}
	return out
}
