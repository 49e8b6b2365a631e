package verdicts

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// reviewLoad renders p into the lab's namespace at the output hook and
// returns Flush's error.
func reviewLoad(t *testing.T, l *probe.Lab, p *Program) error {
	t.Helper()
	conn, err := NewConn(int(l.NS))
	if err != nil {
		t.Fatal(err)
	}
	if err := Load(conn, "flock-verdicts-test", Hook{Num: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter}, p); err != nil {
		return err
	}
	return conn.Flush()
}

func reviewElems(t *testing.T, l *probe.Lab, set string) int {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(l.NS)))
	if err != nil {
		t.Fatal(err)
	}
	cur, err := Current(c, "flock-verdicts-test")
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.GetSetByName(&nftables.Table{Name: "flock-verdicts-test", Family: nftables.TableFamilyINet}, set+"-v"+strconv.FormatUint(cur.Gen, 10))
	if err != nil {
		t.Fatalf("set %s: %v", set, err)
	}
	e, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	return len(e)
}

// A cluster of n IPv6 pods on other nodes, every one isolated for
// ingress (deny all), and one pod on this node that some policy selects:
// a packet from the local pod to any remote pod must be dropped (the
// engine evaluates the destination pod's ingress wherever it runs).
func reviewBigCluster(n int, v4 bool) (Input, []netip.Addr) {
	in := Input{Node: localNode}
	in.Namespaces = []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "big"}}}
	var remote []netip.Addr
	local := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "big", Name: "local", Labels: map[string]string{"role": "client"}}}
	local.Spec.NodeName = localNode
	local.Status.Phase = corev1.PodRunning
	local.Status.PodIPs = []corev1.PodIP{{IP: "fd00:20::1"}}
	if v4 {
		local.Status.PodIPs = []corev1.PodIP{{IP: "10.20.0.1"}}
	}
	in.Pods = append(in.Pods, local)
	for i := range n {
		// Addresses not adjacent, as pods of many nodes are.
		a := netip.MustParseAddr(fmt.Sprintf("fd00:30:%x::%x", i, 1))
		if v4 {
			a = netip.MustParseAddr(fmt.Sprintf("10.%d.%d.1", 30+i/250, i%250))
		}
		p := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "big", Name: fmt.Sprintf("srv%d", i), Labels: map[string]string{"role": "server"}}}
		p.Spec.NodeName = "node-b"
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: a.String()}}
		in.Pods = append(in.Pods, p)
		remote = append(remote, a)
	}
	in.Policies = []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "big", Name: "servers-deny-ingress", UID: "u1"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "server"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "big", Name: "client-selected", UID: "u2"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{}}}},
	}
	return in, remote
}

// TestReviewLargeMapTruncated: with a few thousand isolated pods in the
// cluster the ingress6 verdict map's element list is over 64 KiB, the
// most one netlink attribute can say. The program must either load whole
// or fail to load; it must never load a part of the map and let traffic
// to the left-out pods pass.
func TestReviewLargeMapTruncated(t *testing.T) {
	l := probe.New(t)
	for _, c := range []struct {
		n  int
		v4 bool
	}{{1000, false}, {1500, false}, {3000, false}, {1500, true}, {2000, true}, {4000, true}} {
		n, v4 := c.n, c.v4
		in, remote := reviewBigCluster(n, v4)
		prog := Compile(in)
		err := reviewLoad(t, l, prog)
		if err != nil {
			t.Logf("n=%d v4=%v: load failed: %v", n, v4, err)
			continue
		}
		set := "ingress6"
		if v4 {
			set = "ingress4"
		}
		got := reviewElems(t, l, set)
		t.Logf("n=%d v4=%v: loaded; map has %d elements, program has %d addresses", n, v4, got, len(prog.Ingress))
		src := netip.MustParseAddr("fd00:20::1")
		if v4 {
			src = netip.MustParseAddr("10.20.0.1")
		}
		passed := 0
		for _, dst := range remote {
			k := Packet{Src: src, Dst: dst, Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: 80}
			if prog.Allows(k) {
				t.Fatalf("program allows %v", k)
			}
			if l.Allows(t, probe.Packet(k)) {
				passed++
			}
		}
		if passed > 0 {
			t.Errorf("n=%d: the kernel let %d of %d packets to ingress-isolated pods through (program and engine drop them all); %s holds %d of %d addresses",
				n, passed, len(remote), set, got, len(prog.Ingress))
		}
	}
}
