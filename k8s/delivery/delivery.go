// Package delivery decides whether this node should advertise a Service's
// external address (a LoadBalancer ingress IP or an external IP) over BGP.
// The rule is kube-proxy's: a node advertises exactly when kube-proxy on that
// node would deliver external traffic for the address to an endpoint, so a
// router never sends a flow to a node that would drop it.
//
// The rules mirror these Kubernetes sources (read on master after
// kubernetes/kubernetes#135593, which went into v1.36):
//
//   - pkg/proxy/util/utils.go, ShouldSkipService (called by
//     ServiceChangeTracker.serviceToServiceMap before any rule is written):
//     a Service whose spec.clusterIP is "None" (headless) or empty
//     (helper.IsServiceIPSet), or of type ExternalName, is not proxied at
//     all, so none of its addresses (external IPs included) is delivered
//     on any node: Skipped.
//   - cmd/kube-proxy/app/server.go, the informer factories' selectors: a
//     Service labelled service.kubernetes.io/service-proxy-name belongs to
//     another proxy, and kube-proxy never sees it (noProxyName): Skipped
//     too; neither does it see a Service with clusterIP None (field
//     selector), nor an EndpointSlice labelled service.kubernetes.io/headless
//     (noHeadlessEndpoints), whatever its Service: its endpoints count for
//     no port.
//   - pkg/proxy/endpointschangetracker.go, EndpointsChangeTracker.EndpointSliceUpdate:
//     a per-family proxier only reads EndpointSlices of its own AddressType.
//   - pkg/proxy/endpointslicecache.go, endpointInfoByServicePort and
//     addEndpoints: endpoints are grouped by Service port (slice port name and
//     protocol; ports with no name, no number or number 0 are skipped), an
//     endpoint with no addresses is skipped, only its first address counts,
//     ready = Ready unset or true, serving = Serving unset or true (not "as
//     ready"), terminating = Terminating set and true, local = NodeName set
//     and equal to this node's (non-empty) name, and one endpoint per
//     address:port, a non-terminating copy beating a terminating one.
//   - pkg/proxy/topology.go, CategorizeEndpoints: Cluster policy uses the ready
//     endpoints, else (none ready anywhere) the serving-and-terminating ones;
//     Local policy uses the local ready endpoints, else the local
//     serving-and-terminating ones.
//   - pkg/proxy/nftables/proxier.go and pkg/proxy/iptables/proxier.go,
//     syncProxyRules (hasExternalEndpoints): external traffic under Local
//     policy is dropped when there is no local endpoint, under Cluster policy
//     when there is no endpoint at all.
//   - staging/src/k8s.io/endpointslice/utils.go, podToEndpoint (the
//     EndpointSlice controller, pkg/controller/endpointslice): with
//     publishNotReadyAddresses every endpoint it lists, terminating ones too,
//     is written ready=true.
//
// Topology (hints, trafficDistribution) never changes the decision: kube-proxy
// only narrows the Cluster endpoints by hints when a ready endpoint is hinted
// for this node or zone, and never narrows the Local ones. Neither does
// internalTrafficPolicy, which governs only ClusterIP traffic.
package delivery

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// State is what the node does with the address.
type State int

// States, ordered: a larger one delivers more.
const (
	// Withdraw: kube-proxy here would drop the traffic.
	Withdraw State = iota
	// Drain: kube-proxy here delivers, but only to endpoints that are
	// terminating and still serving; the caller keeps the route with the
	// GRACEFUL_SHUTDOWN community so peers move away before they go.
	Drain
	// Advertise: kube-proxy here delivers to ready endpoints.
	Advertise
)

func (s State) String() string {
	switch s {
	case Withdraw:
		return "withdraw"
	case Drain:
		return "drain"
	case Advertise:
		return "advertise"
	}
	return "unknown"
}

// Reason says why, in words `flockctl services` shows to operators; the
// strings are stable.
type Reason string

// Reasons.
const (
	ReasonLocalReady         Reason = "local ready endpoint"
	ReasonClusterReady       Reason = "ready endpoint in the cluster"
	ReasonLocalTerminating   Reason = "local endpoints terminating"
	ReasonClusterTerminating Reason = "endpoints terminating"
	// ReasonNoLocal (Local policy): usable endpoints exist, on other nodes.
	ReasonNoLocal Reason = "no local ready or serving endpoint"
	// ReasonNone: no ready or serving-and-terminating endpoint anywhere.
	ReasonNone Reason = "no usable endpoint in the cluster"
)

// Decision is the verdict for one address.
type Decision struct {
	State  State
	Reason Reason
	// Endpoints is how many endpoints (distinct addresses) this node's
	// kube-proxy would deliver to: under Local policy the local ones it uses,
	// under Cluster policy the cluster-wide ones it uses (ignoring topology
	// hints, which may narrow that set on some nodes). 0 exactly when State
	// is Withdraw. The caller turns it into a link-bandwidth weight.
	Endpoints int
}

// Input is what the decision depends on.
type Input struct {
	// Local is externalTrafficPolicy: Local on an externally accessible
	// Service (pkg/api/v1/service/util.go, ExternalPolicyLocal); else Cluster.
	Local bool
	// PublishNotReadyAddresses is the Service's spec field. The EndpointSlice
	// controller then marks every endpoint ready; honouring it here keeps the
	// answer right while the controller lags. It applies only to slices that
	// controller owns (or that carry no managed-by label): other managers,
	// such as the mirroring controller, write conditions of their own.
	PublishNotReadyAddresses bool
	// Family is the advertised address's family; kube-proxy's per-family
	// proxier only reads EndpointSlices of that AddressType. Any other value
	// matches no slice.
	Family corev1.IPFamily
	// Node is this node's name; an endpoint is local when its NodeName
	// equals it. Empty matches nothing, as in kube-proxy.
	Node string
	// Slices is every EndpointSlice of the Service, any AddressType: those
	// of another family and FQDN ones are ignored. Decide does not modify
	// them.
	Slices []*discoveryv1.EndpointSlice
	// Ports are the Service's: kube-proxy files a slice's endpoints under
	// the Service port of the slice port's name and protocol, and those of
	// a slice port no Service port has serve nothing (hand-written slices,
	// or a port renamed while the controller catches up). Nil: every
	// slice port counts.
	Ports []corev1.ServicePort
}

// ReasonNotProxied: kube-proxy does not serve the Service at all (Skipped).
const ReasonNotProxied Reason = "kube-proxy does not proxy headless or ExternalName Services, nor those of another service proxy"

// LabelServiceProxyName names the proxy that serves a Service instead of
// kube-proxy (k8s.io/kubernetes pkg/proxy/apis.LabelServiceProxyName).
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// Skipped is kube-proxy's ShouldSkipService plus its informers' label
// selector: a headless Service (clusterIP None or empty), one of type
// ExternalName, or one labelled for another proxy gets no rules, so its
// external IPs and LoadBalancer addresses lead nowhere on any node.
func Skipped(s *corev1.Service) bool {
	if _, other := s.Labels[LabelServiceProxyName]; other {
		return true
	}
	return s.Spec.ClusterIP == corev1.ClusterIPNone || s.Spec.ClusterIP == "" || s.Spec.Type == corev1.ServiceTypeExternalName
}

// LabelHeadless marks the EndpointSlices of a headless Service
// (corev1.IsHeadlessService); kube-proxy's EndpointSlice informer
// selects only slices without it.
const LabelHeadless = corev1.IsHeadlessService

// controllerName is the managed-by value of the EndpointSlice controller,
// the one that applies publishNotReadyAddresses.
const controllerName = "endpointslice-controller.k8s.io"

// Decide says whether this node should advertise the address. A Service has
// one address for all its ports, while kube-proxy delivers per Service port;
// so Decide judges every port separately and takes the best state
// (Advertise > Drain > Withdraw): the address is advertised when at least one
// port is delivered. Endpoints then counts the distinct endpoint addresses
// used by the ports at that best state.
func Decide(in Input) Decision {
	ports := collect(in)
	best := Decision{State: Withdraw, Reason: ReasonNone}
	var used map[string]struct{}
	for _, eps := range ports {
		state, reason, addrs := decidePort(eps, in.Local)
		switch {
		case state > best.State:
			best.State, best.Reason, used = state, reason, map[string]struct{}{}
		case state < best.State:
			continue
		case reason == ReasonNoLocal:
			// Among withdrawn ports, "endpoints elsewhere" tells the
			// operator more than "none anywhere".
			best.Reason = reason
		}
		for _, a := range addrs {
			used[a] = struct{}{}
		}
	}
	best.Endpoints = len(used)
	return best
}

// portKey names a Service port the way kube-proxy's ServicePortName does.
type portKey struct {
	name     string
	protocol corev1.Protocol
}

// epKey is kube-proxy's endpoint identity: address and port number.
type epKey struct {
	addr string
	port int32
}

// endpoint holds the conditions kube-proxy derives for one endpoint.
type endpoint struct {
	terminating, ready, serving, local bool
}

// better orders copies of one address:port. kube-proxy lets a
// non-terminating copy replace a terminating one (a reused pod IP: the
// running pod wins) and otherwise leaves the winner to map order; the rest
// of the order (ready, serving, local) only makes the answer independent of
// slice and endpoint order.
func (e endpoint) better(o endpoint) bool {
	for _, c := range [][2]bool{{!e.terminating, !o.terminating}, {e.ready, o.ready}, {e.serving, o.serving}, {e.local, o.local}} {
		if c[0] != c[1] {
			return c[0]
		}
	}
	return false
}

// collect builds kube-proxy's per-port endpoint sets from the slices of the
// address's family.
func collect(in Input) map[portKey]map[epKey]endpoint {
	var want discoveryv1.AddressType
	switch in.Family {
	case corev1.IPv4Protocol:
		want = discoveryv1.AddressTypeIPv4
	case corev1.IPv6Protocol:
		want = discoveryv1.AddressTypeIPv6
	default:
		return nil
	}
	var served map[portKey]bool
	if in.Ports != nil {
		served = make(map[portKey]bool, len(in.Ports))
		for _, p := range in.Ports {
			served[portKey{name: p.Name, protocol: orTCP(p.Protocol)}] = true
		}
	}
	ports := map[portKey]map[epKey]endpoint{}
	for _, s := range in.Slices {
		if s == nil || s.AddressType != want {
			continue
		}
		if _, headless := s.Labels[LabelHeadless]; headless {
			continue // kube-proxy never lists it
		}
		m, ok := s.Labels[discoveryv1.LabelManagedBy]
		allReady := in.PublishNotReadyAddresses && (!ok || m == controllerName)
		for _, p := range s.Ports {
			if p.Name == nil || p.Port == nil || *p.Port == 0 {
				continue
			}
			pk := portKey{name: *p.Name, protocol: corev1.ProtocolTCP} // the API's default
			if p.Protocol != nil {
				pk.protocol = orTCP(*p.Protocol)
			}
			if served != nil && !served[pk] {
				continue // no Service port of that name and protocol
			}
			set := ports[pk]
			if set == nil {
				set = map[epKey]endpoint{}
				ports[pk] = set
			}
			for i := range s.Endpoints {
				e := &s.Endpoints[i]
				if len(e.Addresses) == 0 {
					continue
				}
				c := e.Conditions
				ep := endpoint{
					ready:       allReady || c.Ready == nil || *c.Ready,
					serving:     c.Serving == nil || *c.Serving,
					terminating: c.Terminating != nil && *c.Terminating,
					local:       in.Node != "" && e.NodeName != nil && *e.NodeName == in.Node,
				}
				k := epKey{addr: canonical(e.Addresses[0]), port: *p.Port}
				if old, dup := set[k]; !dup || ep.better(old) {
					set[k] = ep
				}
			}
		}
	}
	return ports
}

// orTCP is p, or TCP (the API's default) if it is empty.
func orTCP(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// canonical spells an address the one way, as kube-proxy's parse-and-print
// does, so duplicates spelled differently merge.
func canonical(s string) string {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().String()
	}
	return s
}

// decidePort is CategorizeEndpoints plus the proxier's hasExternalEndpoints
// for one Service port; it returns the addresses of the endpoints used.
func decidePort(eps map[epKey]endpoint, local bool) (State, Reason, []string) {
	var ready, drain, localReady, localDrain []string
	for k, e := range eps {
		switch {
		case e.ready:
			ready = append(ready, k.addr)
			if e.local {
				localReady = append(localReady, k.addr)
			}
		case e.serving && e.terminating:
			drain = append(drain, k.addr)
			if e.local {
				localDrain = append(localDrain, k.addr)
			}
		}
	}
	if local {
		switch {
		case len(localReady) > 0:
			return Advertise, ReasonLocalReady, localReady
		case len(localDrain) > 0:
			return Drain, ReasonLocalTerminating, localDrain
		case len(ready) > 0 || len(drain) > 0:
			return Withdraw, ReasonNoLocal, nil
		}
		return Withdraw, ReasonNone, nil
	}
	switch {
	case len(ready) > 0:
		return Advertise, ReasonClusterReady, ready
	case len(drain) > 0:
		return Drain, ReasonClusterTerminating, drain
	}
	return Withdraw, ReasonNone, nil
}
