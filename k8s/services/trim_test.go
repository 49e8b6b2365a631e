package services

import (
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/delivery"
)

// world is a random cluster: Services and EndpointSlices with every field
// the rule reads varied (and slices that mislead: labelled headless or
// for another proxy while their Service is neither), and fields it never
// reads filled in.
type world struct {
	seed  uint64
	class bool // Options.DefaultClass
	svcs  []*corev1.Service
	eps   []*discoveryv1.EndpointSlice
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

func maybe[T any](r *rand.Rand, xs ...T) *T {
	if r.IntN(4) == 0 {
		return nil
	}
	v := pick(r, xs...)
	return &v
}

func randomWorld(seed uint64) world {
	r := rand.New(rand.NewPCG(seed, 7))
	w := world{seed: seed, class: r.IntN(2) == 0}
	junkMeta := func(m *metav1.ObjectMeta) {
		m.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}
		m.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		m.OwnerReferences = []metav1.OwnerReference{{Kind: "Deployment", Name: "x"}}
		m.Generation, m.ResourceVersion = 3, "42"
	}
	lbIPs := []string{"2001:db8:1b::1", "2001:db8:1b::2", "203.0.113.129", "203.0.113.130", "192.0.2.1", "not-an-ip", "fe80::1%eth0", ""}
	extIPs := []string{"2001:db8:e::1", "198.51.100.1", "198.51.100.2", "2001:db8:f::1"}
	n := 1 + r.IntN(12)
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: pick(r, "shop", "shop", "shop", "shop", "other"), Name: name,
			UID: types.UID(pick(r, "uid-"+name, "uid-"+name, "uid-"+name, "uid-old"))}}
		junkMeta(&s.ObjectMeta)
		s.Labels = map[string]string{"app": name}
		if r.IntN(6) == 0 {
			s.Labels[delivery.LabelServiceProxyName] = pick(r, "other-proxy", "")
		}
		s.Spec = corev1.ServiceSpec{
			Type:                     pick(r, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeExternalName),
			ClusterIP:                pick(r, "fd00:96::10", "fd00:96::10", "fd00:96::10", "fd00:96::10", corev1.ClusterIPNone, ""),
			LoadBalancerClass:        maybe(r, Class, Class, "other.example/lb"),
			ExternalTrafficPolicy:    pick(r, corev1.ServiceExternalTrafficPolicyLocal, corev1.ServiceExternalTrafficPolicyCluster, ""),
			PublishNotReadyAddresses: r.IntN(3) == 0,
			IPFamilies:               pick(r, nil, []corev1.IPFamily{corev1.IPv6Protocol}, []corev1.IPFamily{corev1.IPv4Protocol}, []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}),
			Selector:                 map[string]string{"app": name},
			SessionAffinity:          corev1.ServiceAffinityClientIP,
			ExternalName:             "example.com",
			HealthCheckNodePort:      30001,
		}
		for range r.IntN(3) {
			s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, pick(r, extIPs...))
		}
		for range r.IntN(4) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: pick(r, "http", "dns"), Port: pick[int32](r, 80, 53),
				Protocol: pick(r, corev1.ProtocolTCP, corev1.ProtocolUDP, ""), NodePort: 30080})
		}
		for range r.IntN(3) {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: pick(r, lbIPs...),
				Hostname: pick(r, "", "lb.example.com"), IPMode: maybe(r, corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy)})
		}
		w.svcs = append(w.svcs, s)
	}
	addrs := map[discoveryv1.AddressType][]string{
		discoveryv1.AddressTypeIPv6: {"fd00:10::1", "fd00:10::2", "FD00:10:0::1"},
		discoveryv1.AddressTypeIPv4: {"10.1.0.1", "10.1.0.2"},
		discoveryv1.AddressTypeFQDN: {"db.example.com"},
	}
	for i := range 4 * n {
		s := pick(r, w.svcs...)
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: fmt.Sprintf("%s-%d", s.Name, i),
			Labels: map[string]string{discoveryv1.LabelServiceName: s.Name}}}
		junkMeta(&sl.ObjectMeta)
		if r.IntN(10) == 0 {
			sl.Namespace = pick(r, "shop", "other") // maybe another Service's, or none
		}
		if r.IntN(10) == 0 {
			delete(sl.Labels, discoveryv1.LabelServiceName)
		}
		if m := pick(r, "endpointslice-controller.k8s.io", "endpointslice-controller.k8s.io", "endpointslicemirroring-controller.k8s.io", ""); m != "" {
			sl.Labels[discoveryv1.LabelManagedBy] = m
		}
		if r.IntN(6) == 0 {
			sl.Labels[delivery.LabelHeadless] = ""
		}
		if r.IntN(6) == 0 {
			sl.Labels[delivery.LabelServiceProxyName] = "other-proxy"
		}
		sl.AddressType = pick(r, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeFQDN)
		for range r.IntN(3) + r.IntN(2) {
			sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: maybe(r, "http", "dns"), Port: maybe[int32](r, 8080, 8080, 5353, 0),
				Protocol: maybe(r, corev1.ProtocolTCP, corev1.ProtocolUDP), AppProtocol: ptr.To("http")})
		}
		for range r.IntN(5) {
			e := discoveryv1.Endpoint{
				Conditions: discoveryv1.EndpointConditions{Ready: maybe(r, true, false), Serving: maybe(r, true, false), Terminating: maybe(r, true, false)},
				NodeName:   maybe(r, node, "node-b"),
				Hostname:   ptr.To("pod"), Zone: ptr.To("z1"),
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "pod"},
				Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
			}
			for range r.IntN(3) {
				e.Addresses = append(e.Addresses, pick(r, addrs[sl.AddressType]...))
			}
			sl.Endpoints = append(sl.Endpoints, e)
		}
		w.eps = append(w.eps, sl)
	}
	return w
}

// delivers is the world's kube-proxy: it has programmed three in four of
// the addresses, ports and protocols, the same ones on every call.
type delivers uint64

func (d delivers) Delivers(ip netip.Addr, proto corev1.Protocol, port int32) (bool, bool) {
	h := fnv.New64a()
	fmt.Fprint(h, uint64(d), ip, proto, port)
	return h.Sum64()%4 != 0, true
}

// decide is what the node makes of the world, as the controller computes
// it: every Service's rows (slices found through the controller's index
// key, addresses held by its kube-proxy wait) and the routes.
func decide(w world, svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice) ([]Address, map[netip.Prefix]Route) {
	o := Options{
		Node: node, DefaultClass: w.class, Weights: true, Authorize: authorize,
		Holder: func(_ netip.Addr, ns, name, uid string) (bool, string) {
			return uid == "uid-"+name, ns + "/someone"
		},
		Aggregate: func(use string, ip netip.Addr) netip.Prefix {
			if p := netip.MustParsePrefix("2001:db8:1b::/64"); use == "loadBalancer" && p.Contains(ip) {
				return p
			}
			return netip.Prefix{}
		},
		ReadProxy: func() (Proxy, error) { return delivers(w.seed), nil },
	}
	c := &Controller{log: slog.New(slog.NewTextHandler(io.Discard, nil)), rows: map[string][]Address{}, heldSince: map[string]map[netip.Addr]time.Time{}}
	o.hold, _ = c.holder(o)
	by := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range eps {
		if k := sliceService(s); k != "" {
			by[k] = append(by[k], s)
		}
	}
	return Compute(o, svcs, func(key string) []*discoveryv1.EndpointSlice { return by[key] })
}

// listed is what the API server sends the informers: the objects their
// selectors match (a Service's selectable fields are its name, namespace,
// spec.clusterIP and spec.type).
func listed(t testing.TB, svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice, sliceSel string) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	sl, err := labels.Parse(serviceLabels)
	if err != nil {
		t.Fatal(err)
	}
	sf, err := fields.ParseSelector(serviceFields)
	if err != nil {
		t.Fatal(err)
	}
	el, err := labels.Parse(sliceSel)
	if err != nil {
		t.Fatal(err)
	}
	var outS []*corev1.Service
	for _, s := range svcs {
		f := fields.Set{"metadata.name": s.Name, "metadata.namespace": s.Namespace, "spec.clusterIP": s.Spec.ClusterIP, "spec.type": string(s.Spec.Type)}
		if sl.Matches(labels.Set(s.Labels)) && sf.Matches(f) {
			outS = append(outS, s)
		}
	}
	var outE []*discoveryv1.EndpointSlice
	for _, s := range eps {
		if el.Matches(labels.Set(s.Labels)) {
			outE = append(outE, s)
		}
	}
	return outS, outE
}

// trimmed runs the informers' transforms (on copies) and then mutate.
func trimmed(t testing.TB, svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice, mutS func(*corev1.Service), mutE func(*discoveryv1.EndpointSlice)) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	var outS []*corev1.Service
	for _, s := range svcs {
		o, err := trimService(s.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		ts := o.(*corev1.Service)
		if mutS != nil {
			mutS(ts)
		}
		outS = append(outS, ts)
	}
	var outE []*discoveryv1.EndpointSlice
	for _, s := range eps {
		o, err := trimSlice(s.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		te := o.(*discoveryv1.EndpointSlice)
		if mutE != nil {
			mutE(te)
		}
		outE = append(outE, te)
	}
	return outS, outE
}

// show is rows and routes as an operator reads them.
func show(rows []Address, routes map[netip.Prefix]Route) string {
	var b strings.Builder
	for _, a := range rows {
		fmt.Fprintf(&b, "  %s\n", row(a))
	}
	fmt.Fprintf(&b, "  routes %v", routes)
	return b.String()
}

func same(a1 []Address, r1 map[netip.Prefix]Route, a2 []Address, r2 map[netip.Prefix]Route) bool {
	return reflect.DeepEqual(a1, a2) && fmt.Sprint(r1) == fmt.Sprint(r2)
}

// worlds is how many worlds a mutant gets to show itself in: the same
// ones on every run (seeds 0 to worlds-1), so a mutant the test catches
// is caught every time.
const worlds = 3000

// randomWorlds calls f with the seeds of this run's worlds: from a random
// base (FLOCK_SEED=<n> repeats a run), fewer with -short.
func randomWorlds(t *testing.T, f func(seed uint64)) {
	base := uint64(testutil.Seed(t))
	n := uint64(1000)
	if testing.Short() {
		n = 200
	}
	for i := range n {
		f(base + i)
	}
}

// The informers' selectors are kube-proxy's, and change no route: the
// node advertises from what the API server sends exactly what it would
// from every object, every row of a Service that is listed is the same,
// and no Service left out has an address advertised or draining.
func TestSelectorsChangeNoRoute(t *testing.T) {
	if serviceLabels != "!service.kubernetes.io/service-proxy-name" || serviceFields != "spec.clusterIP!=None" || sliceLabels != "!service.kubernetes.io/headless" {
		t.Fatalf("selectors %q %q %q: not kube-proxy's", serviceLabels, serviceFields, sliceLabels)
	}
	randomWorlds(t, func(seed uint64) {
		w := randomWorld(seed)
		rowsAll, routesAll := decide(w, w.svcs, w.eps)
		svcs, eps := listed(t, w.svcs, w.eps, sliceLabels)
		rows, routes := decide(w, svcs, eps)
		if fmt.Sprint(routes) != fmt.Sprint(routesAll) {
			t.Fatalf("world %d: from the listed objects\n%s\nfrom all\n%s", seed, show(rows, routes), show(rowsAll, routesAll))
		}
		kept := map[string]bool{}
		for _, s := range svcs {
			kept[Key(s)] = true
		}
		var keptRows []Address
		for _, a := range rowsAll {
			if !kept[a.Service] {
				if a.State != StateNotAdvertised {
					t.Fatalf("world %d: %s is not listed but its address is %s", seed, a.Service, row(a))
				}
				continue
			}
			keptRows = append(keptRows, a)
		}
		if !reflect.DeepEqual(rows, keptRows) {
			t.Fatalf("world %d: rows from the listed objects\n%s\nfrom all\n%s", seed, show(rows, routes), show(keptRows, routesAll))
		}
	})
}

// The transforms keep every field the rule reads: from trimmed objects
// the node decides every row and route exactly as from whole ones.
func TestTrimKeepsWhatIsRead(t *testing.T) {
	randomWorlds(t, func(seed uint64) {
		w := randomWorld(seed)
		rows, routes := decide(w, w.svcs, w.eps)
		ts, te := trimmed(t, w.svcs, w.eps, nil, nil)
		trows, troutes := decide(w, ts, te)
		if !same(rows, routes, trows, troutes) {
			t.Fatalf("world %d: from trimmed objects\n%s\nfrom whole ones\n%s", seed, show(trows, troutes), show(rows, routes))
		}
	})
}

// The worlds the two tests above draw from tell a mistake: each field the
// transforms keep, dropped after them, changes the answer in one of the
// first worlds; so does a selector that also leaves out the slices
// labelled for another proxy (kube-proxy lists those: a slice can keep
// the label its Service lost).
func TestTrimAndSelectorTestsCatchMistakes(t *testing.T) {
	type mutant struct {
		name string
		svc  func(*corev1.Service)
		eps  func(*discoveryv1.EndpointSlice)
	}
	eachEp := func(f func(*discoveryv1.Endpoint)) func(*discoveryv1.EndpointSlice) {
		return func(s *discoveryv1.EndpointSlice) {
			for i := range s.Endpoints {
				f(&s.Endpoints[i])
			}
		}
	}
	eachPort := func(f func(*discoveryv1.EndpointPort)) func(*discoveryv1.EndpointSlice) {
		return func(s *discoveryv1.EndpointSlice) {
			for i := range s.Ports {
				f(&s.Ports[i])
			}
		}
	}
	eachSvcPort := func(f func(*corev1.ServicePort)) func(*corev1.Service) {
		return func(s *corev1.Service) {
			for i := range s.Spec.Ports {
				f(&s.Spec.Ports[i])
			}
		}
	}
	eachIngress := func(f func(*corev1.LoadBalancerIngress)) func(*corev1.Service) {
		return func(s *corev1.Service) {
			for i := range s.Status.LoadBalancer.Ingress {
				f(&s.Status.LoadBalancer.Ingress[i])
			}
		}
	}
	for _, m := range []mutant{
		{name: "service namespace", svc: func(s *corev1.Service) { s.Namespace = "" }},
		{name: "service name", svc: func(s *corev1.Service) { s.Name = "" }},
		{name: "service uid", svc: func(s *corev1.Service) { s.UID = "" }},
		{name: "service-proxy-name label", svc: func(s *corev1.Service) { delete(s.Labels, delivery.LabelServiceProxyName) }},
		{name: "type", svc: func(s *corev1.Service) { s.Spec.Type = "" }},
		{name: "clusterIP", svc: func(s *corev1.Service) { s.Spec.ClusterIP = "" }},
		{name: "externalIPs", svc: func(s *corev1.Service) { s.Spec.ExternalIPs = nil }},
		{name: "loadBalancerClass", svc: func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil }},
		{name: "externalTrafficPolicy", svc: func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = "" }},
		{name: "publishNotReadyAddresses", svc: func(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = false }},
		{name: "ipFamilies", svc: func(s *corev1.Service) { s.Spec.IPFamilies = nil }},
		{name: "port name", svc: eachSvcPort(func(p *corev1.ServicePort) { p.Name = "" })},
		{name: "port number", svc: eachSvcPort(func(p *corev1.ServicePort) { p.Port = 0 })},
		{name: "port protocol", svc: eachSvcPort(func(p *corev1.ServicePort) { p.Protocol = "" })},
		{name: "ingress ip", svc: eachIngress(func(in *corev1.LoadBalancerIngress) { in.IP = "" })},
		{name: "ingress ipMode", svc: eachIngress(func(in *corev1.LoadBalancerIngress) { in.IPMode = nil })},
		{name: "slice namespace", eps: func(s *discoveryv1.EndpointSlice) { s.Namespace = "" }},
		{name: "service-name label", eps: func(s *discoveryv1.EndpointSlice) { delete(s.Labels, discoveryv1.LabelServiceName) }},
		{name: "managed-by label", eps: func(s *discoveryv1.EndpointSlice) { delete(s.Labels, discoveryv1.LabelManagedBy) }},
		{name: "headless label", eps: func(s *discoveryv1.EndpointSlice) { delete(s.Labels, delivery.LabelHeadless) }},
		{name: "addressType", eps: func(s *discoveryv1.EndpointSlice) { s.AddressType = "" }},
		{name: "slice port name", eps: eachPort(func(p *discoveryv1.EndpointPort) { p.Name = nil })},
		{name: "slice port number", eps: eachPort(func(p *discoveryv1.EndpointPort) { p.Port = nil })},
		{name: "slice port protocol", eps: eachPort(func(p *discoveryv1.EndpointPort) { p.Protocol = nil })},
		{name: "endpoint address", eps: eachEp(func(e *discoveryv1.Endpoint) { e.Addresses = nil })},
		{name: "ready", eps: eachEp(func(e *discoveryv1.Endpoint) { e.Conditions.Ready = nil })},
		{name: "serving", eps: eachEp(func(e *discoveryv1.Endpoint) { e.Conditions.Serving = nil })},
		{name: "terminating", eps: eachEp(func(e *discoveryv1.Endpoint) { e.Conditions.Terminating = nil })},
		{name: "nodeName", eps: eachEp(func(e *discoveryv1.Endpoint) { e.NodeName = nil })},
	} {
		t.Run("drop "+m.name, func(t *testing.T) {
			for seed := range uint64(worlds) {
				w := randomWorld(seed)
				rows, routes := decide(w, w.svcs, w.eps)
				ts, te := trimmed(t, w.svcs, w.eps, m.svc, m.eps)
				if trows, troutes := decide(w, ts, te); !same(rows, routes, trows, troutes) {
					return
				}
			}
			t.Errorf("no world of %d tells the difference: TestTrimKeepsWhatIsRead would miss it", worlds)
		})
	}
	t.Run("slices of another proxy left out", func(t *testing.T) {
		sel := strings.Join([]string{sliceLabels, "!" + delivery.LabelServiceProxyName}, ",")
		for seed := range uint64(worlds) {
			w := randomWorld(seed)
			_, routesAll := decide(w, w.svcs, w.eps)
			svcs, eps := listed(t, w.svcs, w.eps, sel)
			if _, routes := decide(w, svcs, eps); fmt.Sprint(routes) != fmt.Sprint(routesAll) {
				return
			}
		}
		t.Errorf("no world of %d tells the difference: TestSelectorsChangeNoRoute would miss it", worlds)
	})
}
