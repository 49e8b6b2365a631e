package verdicts

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
	npav1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	npainformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"
)

// adminWorld is a random cluster with admin policies, and which of the
// two APIs are on.
type adminWorld struct {
	*world
	anpOn, banpOn bool
	anps          []*npav1alpha1.AdminNetworkPolicy
	banps         []*npav1alpha1.BaselineAdminNetworkPolicy
	nodes         []*corev1.Node
}

func randSubject(r *rand.Rand) npav1alpha1.AdminNetworkPolicySubject {
	if r.IntN(2) == 0 {
		return npav1alpha1.AdminNetworkPolicySubject{Namespaces: randSelector(r)}
	}
	return npav1alpha1.AdminNetworkPolicySubject{Pods: &npav1alpha1.NamespacedPod{NamespaceSelector: *randSelector(r), PodSelector: *randSelector(r)}}
}

func randAdminPorts(r *rand.Rand) *[]npav1alpha1.AdminNetworkPolicyPort {
	if r.IntN(3) == 0 {
		return nil
	}
	var out []npav1alpha1.AdminNetworkPolicyPort
	for range 1 + r.IntN(2) {
		proto := pick(r, []corev1.Protocol{protoTCP, protoUDP, protoSCTP})
		switch r.IntN(3) {
		case 0:
			out = append(out, npav1alpha1.AdminNetworkPolicyPort{PortNumber: &npav1alpha1.Port{Protocol: proto, Port: int32(pick(r, []int{53, 80, 1000, 8080}))}})
		case 1:
			out = append(out, npav1alpha1.AdminNetworkPolicyPort{NamedPort: new(pick(r, portNames))})
		default:
			lo := int32(pick(r, []int{53, 1000, 8000}))
			out = append(out, npav1alpha1.AdminNetworkPolicyPort{PortRange: &npav1alpha1.PortRange{Protocol: proto, Start: lo, End: lo + int32(r.IntN(100))}})
		}
	}
	return &out
}

func randEgressPeer(r *rand.Rand) npav1alpha1.AdminNetworkPolicyEgressPeer {
	switch r.IntN(5) {
	case 0:
		return npav1alpha1.AdminNetworkPolicyEgressPeer{Namespaces: randSelector(r)}
	case 1:
		return npav1alpha1.AdminNetworkPolicyEgressPeer{Pods: &npav1alpha1.NamespacedPod{NamespaceSelector: *randSelector(r), PodSelector: *randSelector(r)}}
	case 2:
		return npav1alpha1.AdminNetworkPolicyEgressPeer{Nodes: randSelector(r)}
	case 3:
		return npav1alpha1.AdminNetworkPolicyEgressPeer{DomainNames: []npav1alpha1.DomainName{"example.com"}}
	}
	return npav1alpha1.AdminNetworkPolicyEgressPeer{Networks: []npav1alpha1.CIDR{npav1alpha1.CIDR(pick(r, []string{"fd00:10::/32", "198.51.100.0/24", "2001:db8:a::/48", "::/0"}))}}
}

func randIngressPeer(r *rand.Rand) npav1alpha1.AdminNetworkPolicyIngressPeer {
	if r.IntN(2) == 0 {
		return npav1alpha1.AdminNetworkPolicyIngressPeer{Namespaces: randSelector(r)}
	}
	return npav1alpha1.AdminNetworkPolicyIngressPeer{Pods: &npav1alpha1.NamespacedPod{NamespaceSelector: *randSelector(r), PodSelector: *randSelector(r)}}
}

func newAdminWorld(r *rand.Rand) *adminWorld {
	w := &adminWorld{world: newWorld(r)}
	switch r.IntN(3) {
	case 0:
		w.anpOn = true
	case 1:
		w.banpOn = true
	default:
		w.anpOn, w.banpOn = true, true
	}
	for _, n := range []string{"node-a", "node-b"} {
		w.nodes = append(w.nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: randLabels(r)}})
	}
	actions := []npav1alpha1.AdminNetworkPolicyRuleAction{npav1alpha1.AdminNetworkPolicyRuleActionAllow, npav1alpha1.AdminNetworkPolicyRuleActionDeny, npav1alpha1.AdminNetworkPolicyRuleActionPass}
	for i := range r.IntN(4) {
		a := &npav1alpha1.AdminNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("anp%d", i)}}
		a.Spec.Priority = int32(r.IntN(5))
		a.Spec.Subject = randSubject(r)
		for range r.IntN(3) {
			a.Spec.Egress = append(a.Spec.Egress, npav1alpha1.AdminNetworkPolicyEgressRule{Action: pick(r, actions), Ports: randAdminPorts(r), To: []npav1alpha1.AdminNetworkPolicyEgressPeer{randEgressPeer(r)}})
		}
		for range r.IntN(3) {
			a.Spec.Ingress = append(a.Spec.Ingress, npav1alpha1.AdminNetworkPolicyIngressRule{Action: pick(r, actions), Ports: randAdminPorts(r), From: []npav1alpha1.AdminNetworkPolicyIngressPeer{randIngressPeer(r)}})
		}
		w.anps = append(w.anps, a)
	}
	bactions := []npav1alpha1.BaselineAdminNetworkPolicyRuleAction{npav1alpha1.BaselineAdminNetworkPolicyRuleActionAllow, npav1alpha1.BaselineAdminNetworkPolicyRuleActionDeny}
	if r.IntN(3) > 0 {
		b := &npav1alpha1.BaselineAdminNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
		b.Spec.Subject = randSubject(r)
		for range r.IntN(3) {
			var to []npav1alpha1.BaselineAdminNetworkPolicyEgressPeer
			p := randEgressPeer(r)
			to = append(to, npav1alpha1.BaselineAdminNetworkPolicyEgressPeer{Namespaces: p.Namespaces, Pods: p.Pods, Nodes: p.Nodes, Networks: p.Networks})
			b.Spec.Egress = append(b.Spec.Egress, npav1alpha1.BaselineAdminNetworkPolicyEgressRule{Action: pick(r, bactions), Ports: randAdminPorts(r), To: to})
		}
		for range r.IntN(3) {
			b.Spec.Ingress = append(b.Spec.Ingress, npav1alpha1.BaselineAdminNetworkPolicyIngressRule{Action: pick(r, bactions), Ports: randAdminPorts(r), From: []npav1alpha1.AdminNetworkPolicyIngressPeer{randIngressPeer(r)}})
		}
		w.banps = append(w.banps, b)
	}
	w.in.Admin = true
	w.in.AdminSubjects = adminSubjects(w)
	return w
}

// adminSubjects are the subjects of the policies of the APIs that are on.
func adminSubjects(w *adminWorld) []npav1alpha1.AdminNetworkPolicySubject {
	var out []npav1alpha1.AdminNetworkPolicySubject
	if w.anpOn {
		for _, a := range w.anps {
			out = append(out, a.Spec.Subject)
		}
	}
	if w.banpOn {
		for _, b := range w.banps {
			out = append(out, b.Spec.Subject)
		}
	}
	return out
}

// adminEngine is the engine over w with the admin policies' APIs on as w
// says.
func adminEngine(t *testing.T, w *adminWorld) (ctrl *networkpolicy.Controller) {
	t.Helper()
	client := fake.NewSimpleClientset()
	f := informers.NewSharedInformerFactory(client, 0)
	pods, nss, nps, nodes := f.Core().V1().Pods(), f.Core().V1().Namespaces(), f.Networking().V1().NetworkPolicies(), f.Core().V1().Nodes()
	// The policy API's fake clientset pulls in an old structured-merge-diff;
	// the informers are never started (the test fills their caches), so
	// a client of no server does.
	npa, err := npaclient.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	nf := npainformers.NewSharedInformerFactory(npa, 0)
	anps, banps := nf.Policy().V1alpha1().AdminNetworkPolicies(), nf.Policy().V1alpha1().BaselineAdminNetworkPolicies()
	ctrl, err = networkpolicy.NewController(client, nps, nss, pods, nodes, npa, anps, banps, networkpolicy.Config{
		NodeName: w.in.Node, NRIdisabled: true, AdminNetworkPolicy: w.anpOn, BaselineAdminNetworkPolicy: w.banpOn,
		ExtraPodIPs: w.engineExtraPodIPs(), PodsForIP: w.in.PodsForIP,
	})
	if err != nil {
		t.Fatal(err)
	}
	add := func(inf interface{ Add(any) error }, objs ...any) {
		for _, o := range objs {
			if err := inf.Add(o); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range w.enginePods() {
		add(pods.Informer().GetIndexer(), p)
	}
	for _, n := range w.in.Namespaces {
		add(nss.Informer().GetIndexer(), n)
	}
	for _, np := range w.in.Policies {
		add(nps.Informer().GetIndexer(), np)
	}
	for _, n := range w.nodes {
		add(nodes.Informer().GetIndexer(), n)
	}
	for _, a := range w.anps {
		add(anps.Informer().GetIndexer(), a)
	}
	for _, b := range w.banps {
		add(banps.Informer().GetIndexer(), b)
	}
	return ctrl
}

// TestDifferentialAdmin: with AdminNetworkPolicy, BaselineAdminNetworkPolicy
// or both on, every packet the program does not queue to the engine gets
// the engine's verdict from the program, on every node, whatever the
// admin policies say; the queued ones are exactly those from or to a
// subject's address, so no other packet is slowed.
func TestDifferentialAdmin(t *testing.T) {
	s := seed(t)
	worlds, packets := scaled(t, 200), 400
	if testing.Short() {
		worlds = 40
	}
	t.Logf("FLOCK_SEED=%d", s)
	r := rand.New(rand.NewPCG(s, 0x616e70))
	count := map[string]int{}
	for wi := range worlds {
		w := newAdminWorld(r)
		ctrl := adminEngine(t, w)
		prog := Compile(w.in)
		plain := Compile(Input{Node: w.in.Node, Pods: w.in.Pods, Namespaces: w.in.Namespaces, Policies: w.in.Policies,
			ExtraPodIPs: w.in.ExtraPodIPs, PodsForIP: w.in.PodsForIP})
		for range packets {
			k := randPacket(r, w.world)
			exp := ctrl.EvaluatePacket(context.Background(), net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), protoNames[k.Proto], int(k.SrcPort), int(k.DstPort))
			if prog.Queues(k) {
				count["queued"]++
				continue
			}
			got := prog.Allows(k)
			count[fmt.Sprint("decided ", exp)]++
			if got != exp {
				t.Fatalf("world %d (FLOCK_SEED=%d, ANP %v, BANP %v): packet %s → %s proto %d port %d: program %v, engine %v\n%s%s",
					wi, s, w.anpOn, w.banpOn, k.Src, k.Dst, k.Proto, k.DstPort, got, exp, describe(w.world), describeAdmin(w))
			}
			// The groups are the plain program's: only the set of
			// judged addresses grows.
			if plain.Selected[k.Src] || plain.Selected[k.Dst] {
				if p := plain.Allows(k); p != got {
					t.Fatalf("world %d: packet %s → %s: admin program %v, plain %v", wi, k.Src, k.Dst, got, p)
				}
			}
		}
		// Queued holds a subject's addresses and nothing else.
		subjects := map[netip.Addr]bool{}
		c := &compiler{in: w.in}
		for _, p := range w.in.Pods {
			if p.Spec.HostNetwork || !isSubject(w, p) {
				continue
			}
			for _, ip := range c.podIPs(p) {
				subjects[netip.MustParseAddr(ip)] = true
			}
		}
		if len(subjects) != len(prog.Queued) {
			t.Fatalf("world %d: queued %v, want the subjects' addresses %v\n%s%s", wi, prog.Queued, subjects, describe(w.world), describeAdmin(w))
		}
		for a := range subjects {
			if !prog.Queued[a] {
				t.Fatalf("world %d: subject address %s not queued", wi, a)
			}
		}
	}
	t.Logf("packets: %v", count)
	if count["queued"] < worlds || count["decided true"] < worlds || count["decided false"] < worlds {
		t.Errorf("packets %v: want at least %d queued, decided true and decided false", count, worlds)
	}
}

// isSubject asks the API's own reading of a subject (the selectors'
// semantics as the policy API documents them), written apart from the
// compiler's: the namespace must exist, and a selector that does not
// parse selects nothing.
func isSubject(w *adminWorld, p *trim.Pod) bool {
	var ns *corev1.Namespace
	for _, n := range w.in.Namespaces {
		if n.Name == p.Namespace {
			ns = n
		}
	}
	if ns == nil {
		return false
	}
	match := func(ls *metav1.LabelSelector, l map[string]string) bool {
		sel, err := metav1.LabelSelectorAsSelector(ls)
		return err == nil && sel.Matches(labels.Set(l))
	}
	for _, s := range adminSubjects(w) {
		if s.Namespaces != nil && match(s.Namespaces, ns.Labels) {
			return true
		}
		if s.Pods != nil && match(&s.Pods.NamespaceSelector, ns.Labels) && match(&s.Pods.PodSelector, p.Labels) {
			return true
		}
	}
	return false
}

func describeAdmin(w *adminWorld) string {
	out := fmt.Sprintf("ANP on %v, BANP on %v\n", w.anpOn, w.banpOn)
	for _, n := range w.nodes {
		out += fmt.Sprintf("node %s labels=%v\n", n.Name, n.Labels)
	}
	for _, a := range w.anps {
		out += fmt.Sprintf("anp %s priority=%d subject=%+v ingress=%+v egress=%+v\n", a.Name, a.Spec.Priority, a.Spec.Subject, a.Spec.Ingress, a.Spec.Egress)
	}
	for _, b := range w.banps {
		out += fmt.Sprintf("banp subject=%+v ingress=%+v egress=%+v\n", b.Spec.Subject, b.Spec.Ingress, b.Spec.Egress)
	}
	return out
}

// TestKernelDifferentialAdmin: the rendered program with the admin
// policies on, run by the kernel, queues exactly the packets the program
// queues and decides the others as the engine does. The queue verdict is
// accept in one load and drop in the next, so each packet shows both
// whether it was queued and how it was decided.
func TestKernelDifferentialAdmin(t *testing.T) {
	l := probe.New(t)
	conn, err := NewConn(int(l.NS))
	if err != nil {
		t.Fatal(err)
	}
	s := seed(t)
	t.Logf("FLOCK_SEED=%d", s)
	r := rand.New(rand.NewPCG(s, 0x6b616e))
	worlds, packets := scaled(t, 100), 100
	if testing.Short() {
		worlds = 20
	}
	count := map[string]int{}
	for wi := range worlds {
		w := newAdminWorld(r)
		ctrl := adminEngine(t, w)
		prog := Compile(w.in)
		var ks []Packet
		for range packets {
			ks = append(ks, randPacket(r, w.world))
		}
		got := map[bool][]bool{}
		for _, queue := range []bool{true, false} {
			v := expr.VerdictDrop
			if queue {
				v = expr.VerdictAccept
			}
			if err := Load(conn, "flock-verdicts-test", Hook{Num: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Queue: &expr.Verdict{Kind: v}}, prog); err != nil {
				t.Fatalf("load the program: %v", err)
			}
			for _, k := range ks {
				got[queue] = append(got[queue], l.Allows(t, probe.Packet(k)))
			}
		}
		for i, k := range ks {
			queued := prog.Queues(k)
			exp := ctrl.EvaluatePacket(context.Background(), net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), protoNames[k.Proto], int(k.SrcPort), int(k.DstPort))
			// Queued, the queue's verdict decides; else the two loads
			// decide alike.
			kQueued := got[true][i] && !got[false][i]
			kAllows := got[false][i]
			switch {
			case queued != kQueued:
				t.Fatalf("world %d (FLOCK_SEED=%d): packet %s → %s proto %d port %d: kernel queues %v, program %v\n%s%s", wi, s, k.Src, k.Dst, k.Proto, k.DstPort, kQueued, queued, describe(w.world), describeAdmin(w))
			case !queued && kAllows != exp:
				t.Fatalf("world %d (FLOCK_SEED=%d): packet %s → %s proto %d port %d: kernel %v, engine %v\n%s%s", wi, s, k.Src, k.Dst, k.Proto, k.DstPort, kAllows, exp, describe(w.world), describeAdmin(w))
			}
			switch {
			case queued:
				count["queued"]++
			default:
				count[fmt.Sprint("decided ", exp)]++
			}
		}
	}
	t.Logf("%d packets through the kernel: %v", l.Sent, count)
	if count["queued"] < worlds || count["decided false"] < worlds/2 {
		t.Errorf("packets %v: the corpus tests little", count)
	}
}
