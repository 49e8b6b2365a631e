package lbassign

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const (
	v4 = corev1.IPv4Protocol
	v6 = corev1.IPv6Protocol

	single  = corev1.IPFamilyPolicySingleStack
	prefer  = corev1.IPFamilyPolicyPreferDualStack
	require = corev1.IPFamilyPolicyRequireDualStack
)

func everyone(string) bool { return true }

func only(nss ...string) func(string) bool {
	return func(ns string) bool { return slices.Contains(nss, ns) }
}

func mkpool(name string, allows func(string) bool, cidrs ...string) Pool {
	p := Pool{Name: name, Allows: allows}
	for _, c := range cidrs {
		p.Prefixes = append(p.Prefixes, netip.MustParsePrefix(c))
	}
	return p
}

func ips(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func svc(key string, mods ...func(*Service)) Service {
	ns, _, _ := strings.Cut(key, "/")
	s := Service{Key: key, Namespace: ns, Ports: []Port{{Port: 80, Protocol: corev1.ProtocolTCP}}}
	for _, m := range mods {
		m(&s)
	}
	return s
}

func fams(f ...corev1.IPFamily) func(*Service) { return func(s *Service) { s.Families = f } }
func policy(p corev1.IPFamilyPolicy) func(*Service) {
	return func(s *Service) { s.Policy = p }
}
func want(v ...string) func(*Service)    { return func(s *Service) { s.Requested = v } }
func inPools(p ...string) func(*Service) { return func(s *Service) { s.Pools = p } }
func share(k string) func(*Service)      { return func(s *Service) { s.SharingKey = k } }
func current(a ...string) func(*Service) { return func(s *Service) { s.Current = ips(a...) } }
func local(sel map[string]string) func(*Service) {
	return func(s *Service) { s.Local, s.Selector = true, sel }
}
func ports(ps ...Port) func(*Service) { return func(s *Service) { s.Ports = ps } }

func tcp(n int32) Port { return Port{Port: n, Protocol: corev1.ProtocolTCP} }
func udp(n int32) Port { return Port{Port: n, Protocol: corev1.ProtocolUDP} }

// The standard pools: two IPv6, two IPv4, and one each namespace "x" may
// not use, listed out of order (the allocator goes by name).
func stdPools() []Pool {
	return []Pool{
		mkpool("v4", everyone, "192.0.2.0/30"),
		mkpool("v6", everyone, "2001:db8:6::100/126"),
		mkpool("v6b", everyone, "2001:db8:7::100/127"),
		mkpool("v4b", everyone, "198.51.100.0/31"),
		mkpool("secret", only("ops"), "2001:db8:5::100/126", "203.0.113.0/30"),
	}
}

// state is everything observable: each known Service's addresses, the
// owners of every address of the pools (and of a few outside), and each
// pool's counts.
func state(a *Allocator, pools []Pool, keys []string) string {
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%v\n", k, a.Addrs(k))
	}
	for _, p := range pools {
		used, size := a.InUse(p.Name)
		fmt.Fprintf(&b, "pool %s %d/%d\n", p.Name, used, size)
		for _, pf := range p.Prefixes {
			for x, i := pf.Masked().Addr(), 0; pf.Contains(x) && i < 64; x, i = x.Next(), i+1 {
				if o := a.Owners(x); len(o) > 0 {
					fmt.Fprintf(&b, "%s %v\n", x, o)
				}
			}
		}
	}
	return b.String()
}

// must Assigns s, failing the test on an error.
func must(t *testing.T, a *Allocator, s Service) []netip.Addr {
	t.Helper()
	got, err := a.Assign(s)
	if err != nil {
		t.Fatalf("Assign(%s): %v", s.Key, err)
	}
	return got
}

func TestAssign(t *testing.T) {
	tests := []struct {
		name   string
		pools  []Pool            // nil: stdPools
		def    corev1.IPFamily   // Allocator.DefaultFamily
		reserv map[string]string // address → holder
		before []Service         // assigned first, in order; must succeed
		svc    Service
		want   []string
		// On error: the code, the field, and strings the message must
		// contain (the value among them).
		code  Code
		field string
		msg   []string
	}{
		// Families.
		{name: "empty families: default IPv6", svc: svc("a/s"), want: []string{"2001:db8:6::100"}},
		{name: "empty families: default IPv4 when set", def: v4, svc: svc("a/s"), want: []string{"192.0.2.0"}},
		{name: "SingleStack: first family only", svc: svc("a/s", fams(v4, v6), policy(single)), want: []string{"192.0.2.0"}},
		{name: "empty policy is SingleStack", svc: svc("a/s", fams(v6, v4)), want: []string{"2001:db8:6::100"}},
		{name: "PreferDualStack given one family (a single-stack cluster): that one only", svc: svc("a/s", fams(v4), policy(prefer)),
			want: []string{"192.0.2.0"}},
		{name: "PreferDualStack, families not filled in yet: both, the default first", svc: svc("a/s", policy(prefer)),
			want: []string{"2001:db8:6::100", "192.0.2.0"}},
		{name: "PreferDualStack keeps the families' order", svc: svc("a/s", fams(v6, v4), policy(prefer)),
			want: []string{"2001:db8:6::100", "192.0.2.0"}},
		{name: "PreferDualStack, no IPv4 pool: IPv6 only", pools: []Pool{mkpool("v6", everyone, "2001:db8:6::100/126")},
			svc: svc("a/s", fams(v6, v4), policy(prefer)), want: []string{"2001:db8:6::100"}},
		{name: "PreferDualStack, primary family has no pool: the other", pools: []Pool{mkpool("v4", everyone, "192.0.2.0/30")},
			svc: svc("a/s", fams(v6, v4), policy(prefer)), want: []string{"192.0.2.0"}},
		{name: "PreferDualStack, IPv4 exhausted: IPv6 only", pools: []Pool{mkpool("v4", everyone, "192.0.2.0/32"), mkpool("v6", everyone, "2001:db8:6::100/126")},
			before: []Service{svc("a/other", fams(v4))},
			svc:    svc("a/s", fams(v6, v4), policy(prefer)), want: []string{"2001:db8:6::100"}},
		{name: "RequireDualStack: both", svc: svc("a/s", fams(v6, v4), policy(require)), want: []string{"2001:db8:6::100", "192.0.2.0"}},
		{name: "RequireDualStack, empty families: default first", def: v4, svc: svc("a/s", policy(require)),
			want: []string{"192.0.2.0", "2001:db8:6::100"}},
		{name: "RequireDualStack, no IPv4 pool", pools: []Pool{mkpool("v6", everyone, "2001:db8:6::100/126"), mkpool("secret", only("ops"), "192.0.2.0/30")},
			svc: svc("a/s", fams(v6, v4), policy(require)), code: CodeNoPool, field: FieldIPFamilyPolicy,
			msg: []string{`"RequireDualStack"`, "IPv4", "namespace a"}},
		{name: "RequireDualStack, IPv4 exhausted", pools: []Pool{mkpool("v4", everyone, "192.0.2.0/32"), mkpool("v6", everyone, "2001:db8:6::100/126")},
			before: []Service{svc("a/other", fams(v4))},
			svc:    svc("a/s", fams(v6, v4), policy(require)), code: CodeExhausted, field: FieldIPFamilyPolicy,
			msg: []string{`"RequireDualStack"`, "no free IPv4", "pool v4"}},
		{name: "invalid family", svc: svc("a/s", fams("IPv5")), code: CodeInvalid, field: FieldIPFamilies, msg: []string{`"IPv5"`}},
		{name: "family twice", svc: svc("a/s", fams(v6, v6), policy(prefer)), code: CodeInvalid, field: FieldIPFamilies,
			msg: []string{`"IPv6"`, "twice"}},
		{name: "invalid policy", svc: svc("a/s", policy("MaybeDualStack")), code: CodeInvalid, field: FieldIPFamilyPolicy,
			msg: []string{`"MaybeDualStack"`}},

		// Requested addresses.
		{name: "requested", svc: svc("a/s", want("2001:db8:6::103")), want: []string{"2001:db8:6::103"}},
		{name: "requested, not canonical", svc: svc("a/s", want(" 2001:DB8:6:0::103 ")), want: []string{"2001:db8:6::103"}},
		{name: "requested one family, RequireDualStack: the other allocated",
			svc: svc("a/s", fams(v6, v4), policy(require), want("192.0.2.2")), want: []string{"2001:db8:6::100", "192.0.2.2"}},
		{name: "requested both families", svc: svc("a/s", fams(v4, v6), policy(prefer), want("2001:db8:6::101", "192.0.2.1")),
			want: []string{"192.0.2.1", "2001:db8:6::101"}},
		{name: "requested network and broadcast-like addresses", svc: svc("a/s", fams(v4), want("192.0.2.3")), want: []string{"192.0.2.3"}},
		{name: "malformed", svc: svc("a/s", want("2001:db8:6::100zz")), code: CodeInvalid, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:6::100zz"`, "not an IP address"}},
		{name: "malformed, from spec.loadBalancerIP", svc: svc("a/s", want("nope"), func(s *Service) { s.RequestedField = FieldLoadBalancerIP }),
			code: CodeInvalid, field: FieldLoadBalancerIP, msg: []string{`spec.loadBalancerIP "nope"`}},
		{name: "zone", svc: svc("a/s", want("fe80::1%eth0")), code: CodeInvalid, field: FieldLoadBalancerIPs,
			msg: []string{`"fe80::1%eth0"`, "zone"}},
		{name: "IPv4-mapped", svc: svc("a/s", fams(v4), want("::ffff:192.0.2.1")), code: CodeInvalid, field: FieldLoadBalancerIPs,
			msg: []string{`"::ffff:192.0.2.1"`, "IPv4-mapped"}},
		{name: "IPv4 on an IPv6 Service", svc: svc("a/s", fams(v6), want("192.0.2.1")), code: CodeWrongFamily, field: FieldLoadBalancerIPs,
			msg: []string{`"192.0.2.1"`, "IPv4", "only IPv6", "SingleStack"}},
		{name: "IPv6 on a SingleStack IPv4 Service with both families listed", svc: svc("a/s", fams(v4, v6), want("2001:db8:6::101")),
			code: CodeWrongFamily, field: FieldLoadBalancerIPs, msg: []string{`"2001:db8:6::101"`, "only IPv4"}},
		{name: "two of one family", svc: svc("a/s", fams(v6, v4), policy(prefer), want("2001:db8:6::101", "2001:db8:6::102")),
			code: CodeWrongFamily, field: FieldLoadBalancerIPs, msg: []string{`"2001:db8:6::102"`, "second IPv6", "2001:db8:6::101"}},
		{name: "outside every pool", svc: svc("a/s", want("2001:db8:99::101")), code: CodeNotInPool, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:99::101"`, "in no loadBalancer AddressPool"}},
		{name: "in a pool the namespace may not use", svc: svc("a/s", want("2001:db8:5::101")), code: CodeNotInPool,
			field: FieldLoadBalancerIPs, msg: []string{`"2001:db8:5::101"`, "pool secret", "namespace a may not use"}},
		{name: "in a pool the namespace may use", svc: svc("ops/s", want("2001:db8:5::101")), want: []string{"2001:db8:5::101"}},
		{name: "not in the annotation's pool", svc: svc("a/s", want("2001:db8:6::101"), inPools("v6b")), code: CodeNotInPool,
			field: FieldLoadBalancerIPs, msg: []string{`"2001:db8:6::101"`, "pool v6", "v6b"}},
		{name: "reserved", reserv: map[string]string{"2001:db8:6::101": "pod ns/p"}, svc: svc("a/s", want("2001:db8:6::101")),
			code: CodeReserved, field: FieldLoadBalancerIPs, msg: []string{`"2001:db8:6::101"`, "reserved by pod ns/p"}},

		// Sharing a requested address.
		{name: "held, no sharing", before: []Service{svc("a/other", want("2001:db8:6::101"))},
			svc: svc("a/s", want("2001:db8:6::101"), ports(tcp(443))), code: CodeInUse, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:6::101"`, "a/other", "does not allow sharing"}},
		{name: "held, only the other allows sharing", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"))},
			svc: svc("a/s", want("2001:db8:6::101"), ports(tcp(443))), code: CodeInUse, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:6::101"`, "a/other", "needs " + AnnotationAllowSharedIP}},
		{name: "held, other key", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"))},
			svc: svc("a/s", want("2001:db8:6::101"), share("j"), ports(tcp(443))), code: CodeInUse, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:6::101"`, "a/other", `"k", not "j"`}},
		{name: "held, port clash", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"), ports(tcp(80), udp(53)))},
			svc: svc("a/s", want("2001:db8:6::101"), share("k"), ports(tcp(443), udp(53))), code: CodeInUse, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:6::101"`, "port UDP/53", "a/other"}},
		{name: "held, port clash with the default protocol", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"), ports(tcp(80)))},
			svc: svc("a/s", want("2001:db8:6::101"), share("k"), ports(Port{Port: 80})), code: CodeInUse, field: FieldLoadBalancerIPs,
			msg: []string{"port TCP/80", "a/other"}},
		{name: "held, same number other protocol: shared", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"), ports(tcp(53)))},
			svc: svc("a/s", want("2001:db8:6::101"), share("k"), ports(udp(53))), want: []string{"2001:db8:6::101"}},
		{name: "held, other traffic policy", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"))},
			svc: svc("a/s", want("2001:db8:6::101"), share("k"), ports(tcp(443)), local(nil)), code: CodeInUse, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:6::101"`, "a/other", "externalTrafficPolicy Cluster, not Local"}},
		{name: "held, Local, other selector", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"), local(map[string]string{"app": "x"}))},
			svc:  svc("a/s", want("2001:db8:6::101"), share("k"), ports(tcp(443)), local(map[string]string{"app": "y"})),
			code: CodeInUse, field: FieldLoadBalancerIPs, msg: []string{`"2001:db8:6::101"`, "a/other", "selector app=x, not app=y"}},
		{name: "held, Local, same selector: shared", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"), local(map[string]string{"app": "x"}))},
			svc:  svc("a/s", want("2001:db8:6::101"), share("k"), ports(tcp(443)), local(map[string]string{"app": "x"})),
			want: []string{"2001:db8:6::101"}},
		{name: "held, Cluster, selectors differ: shared", before: []Service{svc("a/other", want("2001:db8:6::101"), share("k"), func(s *Service) { s.Selector = map[string]string{"app": "x"} })},
			svc:  svc("a/s", want("2001:db8:6::101"), share("k"), ports(tcp(443))),
			want: []string{"2001:db8:6::101"}},
		{name: "held by two, clash with the second", before: []Service{
			svc("a/o1", want("2001:db8:6::101"), share("k"), ports(tcp(1))),
			svc("a/o2", want("2001:db8:6::101"), share("k"), ports(tcp(2)))},
			svc: svc("a/s", want("2001:db8:6::101"), share("k"), ports(tcp(2))), code: CodeInUse, field: FieldLoadBalancerIPs,
			msg: []string{"port TCP/2", "a/o2"}},

		// The address-pool annotation.
		{name: "unknown pool", svc: svc("a/s", inPools("v6", "nope")), code: CodeUnknownPool, field: FieldAddressPool,
			msg: []string{`"nope"`, "no loadBalancer AddressPool"}},
		{name: "pool not allowed", svc: svc("a/s", inPools("secret")), code: CodePoolNotAllowed, field: FieldAddressPool,
			msg: []string{`"secret"`, "namespace a may not use"}},
		{name: "named pool", svc: svc("a/s", inPools("v6b")), want: []string{"2001:db8:7::100"}},
		{name: "named pools, blanks ignored", svc: svc("a/s", fams(v4), inPools(" ", "v4b ", "v4b")), want: []string{"198.51.100.0"}},
		{name: "named pool without the family", svc: svc("a/s", fams(v4), inPools("v6b")), code: CodeNoPool, field: FieldIPFamilies,
			msg: []string{`"IPv4"`, "no loadBalancer pool with IPv4", "v6b"}},

		// Automatic allocation.
		{name: "pool name order, then address order", pools: []Pool{
			mkpool("b", everyone, "2001:db8:1::100/127"),
			mkpool("a", everyone, "2001:db8:3::100/127", "2001:db8:2::108/127")},
			svc: svc("a/s"), want: []string{"2001:db8:2::108"}},
		{name: "overlapping prefixes", pools: []Pool{mkpool("a", everyone, "2001:db8:2::100/120", "2001:db8:2::100/127")},
			before: []Service{svc("a/o1"), svc("a/o2")}, svc: svc("a/s"), want: []string{"2001:db8:2::102"}},
		{name: "network and broadcast-like addresses are handed out", def: v4, pools: []Pool{mkpool("a", everyone, "10.0.0.0/24")},
			svc: svc("a/s"), want: []string{"10.0.0.0"}},
		{name: "reserved skipped", reserv: map[string]string{"2001:db8:6::100": "x", "2001:db8:6::101": "y"}, svc: svc("a/s"),
			want: []string{"2001:db8:6::102"}},
		{name: "held skipped", before: []Service{svc("a/o")}, svc: svc("a/s"), want: []string{"2001:db8:6::101"}},
		{name: "held, compatible: shared (as MetalLB)", before: []Service{svc("a/o", share("k"))},
			svc: svc("a/s", share("k"), ports(tcp(443))), want: []string{"2001:db8:6::100"}},
		// Unlike MetalLB: a key does not cross namespaces (anyone who reads
		// Services can copy it).
		{name: "held by another namespace, same key: not shared", before: []Service{svc("a/o", share("k"))},
			svc: svc("b/s", share("k"), ports(tcp(443))), want: []string{"2001:db8:6::101"}},
		{name: "held by another namespace, same key: requested, refused", before: []Service{svc("a/o", share("k"))},
			svc: svc("b/s", share("k"), ports(tcp(443)), want("2001:db8:6::100")), code: CodeInUse, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:6::100"`, "Service a/o of another namespace", "shared only within one namespace"}},
		{name: "held, compatible key but port clash: skipped", before: []Service{svc("a/o", share("k"))},
			svc: svc("a/s", share("k")), want: []string{"2001:db8:6::101"}},
		{name: "exhausted", pools: []Pool{mkpool("one", everyone, "2001:db8:6::100/128"), mkpool("two", everyone, "2001:db8:7::100/128")},
			before: []Service{svc("a/o1"), svc("a/o2")}, svc: svc("a/s"), code: CodeExhausted, field: FieldIPFamilies,
			msg: []string{`"IPv6"`, "no free IPv6 address in pool one, two", "namespace a"}},
		{name: "exhausted, named pool", before: []Service{svc("a/o1", inPools("v6b")), svc("a/o2", inPools("v6b"))},
			svc: svc("a/s", inPools("v6b")), code: CodeExhausted, field: FieldIPFamilies,
			msg: []string{`"IPv6"`, "pool v6b", "named by " + FieldAddressPool}},
		{name: "exhausted by reservations", pools: []Pool{mkpool("one", everyone, "2001:db8:6::100/127")},
			reserv: map[string]string{"2001:db8:6::100": "x", "2001:db8:6::101": "y"},
			svc:    svc("a/s"), code: CodeExhausted, msg: []string{"pool one"}},
		{name: "PreferDualStack, all exhausted", pools: []Pool{mkpool("one", everyone, "2001:db8:6::100/128", "192.0.2.0/32")},
			before: []Service{svc("a/o", fams(v6, v4), policy(require))},
			svc:    svc("a/s", fams(v6, v4), policy(prefer)), code: CodeExhausted, field: FieldIPFamilies,
			msg: []string{`"IPv6,IPv4"`, "pool one"}},
		{name: "no pool for the namespace", svc: svc("x/s"), pools: []Pool{mkpool("secret", only("ops"), "2001:db8:5::100/126")},
			code: CodeNoPool, field: FieldIPFamilies, msg: []string{`"IPv6"`, "namespace x"}},
		{name: "nil Allows: nobody", pools: []Pool{mkpool("p", nil, "2001:db8:5::100/126")}, svc: svc("a/s"), code: CodeNoPool},
		{name: "PreferDualStack, no pool at all", pools: []Pool{}, svc: svc("a/s", policy(prefer)), code: CodeNoPool,
			field: FieldIPFamilies, msg: []string{`"IPv6,IPv4"`}},
		// RFC 4291 §2.6.1: the Subnet-Router anycast address (interface
		// identifier zero) is never handed out, nor granted on request;
		// a Service an older release gave one keeps it.
		{name: "Subnet-Router anycast skipped", pools: []Pool{mkpool("z", everyone, "2001:db8:9::/126")},
			svc: svc("a/s"), want: []string{"2001:db8:9::1"}},
		{name: "Subnet-Router anycast skipped in each /64", pools: []Pool{mkpool("z", everyone, "2001:db8:9::/127", "2001:db8:9:1::/126")},
			before: []Service{svc("a/o")}, svc: svc("a/s"), want: []string{"2001:db8:9:1::1"}},
		{name: "Subnet-Router anycast requested: refused", pools: []Pool{mkpool("z", everyone, "2001:db8:9::/126")},
			svc: svc("a/s", want("2001:db8:9::")), code: CodeReserved, field: FieldLoadBalancerIPs,
			msg: []string{`"2001:db8:9::"`, "Subnet-Router anycast address of 2001:db8:9::/64", "RFC 4291"}},
		{name: "Subnet-Router anycast only: exhausted", pools: []Pool{mkpool("z", everyone, "2001:db8:9::/128")},
			svc: svc("a/s"), code: CodeExhausted},
		{name: "Subnet-Router anycast held: kept", pools: []Pool{mkpool("z", everyone, "2001:db8:9::/126")},
			svc: svc("a/s", current("2001:db8:9::")), want: []string{"2001:db8:9::"}},
		{name: "Subnet-Router anycast held and requested: kept", pools: []Pool{mkpool("z", everyone, "2001:db8:9::/126")},
			svc: svc("a/s", current("2001:db8:9::"), want("2001:db8:9::")), want: []string{"2001:db8:9::"}},
		{name: "IPv4 .0 still handed out", pools: []Pool{mkpool("z", everyone, "192.0.2.0/30")},
			svc: svc("a/s", fams(v4)), want: []string{"192.0.2.0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pools := tc.pools
			if pools == nil {
				pools = stdPools()
			}
			a := New(pools)
			a.DefaultFamily = tc.def
			for x, by := range tc.reserv {
				a.Reserve(netip.MustParseAddr(x), by)
			}
			keys := []string{tc.svc.Key}
			for _, b := range tc.before {
				if _, err := a.Assign(b); err != nil {
					t.Fatalf("before: %s: %v", b.Key, err)
				}
				keys = append(keys, b.Key)
			}
			was := state(a, pools, keys)
			got, err := a.Assign(tc.svc)
			if tc.code == "" {
				if err != nil {
					t.Fatalf("Assign: %v", err)
				}
				if !slices.Equal(got, ips(tc.want...)) {
					t.Fatalf("Assign = %v, want %v", got, tc.want)
				}
				if !slices.Equal(a.Addrs(tc.svc.Key), got) {
					t.Fatalf("Addrs = %v, want %v", a.Addrs(tc.svc.Key), got)
				}
				for _, x := range got {
					if !slices.Contains(a.Owners(x), tc.svc.Key) {
						t.Fatalf("Owners(%s) = %v, lacks %s", x, a.Owners(x), tc.svc.Key)
					}
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Assign = %v, %v; want an *Error", got, err)
			}
			if e.Code != tc.code || (tc.field != "" && e.Field != tc.field) {
				t.Fatalf("error %q: code %s field %s, want %s %s", err, e.Code, e.Field, tc.code, tc.field)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", e.Value)) {
				t.Fatalf("error %q does not quote its value %q", err, e.Value)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q lacks %q", err, m)
				}
			}
			if got != nil {
				t.Errorf("Assign returned %v with the error", got)
			}
			if now := state(a, pools, keys); now != was {
				t.Errorf("the error changed the state:\n%s\nwas\n%s", now, was)
			}
		})
	}
}

// TestErrorKeeps: a bad edit leaves the Service what it had.
func TestErrorKeeps(t *testing.T) {
	a := New(stdPools())
	s := svc("a/s", fams(v6, v4), policy(require))
	got, err := a.Assign(s)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a/s"}
	was := state(a, stdPools(), keys)
	for _, bad := range []func(*Service){want("bogus"), inPools("nope"), want("2001:db8:99::101"), fams("IPv5"), policy("X")} {
		e := s
		e.Current = got
		bad(&e)
		if _, err := a.Assign(e); err == nil {
			t.Fatalf("%+v: no error", e)
		}
		if now := state(a, stdPools(), keys); now != was {
			t.Fatalf("%+v changed the state:\n%s\nwas\n%s", e, now, was)
		}
	}
}

func TestStability(t *testing.T) {
	t.Run("unrelated edit keeps the address though a lower one is free", func(t *testing.T) {
		a := New(stdPools())
		must(t, a, svc("a/o1"))
		s := svc("a/s", share("k"))
		got := must(t, a, s)
		a.Release("a/o1")
		s.Current, s.Ports, s.Selector, s.SharingKey = got, []Port{tcp(8080)}, map[string]string{"x": "y"}, "j"
		if again, err := a.Assign(s); err != nil || !slices.Equal(again, got) {
			t.Fatalf("Assign = %v, %v; want %v", again, err, got)
		}
	})
	t.Run("Current before what was recorded", func(t *testing.T) {
		a := New(stdPools())
		must(t, a, svc("a/s"))                                       // records ::
		got, err := a.Assign(svc("a/s", current("2001:db8:6::103"))) // status says ::3
		if err != nil || !slices.Equal(got, ips("2001:db8:6::103")) {
			t.Fatalf("Assign = %v, %v", got, err)
		}
		if o := a.Owners(netip.MustParseAddr("2001:db8:6::100")); o != nil {
			t.Fatalf(":: still owned by %v", o)
		}
	})
	t.Run("recorded when the status write was lost", func(t *testing.T) {
		a := New(stdPools())
		must(t, a, svc("a/o"))
		must(t, a, svc("a/s")) // ::1, never written
		a.Release("a/o")
		if got := must(t, a, svc("a/s")); !slices.Equal(got, ips("2001:db8:6::101")) {
			t.Fatalf("Assign = %v", got)
		}
	})
	t.Run("Current held incompatibly by another: recorded", func(t *testing.T) {
		a := New(stdPools())
		must(t, a, svc("a/s", want("2001:db8:6::102")))
		must(t, a, svc("a/o", want("2001:db8:6::103")))
		if got := must(t, a, svc("a/s", current("2001:db8:6::103"))); !slices.Equal(got, ips("2001:db8:6::102")) {
			t.Fatalf("Assign = %v", got)
		}
	})
	t.Run("a new allocator keeps Current", func(t *testing.T) {
		a := New(stdPools())
		if got := must(t, a, svc("a/s", current("2001:db8:6::103"))); !slices.Equal(got, ips("2001:db8:6::103")) {
			t.Fatalf("Assign = %v", got)
		}
	})
	t.Run("moves when the request changes", func(t *testing.T) {
		a := New(stdPools())
		must(t, a, svc("a/s"))
		if got := must(t, a, svc("a/s", current("2001:db8:6::100"), want("2001:db8:6::102"))); !slices.Equal(got, ips("2001:db8:6::102")) {
			t.Fatalf("Assign = %v", got)
		}
		if got := must(t, a, svc("a/s", current("2001:db8:6::102"))); !slices.Equal(got, ips("2001:db8:6::102")) {
			t.Fatalf("request dropped: Assign = %v, want it kept", got)
		}
	})
	t.Run("moves when the annotation names another pool", func(t *testing.T) {
		a := New(stdPools())
		must(t, a, svc("a/s"))
		if got := must(t, a, svc("a/s", current("2001:db8:6::100"), inPools("v6b"))); !slices.Equal(got, ips("2001:db8:7::100")) {
			t.Fatalf("Assign = %v", got)
		}
	})
	t.Run("moves when its own edit clashes with a sharer", func(t *testing.T) {
		a := New(stdPools())
		must(t, a, svc("a/o", share("k"), ports(tcp(443))))
		got := must(t, a, svc("a/s", share("k")))
		if !slices.Equal(got, ips("2001:db8:6::100")) {
			t.Fatalf("not shared: %v", got)
		}
		if got := must(t, a, svc("a/s", share("k"), current("2001:db8:6::100"), ports(tcp(443)))); !slices.Equal(got, ips("2001:db8:6::101")) {
			t.Fatalf("Assign = %v", got)
		}
	})
	t.Run("sole holder changes its key in place", func(t *testing.T) {
		a := New(stdPools())
		must(t, a, svc("a/s", share("k")))
		if got := must(t, a, svc("a/s", share("j"), current("2001:db8:6::100"))); !slices.Equal(got, ips("2001:db8:6::100")) {
			t.Fatalf("Assign = %v", got)
		}
	})
	t.Run("PreferDualStack gains the missing family, keeps the other", func(t *testing.T) {
		pools := []Pool{mkpool("v4", everyone, "192.0.2.0/32"), mkpool("v6", everyone, "2001:db8:6::100/126")}
		a := New(pools)
		must(t, a, svc("a/o", fams(v4)))
		s := svc("a/s", fams(v4, v6), policy(prefer))
		got := must(t, a, s)
		if !slices.Equal(got, ips("2001:db8:6::100")) {
			t.Fatalf("Assign = %v", got)
		}
		a.Release("a/o")
		s.Current = got
		if got := must(t, a, s); !slices.Equal(got, ips("192.0.2.0", "2001:db8:6::100")) {
			t.Fatalf("Assign = %v", got)
		}
	})
}

func TestRelease(t *testing.T) {
	a := New(stdPools())
	x := netip.MustParseAddr("2001:db8:6::100")
	must(t, a, svc("a/s1", share("k"), ports(tcp(1))))
	must(t, a, svc("a/s2", share("k"), ports(tcp(2))))
	if o := a.Owners(x); !slices.Equal(o, []string{"a/s1", "a/s2"}) {
		t.Fatalf("Owners = %v", o)
	}
	a.Release("a/s2")
	if o := a.Owners(x); !slices.Equal(o, []string{"a/s1"}) {
		t.Fatalf("Owners = %v", o)
	}
	if used, _ := a.InUse("v6"); used != 1 {
		t.Fatalf("InUse = %d", used)
	}
	a.Release("a/s1")
	a.Release("a/s1") // twice is fine
	if used, _ := a.InUse("v6"); used != 0 || a.Owners(x) != nil || a.Addrs("a/s1") != nil {
		t.Fatalf("InUse = %d, Owners %v, Addrs %v", used, a.Owners(x), a.Addrs("a/s1"))
	}
}

func TestInUse(t *testing.T) {
	a := New([]Pool{
		mkpool("small", everyone, "2001:db8:1::/126", "192.0.2.0/30", "192.0.2.0/31"),
		mkpool("over", everyone, "2001:db8:1::/127"),
		mkpool("big", everyone, "2001:db8:2::/64"),
		mkpool("bigger", everyone, "2001:db8:3::/64", "2001:db8:4::/63"),
		// A prefix's Subnet-Router anycast address (its first, interface
		// identifier zero) is not counted: Assign never hands it out.
		mkpool("edge", everyone, "2001:db8:5::/65", "2001:db8:6::/65", "2001:db8:7::/66"),     // over 2^64
		mkpool("justfits", everyone, "2001:db8:5::/65", "2001:db8:6::/66", "2001:db8:7::/66"), // 2^64 - 3
	})
	for _, c := range []struct {
		pool       string
		used, size uint64
	}{{"small", 0, 7}, {"over", 0, 1}, {"big", 0, math.MaxUint64}, {"bigger", 0, math.MaxUint64},
		{"edge", 0, math.MaxUint64}, {"justfits", 0, math.MaxUint64 - 2}, {"nope", 0, 0}} {
		if used, size := a.InUse(c.pool); used != c.used || size != c.size {
			t.Errorf("InUse(%s) = %d, %d; want %d, %d", c.pool, used, size, c.used, c.size)
		}
	}
	// 2^63-1 + 2^62-1 does not saturate.
	a.SetPools([]Pool{mkpool("p", everyone, "2001:db8:5::/65", "2001:db8:6::/66")})
	if _, size := a.InUse("p"); size != 1<<63+1<<62-2 {
		t.Errorf("size %d", size)
	}
	a.SetPools([]Pool{mkpool("small", everyone, "2001:db8:1::/126"), mkpool("over", everyone, "2001:db8:1::/127")})
	must(t, a, svc("a/s", want("2001:db8:1::1")))
	must(t, a, svc("a/t", want("2001:db8:1::3")))
	if u, _ := a.InUse("small"); u != 2 {
		t.Errorf("small used %d", u)
	}
	if u, _ := a.InUse("over"); u != 1 {
		t.Errorf("over used %d", u)
	}
	// A pool that goes keeps its Service, uncounted; back, counted again.
	a.SetPools([]Pool{mkpool("over", everyone, "2001:db8:1::/127")})
	if u, _ := a.InUse("small"); u != 0 {
		t.Errorf("gone pool used %d", u)
	}
	if s := a.Stale(); !slices.Equal(s, []string{"a/t"}) {
		t.Errorf("Stale = %v", s)
	}
	a.SetPools([]Pool{mkpool("small", everyone, "2001:db8:1::/126")})
	if u, _ := a.InUse("small"); u != 2 {
		t.Errorf("small used %d after it came back", u)
	}
}

func TestStale(t *testing.T) {
	a := New(stdPools())
	must(t, a, svc("a/s1"))
	must(t, a, svc("a/s2", fams(v4)))
	must(t, a, svc("ops/s3", inPools("secret")))
	must(t, a, svc("a/s4", inPools("v6b")))
	if s := a.Stale(); s != nil {
		t.Fatalf("Stale = %v", s)
	}
	a.Reserve(netip.MustParseAddr("2001:db8:6::100"), "pod")
	pools := stdPools()
	pools[4].Allows = only("dev")      // secret: ops may not any more
	pools = slices.Delete(pools, 2, 3) // v6b gone
	a.SetPools(pools)
	if s := a.Stale(); !slices.Equal(s, []string{"a/s1", "a/s4", "ops/s3"}) {
		t.Fatalf("Stale = %v", s)
	}
	a.Unreserve(netip.MustParseAddr("2001:db8:6::100"))
	if s := a.Stale(); !slices.Equal(s, []string{"a/s4", "ops/s3"}) {
		t.Fatalf("Stale = %v", s)
	}
	// Assign moves a stale Service it can; the one it cannot keeps its
	// address (the controller decides).
	if got, err := a.Assign(svc("ops/s3", current("2001:db8:5::100"))); err != nil || !slices.Equal(got, ips("2001:db8:6::101")) {
		t.Fatalf("Assign = %v, %v", got, err)
	}
	if _, err := a.Assign(svc("a/s4", inPools("v6b"), current("2001:db8:7::100"))); err == nil {
		t.Fatal("no error for a gone pool")
	}
	if s := a.Stale(); !slices.Equal(s, []string{"a/s4"}) {
		t.Fatalf("Stale = %v", s)
	}
}

func TestRestore(t *testing.T) {
	a := New(stdPools())
	a.Reserve(netip.MustParseAddr("2001:db8:6::102"), "pod")
	cases := []struct {
		s    Service
		want []string
	}{
		{svc("a/s1", current("2001:db8:6::103")), []string{"2001:db8:6::103"}},
		{svc("a/s2", current("2001:db8:6::103")), nil},  // held, no sharing
		{svc("a/s3", current("2001:db8:6::102")), nil},  // reserved
		{svc("a/s4", current("2001:db8:99::101")), nil}, // in no pool
		{svc("a/s5", current("2001:db8:5::101")), nil},  // pool not allowed
		{svc("a/s6", current("192.0.2.1")), nil},        // not its family
		{svc("a/s7", current("192.0.2.1", "2001:db8:99::101", "2001:db8:6::101", "2001:db8:6::100")), []string{"2001:db8:6::101"}}, // first valid of its family
		{svc("a/s8", fams(v4, v6), policy(prefer), current("2001:db8:6::100", "192.0.2.1")), []string{"192.0.2.1", "2001:db8:6::100"}},
		{svc("a/s9", current("2001:db8:7::101"), inPools("v6"), want("2001:db8:6::103")), []string{"2001:db8:7::101"}}, // left to Assign
		{svc("a/s10", fams("bogus"), current("2001:db8:7::100")), nil},
		{svc("a/s11"), nil}, // allocates nothing
	}
	for _, c := range cases {
		if got := a.Restore(c.s); !slices.Equal(got, ips(c.want...)) {
			t.Errorf("Restore(%s) = %v, want %v", c.s.Key, got, c.want)
		}
		if got := a.Addrs(c.s.Key); !slices.Equal(got, ips(c.want...)) {
			t.Errorf("Addrs(%s) = %v, want %v", c.s.Key, got, c.want)
		}
	}
	// Known: left alone.
	if got := a.Restore(svc("a/s1", current("2001:db8:6::101"))); !slices.Equal(got, ips("2001:db8:6::103")) {
		t.Errorf("Restore again = %v", got)
	}
	if s := a.Stale(); !slices.Equal(s, []string{"a/s9"}) {
		t.Errorf("Stale = %v", s)
	}
}

func TestErrorsAs(t *testing.T) {
	a := New(stdPools())
	_, err := a.Assign(svc("a/s", want("nope")))
	wrapped := fmt.Errorf("service a/s: %w", err)
	var e *Error
	if !errors.As(wrapped, &e) || e.Field != FieldLoadBalancerIPs || e.Value != "nope" || e.Code != CodeInvalid {
		t.Fatalf("errors.As(%v) = %+v", wrapped, e)
	}
	if errors.Unwrap(e) == nil {
		t.Fatalf("%v wraps nothing", e)
	}
}

// Terms is what sharing depends on, canonical (ports sorted, TCP for no
// protocol, the selector only when Local), and ParseTerms reads it back.
func TestTerms(t *testing.T) {
	for _, tc := range []struct {
		s    Service
		want string
	}{
		{Service{Ports: []Port{tcp(80)}}, ""},
		{Service{SharingKey: "k", Ports: []Port{udp(53), {Port: 80}, tcp(80)}, Selector: map[string]string{"app": "x"}}, `"k" TCP/80,UDP/53`},
		{Service{SharingKey: "a b", Local: true, Selector: map[string]string{"app": "x", "tier": "web"}}, `"a b"  Local app=x,tier=web`},
		{Service{SharingKey: "k", Ports: []Port{tcp(443)}, Local: true}, `"k" TCP/443 Local {}`},
	} {
		got := Terms(tc.s)
		if got != tc.want {
			t.Errorf("Terms(%+v) = %q, want %q", tc.s, got, tc.want)
		}
		if got == "" {
			continue
		}
		back, err := ParseTerms(got)
		if err != nil {
			t.Fatal(err)
		}
		if Terms(back) != got {
			t.Errorf("ParseTerms(%q) = %+v, which reads %q", got, back, Terms(back))
		}
	}
	for _, bad := range []string{"k TCP/80", `"k" TCP/x`, `"k" TCP/80 Local app`} {
		if _, err := ParseTerms(bad); err == nil {
			t.Errorf("ParseTerms(%q): no error", bad)
		}
	}
}
