package verdicts

import (
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// TestReviewManyGroupsLoad: n pods (on other nodes) isolated for ingress
// by one policy that allows a named port: every pod gets a group of its
// own (the ingress group key holds the pod), so the transaction grows
// with the cluster. The map stays far below 64 KiB; the program must load.
func TestReviewManyGroupsLoad(t *testing.T) {
	l := probe.New(t)
	tcp := corev1.ProtocolTCP
	for _, n := range []int{100, 300, 600} {
		in := Input{Node: localNode}
		in.Namespaces = []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "web"}}}
		local := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "local", Labels: map[string]string{"role": "client"}}}
		local.Spec.NodeName = localNode
		local.Status.PodIPs = []corev1.PodIP{{IP: "10.20.0.1"}}
		in.Pods = append(in.Pods, local)
		for i := range n {
			p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: fmt.Sprintf("srv%d", i), Labels: map[string]string{"role": "server"}}}
			p.Spec.NodeName = "node-b"
			p.Spec.Containers = []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: tcp}}}}
			p.Status.Phase = corev1.PodRunning
			p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.1", 30+i/250, i%250)}}
			in.Pods = append(in.Pods, p)
		}
		http := intstr.FromString("http")
		in.Policies = []*networkingv1.NetworkPolicy{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "servers", UID: "np1"},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "server"}},
					PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &http}},
						From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}}}}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "client", UID: "np2"},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
					PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, Ingress: []networkingv1.NetworkPolicyIngressRule{{}}}},
		}
		prog := Compile(in)
		if err := reviewLoad(t, l, prog); err != nil {
			t.Errorf("n=%d pods isolated by one named-port ingress policy (%d groups): the program does not load: %v", n, len(prog.Groups), err)
			continue
		}
		k := Packet{Src: netip.MustParseAddr("10.20.0.1"), Dst: netip.MustParseAddr("10.30.0.1"), Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: 8080}
		if !l.Allows(t, probe.Packet(k)) || !prog.Allows(k) {
			t.Errorf("n=%d: allowed packet dropped", n)
		}
		t.Logf("n=%d: %d groups loaded", n, len(prog.Groups))
	}
}
