// Package services derives the Service routes a node advertises: every
// LoadBalancer ingress IP (of flock's class) and external IP of every
// Service, authorized by the AddressPools, advertised exactly when
// kube-proxy on this node would deliver it (k8s/delivery), draining while
// only terminating endpoints serve it. Compute is the pure rule; Controller
// follows the API with the agent's informers and recomputes what changed.
package services

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/delivery"
)

// Class is the loadBalancerClass flock serves.
const Class = "flock.fritzlab.net/bgp"

// Options shape the decision for every Service.
type Options struct {
	// Node is this node's name (endpoints on it are local).
	Node string
	// DefaultClass: a LoadBalancer Service without a loadBalancerClass is
	// flock's too (the operator's choice: only one implementation may
	// take the unclassed ones).
	DefaultClass bool
	// Weights: send the number of endpoints behind this node as link
	// bandwidth for externalTrafficPolicy: Local addresses.
	Weights bool
	// Authorize answers whether the Service's namespace may use ip for
	// use (v1alpha1.UseLoadBalancer or UseExternalIP), from the
	// AddressPools; the error says why not.
	Authorize func(use string, ip netip.Addr, namespace string) error
	// Holder says whether the Service (namespace, name, uid) holds ip's
	// AddressClaim, alone or as one of the sharers of a shared address,
	// and if not, who does ("" nobody). A LoadBalancer address goes out
	// only for the Services in whose status it stands that hold it: a
	// status written by anyone else (services/status is all it takes)
	// does not move a route. Nil: not checked.
	Holder func(ip netip.Addr, namespace, name, uid string) (held bool, holder string)
	// Aggregate is the CIDR an authorized address of use goes out as when
	// its AddressPool aggregates (invalid: on its own). Only addresses of
	// externalTrafficPolicy: Cluster Services that this node advertises
	// are aggregated (Local ones must steer to the nodes with endpoints,
	// draining ones carry their own attributes). Nil: never.
	Aggregate func(use string, ip netip.Addr) netip.Prefix
	// ReadProxy reads what this node's Service proxy has programmed
	// (dataplane/kubeproxy). An address that starts being delivered goes
	// out only once the proxy delivers it on a port of the Service, or
	// after 30 s at most: kube-proxy applies an EndpointSlice change up
	// to its min-sync-period after flock reads it, and a flow sent
	// meanwhile misses its DNAT. An address already advertised is not
	// read again. Nil, a failed read, or a family whose rules cannot be
	// read: no wait (the decision alone, as kube-proxy's rules would
	// take it).
	ReadProxy func() (Proxy, error)
	// hold, set by the controller for one recompute, gives the reason
	// to keep an address kube-proxy would deliver back ("" none).
	hold func(a Address, s *corev1.Service) string
}

// Proxy is a reading of the node's Service proxy.
type Proxy interface {
	// Delivers reports whether the proxy sends traffic to ip, port and
	// protocol to an endpoint; known is false when its rules for ip's
	// family cannot be read.
	Delivers(ip netip.Addr, proto corev1.Protocol, port int32) (delivers, known bool)
}

// Source of an address.
const (
	SourceLoadBalancer = "loadBalancer" // status.loadBalancer.ingress
	SourceExternalIP   = "externalIP"   // spec.externalIPs
)

// States of an address on this node, as `flockctl services` shows them.
const (
	StateAdvertised    = "advertised"
	StateDraining      = "draining"
	StateNotAdvertised = "not advertised"
)

// Reasons an address is not advertised besides delivery's.
const (
	ReasonNotAuthorized = "address not authorized"
	ReasonClassNotOurs  = "class not ours"
	ReasonIPModeProxy   = "ipMode Proxy (the load balancer proxies to node ports; kube-proxy does not take the VIP)"
	ReasonMalformed     = "not an IP address"
	ReasonNotClaimed    = "address not claimed by this Service"
	ReasonWrongFamily   = "no kube-proxy of this family serves the Service"
	ReasonProxyPending  = "kube-proxy has not programmed it yet"
)

// Address is one Service address and what this node does with it.
type Address struct {
	Service   string     `json:"service"` // namespace/name
	IP        netip.Addr `json:"ip"`
	Source    string     `json:"source"` // SourceLoadBalancer or SourceExternalIP
	State     string     `json:"state"`
	Reason    string     `json:"reason"`
	Endpoints int        `json:"endpoints"` // what kube-proxy here delivers to
	// Local: externalTrafficPolicy Local (only this node's endpoints).
	Local bool `json:"local,omitempty"`
	// Raw is the value as written when it is not an IP.
	Raw string `json:"raw,omitempty"`
	// Route is the prefix it goes out as while advertised or draining:
	// the address itself, or its AddressPool's CIDR (aggregate).
	Route netip.Prefix `json:"route,omitzero"`
}

// Route is one Service route: its path and the Services it is for.
type Route struct {
	Path   advert.Path
	Owners []string // namespace/name, sorted
}

// Key names a Service: namespace/name.
func Key(s *corev1.Service) string { return s.Namespace + "/" + s.Name }

// Ours says whether flock serves a LoadBalancer Service's class.
func (o Options) Ours(s *corev1.Service) bool {
	c := s.Spec.LoadBalancerClass
	return c != nil && *c == Class || c == nil && o.DefaultClass
}

// ForService decides every address of one Service: its rows, in order
// (LoadBalancer ingress first, then external IPs, as written).
func ForService(o Options, s *corev1.Service, eps []*discoveryv1.EndpointSlice) []Address {
	var out []Address
	local := externalPolicyLocal(s)
	add := func(src, raw string, use string) {
		a := Address{Service: Key(s), Source: src, Local: local}
		ip, err := netip.ParseAddr(raw)
		if err != nil || ip.Zone() != "" {
			a.State, a.Reason, a.Raw = StateNotAdvertised, ReasonMalformed, raw
			out = append(out, a)
			return
		}
		a.IP = ip.Unmap()
		if o.Authorize == nil {
			a.State, a.Reason = StateNotAdvertised, ReasonNotAuthorized+": no AddressPools loaded"
			out = append(out, a)
			return
		}
		if err := o.Authorize(use, a.IP, s.Namespace); err != nil {
			a.State, a.Reason = StateNotAdvertised, fmt.Sprintf("%s: %v", ReasonNotAuthorized, err)
			out = append(out, a)
			return
		}
		if src == SourceLoadBalancer && o.Holder != nil {
			if held, by := o.Holder(a.IP, s.Namespace, s.Name, string(s.UID)); !held {
				a.State, a.Reason = StateNotAdvertised, ReasonNotClaimed
				if by != "" {
					a.Reason += fmt.Sprintf(" (%s holds it)", by)
				}
				out = append(out, a)
				return
			}
		}
		fam := corev1.IPv6Protocol
		if a.IP.Is4() {
			fam = corev1.IPv4Protocol
		}
		// kube-proxy's proxier of a family takes only Services of that
		// family: an address of another leads nowhere, whatever
		// EndpointSlices exist.
		if len(s.Spec.IPFamilies) > 0 && !slices.Contains(s.Spec.IPFamilies, fam) {
			a.State, a.Reason = StateNotAdvertised, fmt.Sprintf("%s: the Service is not %s (spec.ipFamilies %v)", ReasonWrongFamily, fam, s.Spec.IPFamilies)
			out = append(out, a)
			return
		}
		// kube-proxy proxies no headless or ExternalName Service, whatever
		// its endpoints: its addresses would draw traffic that is dropped.
		if delivery.Skipped(s) {
			a.State, a.Reason = StateNotAdvertised, string(delivery.ReasonNotProxied)
			out = append(out, a)
			return
		}
		d := delivery.Decide(delivery.Input{
			Local:                    local,
			PublishNotReadyAddresses: s.Spec.PublishNotReadyAddresses,
			Family:                   fam,
			Node:                     o.Node,
			Slices:                   eps,
			Ports:                    s.Spec.Ports,
		})
		a.Reason, a.Endpoints = string(d.Reason), d.Endpoints
		switch d.State {
		case delivery.Advertise:
			if o.hold != nil {
				if why := o.hold(a, s); why != "" {
					a.State, a.Reason = StateNotAdvertised, why
					break
				}
			}
			a.State, a.Route = StateAdvertised, netip.PrefixFrom(a.IP, a.IP.BitLen())
			if o.Aggregate != nil && !local {
				if agg := o.Aggregate(use, a.IP); agg.IsValid() && agg.Contains(a.IP) {
					a.Route = agg
				}
			}
		case delivery.Drain:
			a.State, a.Route = StateDraining, netip.PrefixFrom(a.IP, a.IP.BitLen())
		default:
			a.State = StateNotAdvertised
		}
		out = append(out, a)
	}
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP == "" {
				continue // a hostname: another implementation's
			}
			switch {
			case !o.Ours(s):
				out = append(out, Address{Service: Key(s), IP: parseOrZero(in.IP), Raw: rawIfBad(in.IP), Source: SourceLoadBalancer, State: StateNotAdvertised, Reason: ReasonClassNotOurs})
			case in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy:
				out = append(out, Address{Service: Key(s), IP: parseOrZero(in.IP), Raw: rawIfBad(in.IP), Source: SourceLoadBalancer, State: StateNotAdvertised, Reason: ReasonIPModeProxy})
			default:
				add(SourceLoadBalancer, in.IP, v1alpha1.UseLoadBalancer)
			}
		}
	}
	for _, ip := range s.Spec.ExternalIPs {
		add(SourceExternalIP, ip, v1alpha1.UseExternalIP)
	}
	return out
}

func parseOrZero(s string) netip.Addr {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}
	}
	return ip.Unmap()
}

func rawIfBad(s string) string {
	if parseOrZero(s).IsValid() {
		return ""
	}
	return s
}

// externalPolicyLocal mirrors kube-proxy's ExternalPolicyLocal: Local
// applies to a Service reachable from outside (LoadBalancer, NodePort or
// external IPs).
func externalPolicyLocal(s *corev1.Service) bool {
	external := s.Spec.Type == corev1.ServiceTypeLoadBalancer || s.Spec.Type == corev1.ServiceTypeNodePort || len(s.Spec.ExternalIPs) > 0
	return external && s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// Routes merges the addresses of every Service into the node's Service
// routes. An address several Services share (MetalLB-style sharing, or
// one external IP on different ports) is one route: advertised if any of
// them delivers it, draining only if every one that delivers drains, its
// weight the sum of theirs; owners are the Services that deliver it. An
// aggregate (Address.Route, the pool's CIDR) is one route for every
// address that goes out as it.
func Routes(o Options, addrs []Address) map[netip.Prefix]Route {
	type acc struct {
		advertise, drain bool
		weight           int
		owners           []string
	}
	m := map[netip.Prefix]*acc{}
	for _, a := range addrs {
		if a.State != StateAdvertised && a.State != StateDraining {
			continue
		}
		p := a.Route
		if !p.IsValid() {
			p = netip.PrefixFrom(a.IP, a.IP.BitLen())
		}
		x := m[p]
		if x == nil {
			x = &acc{}
			m[p] = x
		}
		if a.State == StateAdvertised {
			x.advertise = true
		} else {
			x.drain = true
		}
		if o.Weights && a.Local {
			x.weight += a.Endpoints
		}
		x.owners = append(x.owners, a.Service)
	}
	out := make(map[netip.Prefix]Route, len(m))
	for p, x := range m {
		slices.Sort(x.owners)
		path := advert.Path{Kind: advert.Service, Drain: !x.advertise, Weight: uint32(min(x.weight, 1<<20))}
		out[p] = Route{Path: path, Owners: slices.Compact(x.owners)}
	}
	return out
}

// Compute is the whole rule: every Service's addresses, sorted by
// Service then IP, and the node's routes.
func Compute(o Options, svcs []*corev1.Service, slicesOf func(key string) []*discoveryv1.EndpointSlice) ([]Address, map[netip.Prefix]Route) {
	var all []Address
	for _, s := range svcs {
		all = append(all, ForService(o, s, slicesOf(Key(s)))...)
	}
	SortAddresses(all)
	return all, Routes(o, all)
}

// SortAddresses orders rows by Service, then IP (then as written).
func SortAddresses(a []Address) {
	slices.SortStableFunc(a, func(x, y Address) int {
		return cmp.Or(strings.Compare(x.Service, y.Service), x.IP.Compare(y.IP), strings.Compare(x.Source, y.Source), strings.Compare(x.Raw, y.Raw))
	})
}
