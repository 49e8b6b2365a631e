package services

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/delivery"
)

const node = "node-a"

// authorize allows loadBalancer addresses in 2001:db8:1b::/64 and
// 203.0.113.128/27, external IPs in 2001:db8:e::/64 and 198.51.100.0/28,
// to namespace shop only.
func authorize(use string, ip netip.Addr, ns string) error {
	pools := map[string][]netip.Prefix{
		v1alpha1.UseLoadBalancer: {netip.MustParsePrefix("2001:db8:1b::/64"), netip.MustParsePrefix("203.0.113.128/27")},
		v1alpha1.UseExternalIP:   {netip.MustParsePrefix("2001:db8:e::/64"), netip.MustParsePrefix("198.51.100.0/28")},
	}
	for _, p := range pools[use] {
		if p.Contains(ip) {
			if ns != "shop" {
				return fmt.Errorf("no AddressPool allows namespace %s to use %s as %s", ns, ip, use)
			}
			return nil
		}
	}
	return fmt.Errorf("no AddressPool allows namespace %s to use %s as %s (none covers it)", ns, ip, use)
}

// holder is a claims answer: every address held by ns/name (uid), or by
// nobody when ns is "".
// holder is a claim held by one Service (none: ns ""), as the node's
// Holder reads it (an empty UID matches any incarnation).
func holder(ns, name, uid string) func(netip.Addr, string, string, string) (bool, string) {
	return func(_ netip.Addr, sns, sname, suid string) (bool, string) {
		switch {
		case ns == "":
			return false, ""
		case ns == sns && name == sname && (uid == "" || suid == "" || uid == suid):
			return true, ""
		}
		return false, "Service " + ns + "/" + name
	}
}

type svcOpt func(*corev1.Service)

func svc(name string, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(Class),
			ClusterIP: "fd00:96::10", ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func ingress(ips ...string) svcOpt {
	return func(s *corev1.Service) {
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
		}
	}
}

func local(s *corev1.Service) {
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
}

// ep is an endpoint on a node: "ready", "terminating" (serving) or
// "down" (neither).
type ep struct {
	node, ip, state string
}

func slicesFor(svcName string, eps ...ep) []*discoveryv1.EndpointSlice {
	by := map[discoveryv1.AddressType]*discoveryv1.EndpointSlice{}
	for _, e := range eps {
		at := discoveryv1.AddressTypeIPv6
		if strings.Contains(e.ip, ".") {
			at = discoveryv1.AddressTypeIPv4
		}
		sl := by[at]
		if sl == nil {
			sl = &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: svcName + "-" + string(at), Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
				AddressType: at,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
			}
			by[at] = sl
		}
		c := discoveryv1.EndpointConditions{Ready: ptr.To(e.state == "ready"), Serving: ptr.To(e.state != "down"), Terminating: ptr.To(e.state == "terminating")}
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, NodeName: ptr.To(e.node), Conditions: c})
	}
	var out []*discoveryv1.EndpointSlice
	for _, at := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeIPv4} {
		if by[at] != nil {
			out = append(out, by[at])
		}
	}
	return out
}

func row(a Address) string {
	ip := a.IP.String()
	if a.Raw != "" {
		ip = a.Raw
	}
	return fmt.Sprintf("%s %s %s: %s (%s, %d)", a.Service, a.Source, ip, a.State, a.Reason, a.Endpoints)
}

func TestForService(t *testing.T) {
	o := Options{Node: node, Authorize: authorize}
	for _, tc := range []struct {
		name string
		o    Options
		svc  *corev1.Service
		eps  []ep
		want []string
	}{
		{"LoadBalancer, Cluster, a ready endpoint elsewhere", o, svc("web", ingress("2001:db8:1b::1", "203.0.113.129")),
			[]ep{{"node-b", "fd00:10::1", "ready"}, {"node-b", "10.1.0.1", "ready"}},
			[]string{"shop/web loadBalancer 203.0.113.129: advertised (ready endpoint in the cluster, 1)", "shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"}},
		{"the IPv4 address needs IPv4 endpoints", o, svc("web", ingress("2001:db8:1b::1", "203.0.113.129")),
			[]ep{{"node-b", "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 203.0.113.129: not advertised (no usable endpoint in the cluster, 0)", "shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"}},
		{"Local, only remote endpoints", o, svc("web", ingress("2001:db8:1b::1"), local),
			[]ep{{"node-b", "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (no local ready or serving endpoint, 0)"}},
		{"Local, two local ready", o, svc("web", ingress("2001:db8:1b::1"), local),
			[]ep{{node, "fd00:10::1", "ready"}, {node, "fd00:10::2", "ready"}, {"node-b", "fd00:10::3", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: advertised (local ready endpoint, 2)"}},
		{"Local, the last local endpoint terminating: drain", o, svc("web", ingress("2001:db8:1b::1"), local),
			[]ep{{node, "fd00:10::1", "terminating"}, {"node-b", "fd00:10::3", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: draining (local endpoints terminating, 1)"}},
		{"Local, terminating and no longer serving: withdraw", o, svc("web", ingress("2001:db8:1b::1"), local),
			[]ep{{node, "fd00:10::1", "down"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (no usable endpoint in the cluster, 0)"}},
		{"another class", o, svc("web", ingress("2001:db8:1b::1"), func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("metallb.io/metallb") }),
			[]ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (class not ours, 0)"}},
		{"no class, not the default", o, svc("web", ingress("2001:db8:1b::1"), func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil }),
			[]ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (class not ours, 0)"}},
		{"no class, flock is the default", Options{Node: node, Authorize: authorize, DefaultClass: true}, svc("web", ingress("2001:db8:1b::1"), func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil }),
			[]ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"}},
		{"ipMode Proxy", o, svc("web", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "2001:db8:1b::1", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
		}), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (" + ReasonIPModeProxy + ", 0)"}},
		{"a hostname ingress is another implementation's", o, svc("web", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{Hostname: "lb.example.com"}}
		}), []ep{{node, "fd00:10::1", "ready"}}, nil},
		{"an ingress IP outside the loadBalancer pools", o, svc("web", ingress("2001:db8:99::1")),
			[]ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:99::1: not advertised (address not authorized: no AddressPool allows namespace shop to use 2001:db8:99::1 as loadBalancer (none covers it), 0)"}},
		{"externalIPs: authorized, another namespace's, outside, malformed", o, svc("ext", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeClusterIP
			s.Spec.ExternalIPs = []string{"2001:db8:e::5", "198.51.100.99", "not-an-ip", "fe80::1%eth0"}
		}), []ep{{node, "fd00:10::1", "ready"}, {node, "10.1.0.1", "ready"}},
			[]string{ // rows sort by IP: the unparseable first, IPv4 before IPv6
				"shop/ext externalIP fe80::1%eth0: not advertised (not an IP address, 0)",
				"shop/ext externalIP not-an-ip: not advertised (not an IP address, 0)",
				"shop/ext externalIP 198.51.100.99: not advertised (address not authorized: no AddressPool allows namespace shop to use 198.51.100.99 as externalIP (none covers it), 0)",
				"shop/ext externalIP 2001:db8:e::5: advertised (ready endpoint in the cluster, 1)",
			}},
		{"external IPs of a Service of another namespace are refused", o, func() *corev1.Service {
			s := svc("ext", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeClusterIP
				s.Spec.ExternalIPs = []string{"2001:db8:e::5"}
			})
			s.Namespace = "evil"
			return s
		}(), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"evil/ext externalIP 2001:db8:e::5: not advertised (address not authorized: no AddressPool allows namespace evil to use 2001:db8:e::5 as externalIP, 0)"}},
		{"a LoadBalancer address claimed by this Service", Options{Node: node, Authorize: authorize, Holder: holder("shop", "web", "")},
			svc("web", ingress("2001:db8:1b::1")), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"}},
		{"a LoadBalancer address nobody claimed (a status written by hand)", Options{Node: node, Authorize: authorize, Holder: holder("", "", "")},
			svc("web", ingress("2001:db8:1b::1")), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (address not claimed by this Service, 0)"}},
		{"a LoadBalancer address another Service holds", Options{Node: node, Authorize: authorize, Holder: holder("shop", "api", "")},
			svc("web", ingress("2001:db8:1b::1")), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (address not claimed by this Service (Service shop/api holds it), 0)"}},
		{"a LoadBalancer address an earlier incarnation holds", Options{Node: node, Authorize: authorize, Holder: holder("shop", "web", "old-uid")},
			func() *corev1.Service { s := svc("web", ingress("2001:db8:1b::1")); s.UID = "new-uid"; return s }(), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (address not claimed by this Service (Service shop/web holds it), 0)"}},
		{"the claim check is not asked of external IPs", Options{Node: node, Authorize: authorize, Holder: holder("", "", "")},
			svc("ext", func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeClusterIP
				s.Spec.ExternalIPs = []string{"2001:db8:e::5"}
			}),
			[]ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/ext externalIP 2001:db8:e::5: advertised (ready endpoint in the cluster, 1)"}},
		{"an external IP of a family the Service is not", o, svc("ext", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeClusterIP
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
			s.Spec.ExternalIPs = []string{"2001:db8:e::5", "198.51.100.5"}
		}), []ep{{node, "fd00:10::1", "ready"}, {node, "10.1.0.1", "ready"}},
			[]string{
				"shop/ext externalIP 198.51.100.5: advertised (ready endpoint in the cluster, 1)",
				"shop/ext externalIP 2001:db8:e::5: not advertised (no kube-proxy of this family serves the Service: the Service is not IPv6 (spec.ipFamilies [IPv4]), 0)",
			}},
		// kube-proxy's ShouldSkipService: no rules for these, so their
		// addresses would lead nowhere on any node.
		{"external IPs of a headless Service", o, svc("hl", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeClusterIP
			s.Spec.ClusterIP = corev1.ClusterIPNone
			s.Spec.ExternalIPs = []string{"2001:db8:e::5"}
		}), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/hl externalIP 2001:db8:e::5: not advertised (" + string(delivery.ReasonNotProxied) + ", 0)"}},
		{"external IPs of a Service without a cluster IP", o, svc("noip", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeClusterIP
			s.Spec.ClusterIP = ""
			s.Spec.ExternalIPs = []string{"2001:db8:e::5"}
		}), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/noip externalIP 2001:db8:e::5: not advertised (" + string(delivery.ReasonNotProxied) + ", 0)"}},
		{"external IPs of an ExternalName Service (even with a cluster IP)", o, svc("en", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
			s.Spec.ExternalName = "db.example.com"
			s.Spec.ExternalIPs = []string{"2001:db8:e::5", "198.51.100.5"}
		}), []ep{{node, "fd00:10::1", "ready"}, {node, "10.1.0.1", "ready"}},
			[]string{
				"shop/en externalIP 198.51.100.5: not advertised (" + string(delivery.ReasonNotProxied) + ", 0)",
				"shop/en externalIP 2001:db8:e::5: not advertised (" + string(delivery.ReasonNotProxied) + ", 0)",
			}},
		{"a Service of another service proxy (kube-proxy never sees it)", o, svc("other", ingress("2001:db8:1b::1"), func(s *corev1.Service) {
			s.Labels = map[string]string{delivery.LabelServiceProxyName: "my-proxy"}
		}), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/other loadBalancer 2001:db8:1b::1: not advertised (" + string(delivery.ReasonNotProxied) + ", 0)"}},
		// kube-proxy files a slice's endpoints under the Service port of
		// the slice port's name and protocol (the slices' port is http/TCP).
		{"the Service's port has the slices' port's name and protocol", o, svc("web", ingress("2001:db8:1b::1"), func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}, {Name: "http", Port: 80}}
		}), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: advertised (ready endpoint in the cluster, 1)"}},
		{"a slice port no Service port has: its endpoints serve nothing", o, svc("web", ingress("2001:db8:1b::1"), func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP}}
		}), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (no usable endpoint in the cluster, 0)"}},
		{"an unnamed Service port, named slice ports", o, svc("web", ingress("2001:db8:1b::1"), func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}
		}), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (no usable endpoint in the cluster, 0)"}},
		{"a Service port of the slices' port's name and another protocol", o, svc("web", ingress("2001:db8:1b::1"), func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolUDP}}
		}), []ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (no usable endpoint in the cluster, 0)"}},
		{"no AddressPools loaded: nothing advertised", Options{Node: node}, svc("web", ingress("2001:db8:1b::1")),
			[]ep{{node, "fd00:10::1", "ready"}},
			[]string{"shop/web loadBalancer 2001:db8:1b::1: not advertised (address not authorized: no AddressPools loaded, 0)"}},
		{"an IPv4-mapped external IP is its IPv4 address", o, svc("ext", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeClusterIP
			s.Spec.ExternalIPs = []string{"::ffff:198.51.100.5"}
		}), []ep{{node, "10.1.0.1", "ready"}},
			[]string{"shop/ext externalIP 198.51.100.5: advertised (ready endpoint in the cluster, 1)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ForService(tc.o, tc.svc, slicesFor(tc.svc.Name, tc.eps...))
			SortAddresses(got)
			var rows []string
			for _, a := range got {
				rows = append(rows, row(a))
			}
			if strings.Join(rows, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(rows, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// Routes: one per address; shared addresses merge (advertised if any
// Service delivers, draining only if all that deliver drain, weights
// summed when enabled and only for Local); nothing for what is not
// advertised.
func TestRoutes(t *testing.T) {
	a := netip.MustParseAddr("2001:db8:1b::1")
	b := netip.MustParseAddr("203.0.113.129")
	c := netip.MustParseAddr("2001:db8:e::5")
	addrs := []Address{
		{Service: "shop/web", IP: a, State: StateAdvertised, Endpoints: 2, Local: true},
		{Service: "shop/web2", IP: a, State: StateDraining, Endpoints: 1, Local: true},
		{Service: "shop/api", IP: b, State: StateDraining, Endpoints: 1, Local: true},
		{Service: "shop/api2", IP: b, State: StateDraining, Endpoints: 3, Local: true},
		{Service: "shop/ext", IP: c, State: StateAdvertised, Endpoints: 5},
		{Service: "shop/off", IP: netip.MustParseAddr("2001:db8:1b::9"), State: StateNotAdvertised},
	}
	for _, weights := range []bool{false, true} {
		got := Routes(Options{Weights: weights}, addrs)
		w := func(n uint32) uint32 {
			if weights {
				return n
			}
			return 0
		}
		want := map[netip.Prefix]Route{
			netip.PrefixFrom(a, 128): {Path: advert.Path{Kind: advert.Service, Weight: w(3)}, Owners: []string{"shop/web", "shop/web2"}},
			netip.PrefixFrom(b, 32):  {Path: advert.Path{Kind: advert.Service, Drain: true, Weight: w(4)}, Owners: []string{"shop/api", "shop/api2"}},
			netip.PrefixFrom(c, 128): {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/ext"}}, // Cluster: no weight
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("weights %v: Routes =\n %v\nwant\n %v", weights, got, want)
		}
	}
}

// Compute takes every Service, and the Authorize error is the pools' own.
func TestCompute(t *testing.T) {
	svcs := []*corev1.Service{svc("web", ingress("2001:db8:1b::1"), local), svc("b-ext", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.ExternalIPs = []string{"2001:db8:e::5"}
	})}
	eps := map[string][]*discoveryv1.EndpointSlice{
		"shop/web":   slicesFor("web", ep{node, "fd00:10::1", "ready"}),
		"shop/b-ext": slicesFor("b-ext", ep{"node-b", "fd00:10::2", "ready"}),
	}
	addrs, routes := Compute(Options{Node: node, Authorize: authorize, Weights: true}, svcs, func(k string) []*discoveryv1.EndpointSlice { return eps[k] })
	if len(addrs) != 2 || addrs[0].Service != "shop/b-ext" || addrs[1].Service != "shop/web" {
		t.Errorf("addresses %v: want both, sorted by Service", addrs)
	}
	if len(routes) != 2 || routes[netip.MustParsePrefix("2001:db8:1b::1/128")].Path.Weight != 1 {
		t.Errorf("routes %v", routes)
	}
	denied := Options{Node: node, Authorize: func(string, netip.Addr, string) error { return errors.New("pool p is invalid") }}
	addrs, routes = Compute(denied, svcs, func(k string) []*discoveryv1.EndpointSlice { return eps[k] })
	if len(routes) != 0 || !strings.Contains(addrs[0].Reason, "pool p is invalid") {
		t.Errorf("denied: %v %v", addrs, routes)
	}
}

// An aggregating pool: the addresses of Cluster Services this node
// advertises go out as the pool's CIDR, one route for all of them; Local
// ones and draining ones still go out on their own, and so does an address
// whose pool does not aggregate.
func TestAggregate(t *testing.T) {
	aggregate := func(use string, ip netip.Addr) netip.Prefix {
		for _, p := range []netip.Prefix{netip.MustParsePrefix("2001:db8:1b::/64"), netip.MustParsePrefix("203.0.113.128/27")} {
			if use == v1alpha1.UseLoadBalancer && p.Contains(ip) {
				return p
			}
		}
		return netip.Prefix{}
	}
	ext := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.ExternalIPs = []string{"2001:db8:e::5"}
	}
	svcs := []*corev1.Service{
		svc("web", ingress("2001:db8:1b::1")), svc("api", ingress("2001:db8:1b::2", "203.0.113.129")),
		svc("loc", ingress("2001:db8:1b::3"), local), svc("old", ingress("203.0.113.130")), svc("ext", ext), svc("none", ingress("2001:db8:1b::4")),
	}
	eps := map[string][]*discoveryv1.EndpointSlice{
		"shop/web":  slicesFor("web", ep{"node-b", "fd00:10::1", "ready"}),
		"shop/api":  slicesFor("api", ep{"node-b", "fd00:10::2", "ready"}, ep{"node-b", "10.1.0.2", "ready"}),
		"shop/loc":  slicesFor("loc", ep{node, "fd00:10::3", "ready"}),
		"shop/old":  slicesFor("old", ep{"node-b", "10.1.0.4", "terminating"}),
		"shop/ext":  slicesFor("ext", ep{"node-b", "fd00:10::5", "ready"}),
		"shop/none": nil,
	}
	o := Options{Node: node, Authorize: authorize, Aggregate: aggregate}
	addrs, routes := Compute(o, svcs, func(k string) []*discoveryv1.EndpointSlice { return eps[k] })
	want := map[netip.Prefix]Route{
		netip.MustParsePrefix("2001:db8:1b::/64"):   {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/api", "shop/web"}},
		netip.MustParsePrefix("203.0.113.128/27"):   {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/api"}},
		netip.MustParsePrefix("2001:db8:1b::3/128"): {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/loc"}},
		netip.MustParsePrefix("203.0.113.130/32"):   {Path: advert.Path{Kind: advert.Service, Drain: true}, Owners: []string{"shop/old"}},
		netip.MustParsePrefix("2001:db8:e::5/128"):  {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/ext"}},
	}
	if fmt.Sprint(routes) != fmt.Sprint(want) {
		t.Errorf("routes\n %v\nwant\n %v", routes, want)
	}
	for _, a := range addrs {
		if a.Service == "shop/none" && (a.State != StateNotAdvertised || a.Route.IsValid()) {
			t.Errorf("an address with no endpoint: %+v", a)
		}
		if a.Service == "shop/web" && a.Route != netip.MustParsePrefix("2001:db8:1b::/64") {
			t.Errorf("web's row does not say it goes out as the aggregate: %+v", a)
		}
	}
	// Without the option nothing is aggregated.
	o.Aggregate = nil
	if _, routes := Compute(o, svcs, func(k string) []*discoveryv1.EndpointSlice { return eps[k] }); len(routes) != 6 {
		t.Errorf("no aggregation: %d routes, want one per address (6): %v", len(routes), routes)
	}
}
