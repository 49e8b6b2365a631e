package verdicts

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// reviewLoadBigSend is reviewLoad with the send buffer raised as well, to
// look past the sendmsg limit at what the kernel says.
func reviewLoadBigSend(t *testing.T, l *probe.Lab, p *Program) error {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(int(l.NS)), nftables.WithSockOptions(func(c *netlink.Conn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		return raw.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 64<<20)
		})
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := Load(conn, "flock-verdicts-test", Hook{Num: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter}, p); err != nil {
		return err
	}
	return conn.Flush()
}

// TestReviewAnycastChainName: an anycast address held by the n pods of a
// DaemonSet (one per node), isolated for ingress by a policy that allows
// a named port. Each holder gets an ingress group of its own (the group
// key holds the pod, compile.go group), and the chain that ANDs them
// (nft.go all) is named "all-" and every group number: over 255 bytes,
// which the kernel refuses (ERANGE), so no program loads. The send
// buffer is raised here to get past TestReviewManyGroupsLoad's limit.
func TestReviewAnycastChainName(t *testing.T) {
	l := probe.New(t)
	tcp := corev1.ProtocolTCP
	const anycast = "2001:db8:a::53"
	n := 90
	in := Input{Node: localNode}
	in.Namespaces = []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "dns"}}}
	client := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "dns", Name: "client", Labels: map[string]string{"role": "client"}}}
	client.Spec.NodeName = localNode
	client.Status.Phase = corev1.PodRunning
	client.Status.PodIPs = []corev1.PodIP{{IP: "fd00:20::1"}}
	in.Pods = append(in.Pods, client)
	holders := map[string][]string{}
	extra := map[string][]string{}
	for i := range n {
		p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "dns", Name: fmt.Sprintf("ds-%d", i), Labels: map[string]string{"role": "server"}}}
		p.Spec.NodeName = fmt.Sprintf("node-%d", i)
		p.Spec.Containers = []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "dns-tcp", ContainerPort: 53, Protocol: tcp}}}}
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:30:%x::1", i)}}
		in.Pods = append(in.Pods, p)
		holders[anycast] = append(holders[anycast], key(p))
		extra[key(p)] = []string{anycast}
	}
	in.ExtraPodIPs = func(p *trim.Pod) []string { return extra[key(p)] }
	in.PodsForIP = func(ip string) []string { return holders[ip] }
	port := intstr.FromString("dns-tcp")
	in.Policies = []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "dns", Name: "servers", UID: "np1"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "dns", Name: "client", UID: "np2"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}, Egress: []networkingv1.NetworkPolicyEgressRule{{}}}},
	}
	prog := Compile(in)
	t.Logf("%d holders: %d ingress groups for %s", n, len(prog.Ingress[netip.MustParseAddr(anycast)]), anycast)
	if err := reviewLoadBigSend(t, l, prog); err != nil {
		t.Fatalf("anycast held by %d pods under a named-port ingress policy: the program does not load: %v", n, err)
	}
}
