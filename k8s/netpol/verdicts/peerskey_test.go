package verdicts

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// Rules with the same peers share one set: two peer lists whose String()
// coincide but whose meaning differs must not. role In ["x y"] does not
// parse (an invalid label value, which the API server still holds in
// objects stored before it validated selector values): the engine matches
// every pod. role In ["x","y"] parses. (Found by review: keyed by
// String(), port 443 from role=z passed b-strict.)
func TestPeersKeyUnambiguous(t *testing.T) {
	pod := func(name, ip string, l map[string]string) *trim.Pod {
		p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns0", Name: name, Labels: l}}
		p.Spec.NodeName = localNode
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		return p
	}
	server := pod("server", "fd00:10::1", map[string]string{"app": "server"})
	other := pod("other", "fd00:10::2", map[string]string{"role": "z"})
	port := func(n int32) []networkingv1.NetworkPolicyPort {
		v := intstr.FromInt32(n)
		return []networkingv1.NetworkPolicyPort{{Protocol: &protoTCP, Port: &v}}
	}
	peer := func(vals ...string) []networkingv1.NetworkPolicyPeer {
		return []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "role", Operator: metav1.LabelSelectorOpIn, Values: vals}}}}}
	}
	np := func(name string, p int32, from []networkingv1.NetworkPolicyPeer) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns0", Name: name},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: port(p), From: from}}}}
	}
	legacy, strict := np("a-legacy", 80, peer("x y")), np("b-strict", 443, peer("x", "y"))

	w := &world{in: Input{Node: localNode, Pods: []*trim.Pod{server, other},
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "ns0"}}},
		Policies:   []*networkingv1.NetworkPolicy{legacy, strict}}}
	ctrl := engine(t, w)
	prog := Compile(w.in)
	for _, dport := range []uint16{80, 443} {
		k := Packet{Src: netip.MustParseAddr("fd00:10::2"), Dst: netip.MustParseAddr("fd00:10::1"), Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: dport}
		got := prog.Allows(k)
		exp := ctrl.EvaluatePacket(context.Background(), net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), corev1.ProtocolTCP, int(k.SrcPort), int(k.DstPort))
		if got != exp {
			t.Errorf("other(role=z) → server tcp/%d: program %v, engine %v", dport, got, exp)
		}
	}
}
