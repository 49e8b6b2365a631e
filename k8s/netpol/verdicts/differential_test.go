package verdicts

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// seed is FLOCK_SEED, or fixed so `make test` is reproducible.
func seed(t *testing.T) uint64 {
	if s := os.Getenv("FLOCK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FLOCK_SEED=%q: %v", s, err)
		}
		return n
	}
	return 1
}

// world is a random cluster: what both the engine and the compiler read.
type world struct {
	in Input
	// whole, if set, are the pods the engine reads (in.Pods were made of
	// them); else it reads in.Pods as corev1.Pods (trim.Pod.Core), as
	// flock-policy's engine reads its cache.
	whole   []*corev1.Pod
	extra   map[string][]string // pod key → extra IPs
	holders map[string][]string // extra IP → pod keys
	addrs   []netip.Addr        // packet ends worth trying
}

// enginePods are the pods the engine reads of w.
func (w *world) enginePods() []*corev1.Pod {
	if w.whole != nil {
		return w.whole
	}
	out := make([]*corev1.Pod, len(w.in.Pods))
	for i, p := range w.in.Pods {
		out[i] = p.Core()
	}
	return out
}

// engineExtraPodIPs is w's ExtraPodIPs in the engine's form
// (Config.ExtraPodIPs takes a corev1.Pod); nil for none.
func (w *world) engineExtraPodIPs() func(*corev1.Pod) []string {
	f := w.in.ExtraPodIPs
	if f == nil {
		return nil
	}
	return func(p *corev1.Pod) []string { return f(asPod(p)) }
}

// asPod is p as a trim.Pod field for field, nothing dropped, shared or
// interned (trim.NewPod, what the caches hold, does all three): the
// worlds' odd names and maps stay as built, and nothing of p that a
// trim.Pod can hold is lost.
func asPod(p *corev1.Pod) *trim.Pod {
	return &trim.Pod{ObjectMeta: p.ObjectMeta,
		Spec:   trim.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork, Containers: p.Spec.Containers},
		Status: trim.PodStatus{Phase: p.Status.Phase, PodIPs: p.Status.PodIPs}}
}

const localNode = "node-a"

var (
	protoTCP, protoUDP, protoSCTP = corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
	labelKeys                     = []string{"app", "role", "tier"}
	labelVals                     = []string{"x", "y", "z"}
	portNames                     = []string{"http", "dns", "metrics"}
)

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

func randLabels(r *rand.Rand) map[string]string {
	l := map[string]string{}
	for _, k := range labelKeys {
		if r.IntN(3) > 0 {
			l[k] = pick(r, labelVals)
		}
	}
	return l
}

func randSelector(r *rand.Rand) *metav1.LabelSelector {
	switch r.IntN(6) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: pick(r, labelKeys), Operator: metav1.LabelSelectorOpIn, Values: []string{pick(r, labelVals), pick(r, labelVals)}}}}
	case 2:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: pick(r, labelKeys), Operator: metav1.LabelSelectorOpDoesNotExist}}}
	case 3:
		switch r.IntN(4) { // does not parse: the engine's quirks decide
		case 0:
			return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: pick(r, labelKeys), Operator: "Bogus"}}}
		case 1:
			// An invalid value (objects stored before the API server
			// checked selector values still hold them), which a careless
			// print of case 1's two values looks like.
			return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: pick(r, labelKeys), Operator: metav1.LabelSelectorOpIn, Values: []string{pick(r, labelVals) + " " + pick(r, labelVals)}}}}
		}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{pick(r, labelKeys): pick(r, labelVals)}}
}

func newWorld(r *rand.Rand) *world {
	w := &world{extra: map[string][]string{}, holders: map[string][]string{}}
	w.in.Node = localNode
	nsNames := []string{"ns0", "ns1", "ns2", "ghost"} // ghost has pods but no Namespace
	for _, n := range nsNames[:3] {
		w.in.Namespaces = append(w.in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: randLabels(r)}})
	}
	seen := map[netip.Addr]bool{}
	addAddr := func(a netip.Addr) {
		if !seen[a] {
			seen[a] = true
			w.addrs = append(w.addrs, a)
		}
	}
	nodeIPs := map[string][]string{"node-a": {"fd00:0:1::1", "192.0.2.1"}, "node-b": {"fd00:0:2::1", "192.0.2.2"}}
	var anycast []string
	for i := range 1 + r.IntN(3) {
		anycast = append(anycast, fmt.Sprintf("2001:db8:a::%x", i+1))
	}
	npods := 8 + r.IntN(14)
	// Names as the cache holds them: most in one copy a name (trim.NewPod),
	// some in copies of their own, and one that starts where another
	// name is ("ghost" inside "ghostly": the compiler tells namespaces by
	// where their names are, and how long).
	ghostly := strings.Clone("ghostly")
	for i := range npods {
		p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pick(r, nsNames), Name: fmt.Sprintf("pod%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i)), Labels: randLabels(r)}}
		switch r.IntN(10) {
		case 0:
			p.Namespace = strings.Clone(p.Namespace)
		case 1:
			p.Namespace = ghostly[:len(pick(r, []string{"ghost", "ghostly"}))]
		}
		if i > 0 && r.IntN(3) == 0 {
			// The replicas of a workload share one labels map (trim.NewPod),
			// in their namespace or, as here too, in another.
			p.Labels = w.in.Pods[r.IntN(len(w.in.Pods))].Labels
		}
		p.Spec.NodeName = pick(r, []string{"node-a", "node-b"})
		p.Status.Phase = corev1.PodRunning
		var ctr corev1.Container
		for range r.IntN(3) {
			proto := pick(r, []corev1.Protocol{protoTCP, protoTCP, protoUDP, protoSCTP})
			ctr.Ports = append(ctr.Ports, corev1.ContainerPort{Name: pick(r, portNames), ContainerPort: int32(pick(r, []int{53, 80, 8080, 9090, 1000 + r.IntN(50)})), Protocol: proto})
		}
		p.Spec.Containers = []corev1.Container{ctr}
		switch {
		case r.IntN(8) == 0:
			p.Spec.HostNetwork = true
			for _, ip := range nodeIPs[p.Spec.NodeName] {
				p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
			}
		default:
			p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:10:%d::%x", i%2, i+1)}}
			if r.IntN(10) == 0 {
				// Written otherwise than a packet's address prints: the
				// engine's index never finds the pod by it.
				p.Status.PodIPs[0].IP = strings.ToUpper(p.Status.PodIPs[0].IP)
			}
			if r.IntN(2) == 0 {
				p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("198.51.100.%d", i+1)})
			}
		}
		k := key(p)
		// A hostNetwork pod named an anycast IP's holder too (the
		// engine's index leaves it out).
		if (!p.Spec.HostNetwork && r.IntN(3) == 0) || (p.Spec.HostNetwork && r.IntN(2) == 0) {
			ip := pick(r, anycast)
			w.extra[k] = append(w.extra[k], ip)
			w.holders[ip] = append(w.holders[ip], k)
		}
		if !p.Spec.HostNetwork && r.IntN(5) == 0 {
			ip := fmt.Sprintf("2001:db8:c::%x", i+1)
			w.extra[k] = append(w.extra[k], ip)
			w.holders[ip] = append(w.holders[ip], k)
		}
		w.in.Pods = append(w.in.Pods, p)
		for _, ip := range p.Status.PodIPs {
			addAddr(netip.MustParseAddr(ip.IP))
		}
		for _, ip := range w.extra[k] {
			addAddr(netip.MustParseAddr(ip))
		}
	}
	// A finished pod whose IP a running one reuses.
	if r.IntN(2) == 0 {
		old := w.in.Pods[r.IntN(len(w.in.Pods))]
		if !old.Spec.HostNetwork {
			done := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns0", Name: "0done", UID: "uid-done", Labels: randLabels(r)}}
			done.Spec.NodeName = localNode
			done.Status.Phase = corev1.PodSucceeded
			done.Status.PodIPs = old.Status.PodIPs
			w.in.Pods = append(w.in.Pods, done)
		}
	}
	for _, s := range []string{"2001:db8:ff::1", "2001:db8:ff::8000", "203.0.113.5", "203.0.113.200", "fd00:10:0::ffff", "192.0.2.1", "fd00:0:1::1", "fd00:0:2::1"} {
		addAddr(netip.MustParseAddr(s))
	}
	for i := range 2 + r.IntN(8) {
		w.in.Policies = append(w.in.Policies, randPolicy(r, i, nsNames))
	}
	w.in.ExtraPodIPs = func(p *trim.Pod) []string { return w.extra[key(p)] }
	w.in.PodsForIP = func(ip string) []string { return w.holders[ip] }
	return w
}

func randPorts(r *rand.Rand) []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for range r.IntN(3) {
		pp := networkingv1.NetworkPolicyPort{Protocol: pick(r, []*corev1.Protocol{&protoTCP, &protoTCP, &protoUDP, &protoSCTP})}
		switch r.IntN(5) {
		case 0:
		case 1, 2:
			v := intstr.FromString(pick(r, portNames))
			pp.Port = &v
		default:
			v := intstr.FromInt32(int32(pick(r, []int{53, 80, 1000, 8080, 9090})))
			pp.Port = &v
			if r.IntN(3) == 0 {
				e := v.IntVal + int32(r.IntN(100))
				pp.EndPort = &e
			}
		}
		out = append(out, pp)
	}
	return out
}

func randPeers(r *rand.Rand) []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for range r.IntN(3) {
		var p networkingv1.NetworkPolicyPeer
		switch r.IntN(4) {
		case 0:
			b := &networkingv1.IPBlock{CIDR: pick(r, []string{"fd00:10::/32", "2001:db8::/32", "198.51.100.0/24", "0.0.0.0/0", "::/0", "fd00:10:1::/64", "203.0.113.0/25", "::ffff:0:0/96"})}
			for range r.IntN(3) {
				b.Except = append(b.Except, pick(r, []string{"fd00:10:1::/64", "fd00:10:0::8/125", "198.51.100.0/28", "2001:db8:a::/126", "203.0.113.0/26", "bogus"}))
			}
			p.IPBlock = b
		case 1:
			p.PodSelector = randSelector(r)
		case 2:
			p.NamespaceSelector = randSelector(r)
		default:
			p.PodSelector, p.NamespaceSelector = randSelector(r), randSelector(r)
		}
		out = append(out, p)
	}
	return out
}

func randPolicy(r *rand.Rand, i int, nsNames []string) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: pick(r, nsNames), Name: fmt.Sprintf("np%d", i), UID: types.UID(fmt.Sprintf("np-uid-%d", i))}}
	np.Spec.PodSelector = *randSelector(r)
	np.Spec.PolicyTypes = pick(r, [][]networkingv1.PolicyType{{networkingv1.PolicyTypeIngress}, {networkingv1.PolicyTypeEgress}, {networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}})
	if r.IntN(5) > 0 {
		for range 1 + r.IntN(3) {
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{Ports: randPorts(r), From: randPeers(r)})
		}
	}
	if r.IntN(5) > 0 {
		for range 1 + r.IntN(3) {
			np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{Ports: randPorts(r), To: randPeers(r)})
		}
	}
	return np
}

// engine builds kube-network-policies' controller over w's objects.
func engine(t *testing.T, w *world) *networkpolicy.Controller {
	t.Helper()
	client := fake.NewSimpleClientset()
	f := informers.NewSharedInformerFactory(client, 0)
	pods, nss, nps := f.Core().V1().Pods(), f.Core().V1().Namespaces(), f.Networking().V1().NetworkPolicies()
	ctrl, err := networkpolicy.NewController(client, nps, nss, pods, f.Core().V1().Nodes(), nil, nil, nil, networkpolicy.Config{
		NodeName: w.in.Node, NRIdisabled: true,
		ExtraPodIPs: w.engineExtraPodIPs(), PodsForIP: w.in.PodsForIP,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range w.enginePods() {
		if err := pods.Informer().GetIndexer().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range w.in.Namespaces {
		if err := nss.Informer().GetIndexer().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, np := range w.in.Policies {
		if err := nps.Informer().GetIndexer().Add(np); err != nil {
			t.Fatal(err)
		}
	}
	return ctrl
}

var protoNames = map[uint8]corev1.Protocol{unix.IPPROTO_TCP: corev1.ProtocolTCP, unix.IPPROTO_UDP: corev1.ProtocolUDP, unix.IPPROTO_SCTP: corev1.ProtocolSCTP}

func randPacket(r *rand.Rand, w *world) Packet {
	for {
		k := Packet{Src: pick(r, w.addrs), Dst: pick(r, w.addrs)}
		if k.Src.Is4() != k.Dst.Is4() || k.Src == k.Dst {
			continue
		}
		k.Proto = pick(r, []uint8{unix.IPPROTO_TCP, unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_ICMPV6})
		if k.Src.Is4() && k.Proto == unix.IPPROTO_ICMPV6 {
			k.Proto = unix.IPPROTO_ICMP
		}
		if _, ok := protoNames[k.Proto]; ok {
			k.SrcPort = uint16(30000 + r.IntN(1000))
			k.DstPort = uint16(pick(r, []int{0, 53, 80, 81, 1000, 1001, 1049, 1099, 8080, 8081, 9090, 1000 + r.IntN(200), r.IntN(65536)}))
		}
		return k
	}
}

// judged is what the engine queues: from or to one of its podips.
func judged(t *testing.T, ctrl *networkpolicy.Controller) map[netip.Addr]bool {
	ips, err := ctrl.JudgedIPs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]bool{}
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			out[a] = true
		}
	}
	return out
}

// TestDifferential: for random clusters and packets, the compiled
// program's verdict is the engine's, for every packet the engine judges
// (and it judges the same packets).
func TestDifferential(t *testing.T) {
	s := seed(t)
	worlds, packets := scaled(t, 300), 400
	if testing.Short() {
		worlds = 50
	}
	t.Logf("FLOCK_SEED=%d", s)
	r := rand.New(rand.NewPCG(s, 0x6e70))
	verdicts := map[bool]int{}
	for wi := range worlds {
		w := newWorld(r)
		ctrl := engine(t, w)
		prog := Compile(w.in)
		want := judged(t, ctrl)
		for a := range want {
			if !prog.Selected[a] {
				t.Fatalf("world %d: the engine judges %s, the program does not", wi, a)
			}
		}
		for a := range prog.Selected {
			if !want[a] {
				t.Fatalf("world %d: the program judges %s, the engine does not", wi, a)
			}
		}
		for range packets {
			k := randPacket(r, w)
			if !want[k.Src] && !want[k.Dst] {
				continue
			}
			got := prog.Allows(k)
			exp := ctrl.EvaluatePacket(context.Background(), net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), protoNames[k.Proto], int(k.SrcPort), int(k.DstPort))
			verdicts[exp]++
			if got != exp {
				t.Fatalf("world %d (FLOCK_SEED=%d): packet %s → %s proto %d port %d: program %v, engine %v\n%s", wi, s, k.Src, k.Dst, k.Proto, k.DstPort, got, exp, describe(w))
			}
		}
	}
	t.Logf("judged packets: %d allowed, %d dropped", verdicts[true], verdicts[false])
	// A corpus that never drops, or never allows, tests little.
	if verdicts[true] < worlds || verdicts[false] < worlds {
		t.Errorf("judged packets: %d allowed, %d dropped; want at least %d of each", verdicts[true], verdicts[false], worlds)
	}
}

func describe(w *world) string {
	out := ""
	for _, p := range w.in.Pods {
		var ports []corev1.ContainerPort
		for _, c := range p.Spec.Containers {
			ports = append(ports, c.Ports...)
		}
		out += fmt.Sprintf("pod %s node=%s hostNet=%v phase=%s labels=%v ips=%v extra=%v ports=%v\n", key(p), p.Spec.NodeName, p.Spec.HostNetwork, p.Status.Phase, p.Labels, p.Status.PodIPs, w.extra[key(p)], ports)
	}
	for _, n := range w.in.Namespaces {
		out += fmt.Sprintf("namespace %s labels=%v\n", n.Name, n.Labels)
	}
	for _, np := range w.in.Policies {
		out += fmt.Sprintf("policy %s/%s types=%v select=%v ingress=%+v egress=%+v\n", np.Namespace, np.Name, np.Spec.PolicyTypes, np.Spec.PodSelector.String(), np.Spec.Ingress, np.Spec.Egress)
	}
	return out
}
