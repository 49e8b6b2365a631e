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

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// TestReviewIntervalBorders: ipBlock ranges that start at the first or
// end at the last address of a family, probed at their borders, through
// the kernel, against the engine.
func TestReviewIntervalBorders(t *testing.T) {
	l := probe.New(t)
	cases := []struct {
		cidr   string
		except []string
		srcs   []string
	}{
		{"0.0.0.0/0", []string{"0.0.0.0/8"}, []string{"0.0.0.0", "0.255.255.255", "1.0.0.0", "255.255.255.254", "255.255.255.255"}},
		{"128.0.0.0/1", []string{"255.255.255.255/32"}, []string{"127.255.255.255", "128.0.0.0", "255.255.255.254", "255.255.255.255"}},
		{"0.0.0.0/1", []string{"0.0.0.0/32"}, []string{"0.0.0.0", "0.0.0.1", "127.255.255.255", "128.0.0.0"}},
		{"::/0", []string{"::/8"}, []string{"::1", "ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "100::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
		{"8000::/1", []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"}, []string{"7fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "8000::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	}
	for _, c := range cases {
		w := &world{}
		w.in.Node = localNode
		w.in.Namespaces = []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}}
		pod := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "srv"}}
		pod.Spec.NodeName = localNode
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIPs = []corev1.PodIP{{IP: "198.51.100.1"}, {IP: "fd00:10::1"}}
		w.in.Pods = []*trim.Pod{pod}
		w.in.Policies = []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "np", UID: "u"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: c.cidr, Except: c.except}}}}}}}}
		ctrl := engine(t, w)
		prog := Compile(w.in)
		if err := reviewLoad(t, l, prog); err != nil {
			t.Fatalf("%s: %v", c.cidr, err)
		}
		for _, s := range c.srcs {
			src := netip.MustParseAddr(s)
			dst := netip.MustParseAddr("198.51.100.1")
			if src.Is6() {
				dst = netip.MustParseAddr("fd00:10::1")
			}
			k := Packet{Src: src, Dst: dst, Proto: unix.IPPROTO_UDP, SrcPort: 1000, DstPort: 2000}
			exp := ctrl.EvaluatePacket(context.Background(), net.IP(src.AsSlice()), net.IP(dst.AsSlice()), corev1.ProtocolUDP, 1000, 2000)
			if got := prog.Allows(k); got != exp {
				t.Errorf("%s except %v from %s: program %v, engine %v", c.cidr, c.except, s, got, exp)
			}
			if got := l.Allows(t, probe.Packet(k)); got != exp {
				t.Errorf("%s except %v from %s: kernel %v, engine %v", c.cidr, c.except, s, got, exp)
			}
		}
	}
}
