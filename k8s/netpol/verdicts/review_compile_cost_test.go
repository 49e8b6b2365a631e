package verdicts

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// TestReviewCompileCost: the time one Compile takes (it runs after every
// change of any pod in the cluster) for n pods isolated for ingress by a
// named-port policy with a namespaceSelector peer, in 20 namespaces.
func TestReviewCompileCost(t *testing.T) {
	tcp := corev1.ProtocolTCP
	for _, n := range []int{500, 1000, 2000, 4000} {
		in := Input{Node: localNode}
		for ns := range 20 {
			in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", ns), Labels: map[string]string{"team": "a"}}})
			http := intstr.FromString("http")
			in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", ns), Name: "web"},
				Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &http}},
						From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}}}}}})
		}
		for i := range n {
			p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%20), Name: fmt.Sprintf("p%d", i)}}
			p.Spec.NodeName = fmt.Sprintf("node-%d", i%50)
			p.Spec.Containers = []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: tcp}}}}
			p.Status.Phase = corev1.PodRunning
			p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", i/65536, (i/256)%256, i%256)}, {IP: fmt.Sprintf("fd00::%x", i+1)}}
			in.Pods = append(in.Pods, p)
		}
		start := time.Now()
		prog := Compile(in)
		t.Logf("n=%d pods: Compile took %s, %d groups", n, time.Since(start).Round(time.Millisecond), len(prog.Groups))
	}
}
