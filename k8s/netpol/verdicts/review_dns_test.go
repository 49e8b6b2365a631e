package verdicts

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// inNS runs f on a thread in ns.
func inNS(t *testing.T, ns netns.NsHandle, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer netns.Set(orig)
	f()
}

// TestReviewDNSToNodeNotJudged: a pod under an egress deny-all policy
// sends DNS (UDP 53) to an address of its node (a node-local DNS cache,
// the node's IP). The engine, with NetfilterBug1766Fix as flock sets it,
// queues UDP 53 from and to its podips at prerouting (controller.go
// addDNSRacersWorkaroundRules) and drops it (EvaluatePacket false). The
// compiled table has a postrouting chain only, which a packet for the
// node never meets: it is delivered.
func TestReviewDNSToNodeNotJudged(t *testing.T) {
	probe.NeedRoot(t)
	var nodeNS, podNS netns.NsHandle
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, _ := netns.Get()
		defer orig.Close()
		var err error
		if podNS, err = netns.New(); err != nil {
			t.Fatal(err)
		}
		if nodeNS, err = netns.New(); err != nil {
			t.Fatal(err)
		}
		_ = netns.Set(orig)
	}()
	t.Cleanup(func() { nodeNS.Close(); podNS.Close() })
	inNS(t, nodeNS, func() {
		lo, _ := netlink.LinkByName("lo")
		_ = netlink.LinkSetUp(lo)
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "n0"}, PeerName: "p0"}); err != nil {
			t.Fatal(err)
		}
		p0, _ := netlink.LinkByName("p0")
		if err := netlink.LinkSetNsFd(p0, int(podNS)); err != nil {
			t.Fatal(err)
		}
		n0, _ := netlink.LinkByName("n0")
		a, _ := netlink.ParseAddr("10.9.0.1/24")
		_ = netlink.AddrAdd(n0, a)
		_ = netlink.LinkSetUp(n0)
	})
	inNS(t, podNS, func() {
		p0, _ := netlink.LinkByName("p0")
		a, _ := netlink.ParseAddr("10.9.0.2/24")
		_ = netlink.AddrAdd(p0, a)
		_ = netlink.LinkSetUp(p0)
	})

	in := Input{Node: localNode}
	in.Namespaces = []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}}
	pod := &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "client", Labels: map[string]string{"app": "client"}}}
	pod.Spec.NodeName = localNode
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIPs = []corev1.PodIP{{IP: "10.9.0.2"}}
	in.Pods = []*trim.Pod{pod}
	in.Policies = []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "deny-egress", UID: "u"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}}}

	w := &world{in: in}
	ctrl := engine(t, w)
	if ctrl.EvaluatePacket(context.Background(), net.ParseIP("10.9.0.2"), net.ParseIP("10.9.0.1"), corev1.ProtocolUDP, 40000, 53) {
		t.Fatal("the engine allows it: nothing to show")
	}

	conn, err := NewConn(int(nodeNS))
	if err != nil {
		t.Fatal(err)
	}
	// flock-policy's hook (k8s/netpol/kernel.go newKernelVerdicts).
	hook := Hook{Num: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATSource - 5), Prelude: true}
	if err := Load(conn, "flock-netpol", hook, Compile(in)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}

	var srv int
	inNS(t, nodeNS, func() {
		var err error
		if srv, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(srv, &unix.SockaddrInet4{Port: 53, Addr: [4]byte{10, 9, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
		_ = unix.SetsockoptTimeval(srv, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	defer unix.Close(srv)
	inNS(t, podNS, func() {
		c, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(c)
		if err := unix.Sendto(c, []byte("query"), 0, &unix.SockaddrInet4{Port: 53, Addr: [4]byte{10, 9, 0, 1}}); err != nil {
			t.Fatal(err)
		}
	})
	buf := make([]byte, 64)
	n, _, err := unix.Recvfrom(srv, buf, 0)
	if err == nil && n > 0 {
		t.Errorf("DNS from a pod under egress deny-all to its node's address was delivered (engine: drop, judged at prerouting)")
	} else {
		t.Logf("not delivered: %v", err)
	}
}
