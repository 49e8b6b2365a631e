package verdicts

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// reviewTypical is a cluster of n dual-stack pods in 20 namespaces on 50
// nodes, each namespace with the textbook policies: default deny
// ingress, allow ingress from the same namespace on TCP 8080, and allow
// egress to DNS in kube-system.
func reviewTypical(n int) Input {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	in := Input{Node: localNode}
	in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", Labels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}}})
	p8080, p53 := intstr.FromInt32(8080), intstr.FromInt32(53)
	for ns := range 20 {
		name := fmt.Sprintf("ns%d", ns)
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
		in.Policies = append(in.Policies,
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "default-deny"},
				Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "same-ns"},
				Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p8080}},
						From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}}}},
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "dns"},
				Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
					Egress: []networkingv1.NetworkPolicyEgressRule{
						{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &p53}, {Protocol: &tcp, Port: &p53}},
							To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}}}}},
						{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p8080}}, To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}},
					}}})
	}
	for i := range n {
		p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%20), Name: fmt.Sprintf("p%d", i)}}
		node := i % 50
		p.Spec.NodeName = fmt.Sprintf("node-%d", node)
		if node == 0 {
			p.Spec.NodeName = localNode
		}
		p.Status.Phase = corev1.PodRunning
		j := i / 50
		p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", 64+node, j/128, 2*(j%128)+1)}, {IP: fmt.Sprintf("fd00:%x::%x", node+1, 2*j+1)}}
		in.Pods = append(in.Pods, p)
	}
	return in
}

func TestReviewTypicalClusterThreshold(t *testing.T) {
	l := probe.New(t)
	for _, n := range []int{250, 500, 750, 1000, 1250, 1500, 2000, 3000} {
		prog := Compile(reviewTypical(n))
		err := reviewLoad(t, l, prog)
		if err != nil {
			t.Errorf("n=%d pods (%d groups): %v", n, len(prog.Groups), err)
			continue
		}
		t.Logf("n=%d: loaded, ingress4 %d/%d", n, reviewElems(t, l, "ingress4"), n)
	}
}

// TestReviewTypicalClusterBigSend: the same clusters with the send
// buffer raised: what fails next, and whether what loads is whole.
func TestReviewTypicalClusterBigSend(t *testing.T) {
	l := probe.New(t)
	for _, n := range []int{300, 350, 400, 450, 1000, 1500, 2000, 3000, 4000} {
		prog := Compile(reviewTypical(n))
		if err := reviewLoadBigSend(t, l, prog); err != nil {
			t.Errorf("n=%d pods (send buffer raised): %v", n, err)
			continue
		}
		if got := reviewElems(t, l, "ingress4"); got != n {
			t.Errorf("n=%d: loaded, but ingress4 holds %d of %d addresses", n, got, n)
		}
	}
}
