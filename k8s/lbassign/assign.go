package lbassign

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// spec is a Service's input, checked.
type spec struct {
	Service
	fams     []corev1.IPFamily // candidates, primary first
	required int               // how many of fams must be given
	rec      *record           // the attributes to record
	reqField string
	// Filled by request:
	req    map[corev1.IPFamily]netip.Addr
	reqRaw map[corev1.IPFamily]string // as written, for errors
	pools  []*pool                    // usable pools, by name
}

// shape checks the families, the policy and the sharing attributes.
func (a *Allocator) shape(s Service) (*spec, error) {
	sp := &spec{Service: s, reqField: s.RequestedField}
	if sp.reqField == "" {
		sp.reqField = FieldLoadBalancerIPs
	}
	seen := map[corev1.IPFamily]bool{}
	for _, f := range s.Families {
		if f != corev1.IPv4Protocol && f != corev1.IPv6Protocol {
			return nil, &Error{Code: CodeInvalid, Field: FieldIPFamilies, Value: string(f), Reason: "not IPv4 or IPv6"}
		}
		if seen[f] {
			return nil, &Error{Code: CodeInvalid, Field: FieldIPFamilies, Value: string(f), Reason: "listed twice"}
		}
		seen[f] = true
	}
	fams := slices.Clone(s.Families)
	if len(fams) == 0 {
		def := corev1.IPv6Protocol
		if a.DefaultFamily == corev1.IPv4Protocol {
			def = corev1.IPv4Protocol
		}
		fams = []corev1.IPFamily{def}
	}
	switch s.Policy {
	case "", corev1.IPFamilyPolicySingleStack:
		sp.fams, sp.required = fams[:1], 1
	case corev1.IPFamilyPolicyPreferDualStack, corev1.IPFamilyPolicyRequireDualStack:
		// spec.ipFamilies, once the API server has filled it in, is what
		// the cluster gave the Service: PreferDualStack on a single-stack
		// cluster is one family, and kube-proxy serves no other (an
		// address of the other family would lead nowhere).
		if len(fams) == 1 && (len(s.Families) == 0 || s.Policy == corev1.IPFamilyPolicyRequireDualStack) {
			fams = append(fams, other(fams[0]))
		}
		sp.fams = fams
		if s.Policy == corev1.IPFamilyPolicyRequireDualStack {
			sp.required = 2
		}
	default:
		return nil, &Error{Code: CodeInvalid, Field: FieldIPFamilyPolicy, Value: string(s.Policy),
			Reason: "not SingleStack, PreferDualStack or RequireDualStack"}
	}
	ports := make([]Port, 0, len(s.Ports))
	for _, p := range s.Ports {
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		ports = append(ports, p)
	}
	var pools []string
	for _, n := range s.Pools {
		if n = strings.TrimSpace(n); n != "" && !slices.Contains(pools, n) {
			pools = append(pools, n)
		}
	}
	in := s
	in.Current = nil
	in.Families, in.Requested, in.Pools, in.Ports = slices.Clone(s.Families), slices.Clone(s.Requested), slices.Clone(s.Pools), slices.Clone(s.Ports)
	in.Selector = maps.Clone(s.Selector)
	sp.rec = &record{ns: s.Namespace, sharing: s.SharingKey, ports: ports, local: s.Local,
		selector: maps.Clone(s.Selector), pools: pools, in: in}
	return sp, nil
}

func (sp *spec) wants(f corev1.IPFamily) bool { return slices.Contains(sp.fams, f) }

func (sp *spec) famList() string {
	var ss []string
	for _, f := range sp.fams {
		ss = append(ss, string(f))
	}
	return strings.Join(ss, ",")
}

// request checks the address-pool annotation and the requested addresses
// (their syntax and family; usability is checked later).
func (a *Allocator) request(sp *spec) error {
	for _, n := range sp.rec.pools {
		p := a.byName[n]
		if p == nil {
			return &Error{Code: CodeUnknownPool, Field: FieldAddressPool, Value: n, Reason: "no loadBalancer AddressPool has that name"}
		}
		if !p.allowed(sp.Namespace) {
			return &Error{Code: CodePoolNotAllowed, Field: FieldAddressPool, Value: n,
				Reason: fmt.Sprintf("namespace %s may not use the pool", sp.Namespace)}
		}
	}
	for i := range a.pools {
		p := &a.pools[i]
		if p.allowed(sp.Namespace) && (len(sp.rec.pools) == 0 || slices.Contains(sp.rec.pools, p.name)) {
			sp.pools = append(sp.pools, p)
		}
	}
	sp.req = map[corev1.IPFamily]netip.Addr{}
	sp.reqRaw = map[corev1.IPFamily]string{}
	for _, raw := range sp.Requested {
		v := strings.TrimSpace(raw)
		if v == "" {
			continue
		}
		addr, err := netip.ParseAddr(v)
		switch {
		case err != nil:
			return &Error{Code: CodeInvalid, Field: sp.reqField, Value: v, Reason: "not an IP address", Err: err}
		case addr.Zone() != "":
			return &Error{Code: CodeInvalid, Field: sp.reqField, Value: v, Reason: "an address with a zone"}
		case addr.Is4In6():
			return &Error{Code: CodeInvalid, Field: sp.reqField, Value: v, Reason: "an IPv4-mapped IPv6 address; write it as IPv4"}
		}
		f := family(addr)
		if !sp.wants(f) {
			return &Error{Code: CodeWrongFamily, Field: sp.reqField, Value: v,
				Reason: fmt.Sprintf("an %s address, but the Service gets only %s (%s %s)", f, sp.famList(), FieldIPFamilyPolicy, policyName(sp.Policy))}
		}
		if prev, ok := sp.req[f]; ok {
			return &Error{Code: CodeWrongFamily, Field: sp.reqField, Value: v,
				Reason: fmt.Sprintf("a second %s address (%s is one); at most one per family", f, prev)}
		}
		sp.req[f], sp.reqRaw[f] = addr, v
	}
	return nil
}

func policyName(p corev1.IPFamilyPolicy) corev1.IPFamilyPolicy {
	if p == "" {
		return corev1.IPFamilyPolicySingleStack
	}
	return p
}

// usable says why addr (written value) may not be given to sp, or nil.
// The errors are for a requested address: an address kept silently moves.
func (a *Allocator) usable(sp *spec, addr netip.Addr, value string) error {
	if !slices.ContainsFunc(sp.pools, func(p *pool) bool { return p.contains(addr) }) {
		return &Error{Code: CodeNotInPool, Field: sp.reqField, Value: value, Reason: a.whyNotInPool(sp, addr)}
	}
	if by, ok := a.reserved[addr]; ok {
		return &Error{Code: CodeReserved, Field: sp.reqField, Value: value, Reason: "reserved by " + by}
	}
	if why := a.conflict(sp, addr); why != "" {
		return &Error{Code: CodeInUse, Field: sp.reqField, Value: value, Reason: why}
	}
	return nil
}

func (a *Allocator) whyNotInPool(sp *spec, addr netip.Addr) string {
	var in, allowed []string
	for i := range a.pools {
		if p := &a.pools[i]; p.contains(addr) {
			in = append(in, p.name)
			if p.allowed(sp.Namespace) {
				allowed = append(allowed, p.name)
			}
		}
	}
	switch {
	case len(in) == 0:
		return "in no loadBalancer AddressPool"
	case len(allowed) == 0:
		return fmt.Sprintf("in pool %s, which namespace %s may not use", strings.Join(in, ", "), sp.Namespace)
	default:
		return fmt.Sprintf("in pool %s, not in the pool(s) %s names (%s)", strings.Join(allowed, ", "),
			FieldAddressPool, strings.Join(sp.rec.pools, ", "))
	}
}

// conflict says why addr, held by other Services, may not be shared with
// sp, naming the first such Service in key order; "" if it may.
func (a *Allocator) conflict(sp *spec, addr netip.Addr) string {
	for _, key := range a.Owners(addr) {
		if key == sp.Key {
			continue
		}
		o := a.svcs[key]
		switch {
		case o.ns != sp.Namespace:
			// A sharing key is anyone's to read: across namespaces it would
			// let one namespace join, and then pin, another's address.
			return fmt.Sprintf("in use by Service %s of another namespace; an address is shared only within one namespace", key)
		case o.sharing == "":
			return fmt.Sprintf("in use by Service %s, which does not allow sharing (%s)", key, AnnotationAllowSharedIP)
		case sp.rec.sharing == "":
			return fmt.Sprintf("in use by Service %s; sharing needs %s on both", key, AnnotationAllowSharedIP)
		case o.sharing != sp.rec.sharing:
			return fmt.Sprintf("in use by Service %s with %s %q, not %q", key, AnnotationAllowSharedIP, o.sharing, sp.rec.sharing)
		case o.local != sp.rec.local:
			return fmt.Sprintf("in use by Service %s with externalTrafficPolicy %s, not %s", key, etp(o.local), etp(sp.rec.local))
		case sp.rec.local && !maps.Equal(o.selector, sp.rec.selector):
			return fmt.Sprintf("in use by Service %s with selector %s, not %s; Local Services share an address only with the same selector",
				key, selectorString(o.selector), selectorString(sp.rec.selector))
		}
		for _, p := range sp.rec.ports {
			if slices.Contains(o.ports, p) {
				return fmt.Sprintf("port %s is also used by Service %s", p, key)
			}
		}
	}
	return ""
}

func etp(local bool) corev1.ServiceExternalTrafficPolicy {
	if local {
		return corev1.ServiceExternalTrafficPolicyLocal
	}
	return corev1.ServiceExternalTrafficPolicyCluster
}

func selectorString(m map[string]string) string {
	if len(m) == 0 {
		return "{}"
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		kv = append(kv, k+"="+m[k])
	}
	return strings.Join(kv, ",")
}

// Assign returns the Service's addresses, one per family it gets, primary
// family first, and records them. Per family: the requested address if
// any; else the address it has (Current, then what the allocator recorded)
// while still valid; else the first usable address of its pools. On error
// (an *Error) nothing changes.
func (a *Allocator) Assign(s Service) ([]netip.Addr, error) {
	sp, err := a.shape(s)
	if err != nil {
		return nil, err
	}
	if err := a.request(sp); err != nil {
		return nil, err
	}
	var had []netip.Addr
	had = append(had, s.Current...)
	if r := a.svcs[s.Key]; r != nil {
		had = append(had, r.addrs...)
	}
	// Every request first, so that its error wins over exhaustion.
	for _, f := range sp.fams {
		if addr, ok := sp.req[f]; ok {
			if err := a.usable(sp, addr, sp.reqRaw[f]); err != nil {
				return nil, err
			}
			if SubnetRouterAnycast(addr) && !slices.Contains(had, addr) {
				return nil, &Error{Code: CodeReserved, Field: sp.reqField, Value: sp.reqRaw[f],
					Reason: fmt.Sprintf("the Subnet-Router anycast address of %s (RFC 4291 §2.6.1): routers on that subnet answer it", netip.PrefixFrom(addr, 64))}
			}
		}
	}
	var out []netip.Addr
	var missing []corev1.IPFamily // families with no address and no error yet
	for i, f := range sp.fams {
		if addr, ok := sp.req[f]; ok {
			out = append(out, addr)
			continue
		}
		if j := slices.IndexFunc(had, func(h netip.Addr) bool { return family(h) == f && a.usable(sp, h, "") == nil }); j >= 0 {
			out = append(out, had[j])
			continue
		}
		if addr, ok := a.free(sp, f); ok {
			out = append(out, addr)
			continue
		}
		if i < sp.required {
			return nil, a.noFree(sp, []corev1.IPFamily{f})
		}
		missing = append(missing, f)
	}
	if len(out) == 0 {
		return nil, a.noFree(sp, missing)
	}
	sp.rec.addrs = out
	a.record(s.Key, sp.rec)
	return slices.Clone(out), nil
}

// free returns the first address of family f that sp may use.
func (a *Allocator) free(sp *spec, f corev1.IPFamily) (netip.Addr, bool) {
	for _, p := range sp.pools {
		for _, pf := range p.prefixes {
			if family(pf.Addr()) != f {
				continue
			}
			for addr := pf.Addr(); addr.IsValid() && pf.Contains(addr); addr = addr.Next() {
				if SubnetRouterAnycast(addr) {
					continue
				}
				if _, ok := a.reserved[addr]; !ok && a.conflict(sp, addr) == "" {
					return addr, true
				}
			}
		}
	}
	return netip.Addr{}, false
}

// noFree is the error for families that got no address: no pool has them
// (NoPool) or every pool that has them is full (Exhausted).
func (a *Allocator) noFree(sp *spec, fams []corev1.IPFamily) error {
	var names, fs []string
	for _, f := range fams {
		fs = append(fs, string(f))
		for _, p := range sp.pools {
			if p.hasFamily(f) && !slices.Contains(names, p.name) {
				names = append(names, p.name)
			}
		}
	}
	famStr := strings.Join(fs, ",")
	where := fmt.Sprintf("allowed to namespace %s", sp.Namespace)
	if len(sp.rec.pools) > 0 {
		where += fmt.Sprintf(" and named by %s (%s)", FieldAddressPool, strings.Join(sp.rec.pools, ", "))
	}
	field, value := FieldIPFamilies, famStr
	if sp.required == 2 {
		field, value = FieldIPFamilyPolicy, string(corev1.IPFamilyPolicyRequireDualStack)
	}
	if len(names) == 0 {
		return &Error{Code: CodeNoPool, Field: field, Value: value,
			Reason: fmt.Sprintf("no loadBalancer pool with %s addresses is %s", famStr, where)}
	}
	return &Error{Code: CodeExhausted, Field: field, Value: value,
		Reason: fmt.Sprintf("no free %s address in pool %s (%s)", famStr, strings.Join(names, ", "), where)}
}

// Restore records the Service's Current addresses that are still valid —
// of a family it gets, in a pool its namespace may use, not reserved and
// shareable with the Services restored before it — allocating nothing,
// and returns them. A new leader restores every Service before its first
// Assign. The address-pool annotation and the requests are left to
// Assign (Stale reports a Service whose address its annotation excludes).
// A Service the allocator already knows is left as it is.
//
// Restore sees the spec as it is now. A Service whose edit failed (say a
// port that now clashes with a sharer, and no other address free) kept
// its address with its old ports; restored, it conflicts with the sharer,
// and whichever of the two is restored first keeps the address.
func (a *Allocator) Restore(s Service) []netip.Addr {
	if r := a.svcs[s.Key]; r != nil {
		return slices.Clone(r.addrs)
	}
	sp, err := a.shape(s)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, f := range sp.fams {
		j := slices.IndexFunc(s.Current, func(h netip.Addr) bool {
			_, reserved := a.reserved[h]
			return family(h) == f && !reserved && a.inPools(h, s.Namespace, nil) && a.conflict(sp, h) == ""
		})
		if j >= 0 {
			out = append(out, s.Current[j])
		}
	}
	if len(out) == 0 {
		return nil
	}
	sp.rec.addrs = out
	a.record(s.Key, sp.rec)
	return slices.Clone(out)
}
