package verdicts

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// benchInput is make bench's NetworkPolicy cluster: 100 policies select
// one server, 1,000 more pods in other namespaces.
func benchInput() Input {
	in := Input{Node: "node"}
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(8080)
	in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench", Labels: map[string]string{"bench": "netpol"}}})
	for i := range 1005 {
		ns := "bench"
		if i >= 5 {
			ns = fmt.Sprintf("fill%d", i%20)
		}
		p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", i), Labels: map[string]string{"app": fmt.Sprintf("a%d", i%20), "peer": fmt.Sprintf("p%03d", i%100)}}}
		p.Spec.NodeName = "node"
		if i%10 != 0 {
			p.Spec.NodeName = "other"
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:10::%x", i+1)}}
		in.Pods = append(in.Pods, p)
	}
	in.Pods[0].Labels = map[string]string{"app": "server"}
	for i := range 100 {
		in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("np%d", i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{
					{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": "netpol"}}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"peer": fmt.Sprintf("p%03d", i)}}}},
						Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}},
					{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}},
				}}})
	}
	return in
}

func BenchmarkCompile(b *testing.B) {
	in := benchInput()
	for b.Loop() {
		Compile(in)
	}
}

// largeInput is a cluster shaped like make scale's at a third of the
// envelope: 50,000 dual-stack pods in 250 namespaces on 1,700 nodes (30 on
// this one), 340 policies, each selecting a workload of its namespace
// and admitting another by label from namespaces of a team, and anycast
// addresses that 1 % of the pods hold.
func largeInput() Input {
	in := Input{Node: "node-0"}
	const pods, namespaces, policies, nodes = 50000, 250, 340, 1700
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(8080)
	for n := range namespaces {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", n), Labels: map[string]string{"team": fmt.Sprintf("t%d", n%10)}}})
	}
	for i := range pods {
		p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%namespaces), Name: fmt.Sprintf("w%d-%d", i%40, i),
			Labels: map[string]string{"app": fmt.Sprintf("w%d", i%40), "tier": fmt.Sprintf("t%d", i%3)}}}
		p.Spec.NodeName = fmt.Sprintf("node-%d", i%nodes)
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:10:%x::%x", i/65536, i%65536+1)}, {IP: fmt.Sprintf("10.%d.%d.%d", i/65536, (i/256)%256, i%256)}}
		in.Pods = append(in.Pods, p)
	}
	// Anycast addresses, each held by a workload's pods (1 %).
	extra, holders := map[string][]string{}, map[string][]string{}
	for i := 0; i < pods; i += 100 {
		p := in.Pods[i]
		ip := fmt.Sprintf("2001:db8:a::%x", i%4000+1)
		extra[key(p)] = append(extra[key(p)], ip)
		holders[ip] = append(holders[ip], key(p))
	}
	in.ExtraPodIPs = func(p *trim.Pod) []string { return extra[key(p)] }
	in.PodsForIP = func(ip string) []string { return holders[ip] }
	for i := range policies {
		in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%namespaces), Name: fmt.Sprintf("np%d", i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("w%d", i%40)}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", i%10)}},
						PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("w%d", (i+1)%40)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}},
			}})
	}
	return in
}

func BenchmarkCompileLarge(b *testing.B) {
	in := largeInput()
	b.ReportAllocs()
	for b.Loop() {
		CompileDeps(in)
	}
}
