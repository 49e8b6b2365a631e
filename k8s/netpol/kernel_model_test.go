package netpol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

func modelSeed(t *testing.T) uint64 {
	if s := os.Getenv("FLOCK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FLOCK_SEED=%q: %v", s, err)
		}
		return n
	}
	return 1
}

// modelExtra is the extra-IP tracker's answer in the model: anycast IPs
// given to and taken from pods, each change reported as the tracker does.
type modelExtra struct {
	mu    sync.Mutex
	byPod map[string][]string
}

func (x *modelExtra) ExtraPodIPs(p *trim.Pod) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.byPod[p.Namespace+"/"+p.Name])
}

func (x *modelExtra) PodsForIP(ip string) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for k, ips := range x.byPod {
		if slices.Contains(ips, ip) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func (x *modelExtra) HasSynced() bool                     { return true }
func (x *modelExtra) Handler() cache.ResourceEventHandler { return cache.ResourceEventHandlerFuncs{} }
func (x *modelExtra) Run(ctx context.Context, _ trim.PodLister, _ corelisters.NamespaceLister, _ []cache.InformerSynced, _ func(ips, pods []string)) error {
	<-ctx.Done()
	return nil
}

// toggle gives key ip, or takes it; it returns what the tracker reports.
func (x *modelExtra) toggle(key, ip string) (ips, pods []string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byPod == nil {
		x.byPod = map[string][]string{}
	}
	if held := x.byPod[key]; slices.Contains(held, ip) {
		x.byPod[key] = slices.DeleteFunc(slices.Clone(held), func(s string) bool { return s == ip })
	} else {
		x.byPod[key] = append(slices.Clone(held), ip)
		slices.Sort(x.byPod[key])
	}
	return []string{ip}, []string{key}
}

// Pods, namespaces and policies change from several goroutines while
// the kernel's program follows; loads fail at random and the process
// restarts; pods of either node are given anycast IPs and lose them. At
// each quiescent point the kernel decides every packet as a
// program compiled from the objects then does (kernel == f(state)); the
// compiled program is the engine's verdict by TestDifferential.
func TestKernelVerdictsFollowChanges(t *testing.T) {
	lab := probe.New(t)
	seed := modelSeed(t)
	t.Logf("FLOCK_SEED=%d", seed)
	r := rand.New(rand.NewPCG(seed, 0x6b76))
	var rmu sync.Mutex
	rnd := func(n int) int { rmu.Lock(); defer rmu.Unlock(); return r.IntN(n) }

	pods, nss, nps := stores()
	podL, nsL, npL := trim.NewPodLister(pods), corelisters.NewNamespaceLister(nss), networkinglisters.NewNetworkPolicyLister(nps)
	const node = "node-a"
	vals := []string{"x", "y"}
	var quiet atomic.Bool // a round in which only other nodes' pods change
	mkPod := func(i int) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: []string{"a", "b"}[i%2], Name: fmt.Sprintf("p%d", i),
			Labels: map[string]string{"app": vals[rnd(2)]}}}
		p.Spec.NodeName = []string{node, "node-b", "node-b"}[rnd(3)]
		if quiet.Load() {
			p.Spec.NodeName = "node-b"
		}
		p.Spec.Containers = []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(80 + rnd(2)), Protocol: corev1.ProtocolTCP}}}}
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:10::%x", i+1)}, {IP: fmt.Sprintf("198.51.100.%d", i+1)}}
		if i%3 == 2 && rnd(4) > 0 {
			// Elsewhere, in a namespace no policy is in or names, with no
			// ports: most of a large cluster's pods (their changes are
			// skipped); or, now and then, not.
			p.Namespace, p.Spec.NodeName, p.Spec.Containers = "c", "node-b", nil
			p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:20::%x", i+1)}}
		}
		if i%3 == 1 && rnd(3) == 0 {
			// Elsewhere, in a namespace whose own policy selects them and
			// that no rule of this node's pods names: their changes are
			// patched into the dispatch maps.
			p.Namespace, p.Spec.NodeName = "d", "node-b"
			p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:30::%x", i+1)}, {IP: fmt.Sprintf("203.0.113.%d", i+1)}}
		}
		return p
	}
	mkNS := func(n string) *corev1.Namespace {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"team": vals[rnd(2)]}}}
	}
	tcp := corev1.ProtocolTCP
	mkPolicy := func(i int) *networkingv1.NetworkPolicy {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: []string{"a", "b"}[rnd(2)], Name: fmt.Sprintf("np%d", i)}}
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": vals[rnd(2)]}}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}[:1+rnd(2)]
		port := intstr.FromString("http")
		if rnd(2) == 0 {
			port = intstr.FromInt32(80)
		}
		peer := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": vals[rnd(2)]}}}
		if rnd(3) == 0 {
			peer = networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/64", Except: []string{"fd00:10::/125"}}}
		}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}, From: []networkingv1.NetworkPolicyPeer{peer}}}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{peer}}}
		return np
	}
	for _, n := range []string{"a", "b"} {
		_ = nss.Add(mkNS(n))
	}
	_ = nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "c", Labels: map[string]string{"team": "w"}}})
	_ = nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "d", Labels: map[string]string{"team": "v"}}})
	{
		http := intstr.FromString("http")
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Name: "judged-in"}}
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		block := []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/64"}}}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &http}}, From: block}}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: block}}
		_ = nps.Add(np)
	}
	const npods, npolicies = 10, 4

	extra := &modelExtra{}
	anycast := []string{"2001:db8:a::1", "2001:db8:a::2"}
	var logBuf testutil.SyncBuffer
	var failing atomic.Bool
	var kv atomic.Pointer[kernelVerdicts]
	var skipped, patches, policySkipped atomic.Uint64 // by the processes before the last
	start := func() (stop func()) {
		if k := kv.Load(); k != nil {
			skipped.Add(k.skipped.Load())
			patches.Add(k.patches.Load())
			policySkipped.Add(k.policySkipped.Load())
		}
		k := newKernelVerdicts(node, podL, nsL, npL, extra, nil, slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug})).With("kv", fmt.Sprintf("%p", &struct{}{})))
		indexPods(k, pods)
		k.netns = int(lab.NS)
		k.hook.Prelude = false // the probe sends as root, whom the prelude lets through
		k.fail = func() error {
			if failing.Load() && rnd(3) == 0 {
				return errors.New("injected")
			}
			return nil
		}
		kv.Store(k)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = k.Run(ctx) }()
		return func() { cancel(); <-done }
	}
	stop := start()
	defer func() { stop() }()

	var informer sync.Mutex
	// policyOp writes np as the informer does, its handler after: an
	// update is classified.
	policyOp := func(np *networkingv1.NetworkPolicy) {
		informer.Lock()
		defer informer.Unlock()
		o, ok, _ := nps.GetByKey(np.Namespace + "/" + np.Name)
		_ = nps.Update(np)
		if ok {
			kv.Load().policyChanged(o.(*networkingv1.NetworkPolicy), np)
		} else {
			kv.Load().changed()
		}
	}
	seen := map[bool]int{}
	for round := range 12 {
		failing.Store(round%3 == 1)
		quiet.Store(round%2 == 0)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 25 {
					// A pod's store write and its handler in order, as an
					// informer delivers them: the handler classifies the
					// change (most are no program's concern). The store
					// holds pods as the informer's transform makes them.
					podOp := func(key string, write func(old *trim.Pod) *trim.Pod) {
						informer.Lock()
						defer informer.Unlock()
						var old *trim.Pod
						if o, ok, _ := pods.GetByKey(key); ok {
							old = o.(*trim.Pod)
						}
						cur := write(old)
						if old != nil || cur != nil {
							kv.Load().podChanged(old, cur)
						}
					}
					op := rnd(9)
					switch {
					case round%4 == 0: // d's pods alone: patches
						op = []int{8, 8, 9}[rnd(3)]
					case quiet.Load():
						op = []int{0, 1, 2, 6, 7, 8, 8}[rnd(7)]
					}
					switch op {
					case 0, 1:
						p := trim.NewPod(mkPod(rnd(npods)))
						podOp(p.Namespace+"/"+p.Name, func(*trim.Pod) *trim.Pod { _ = pods.Update(p); return p })
					case 2:
						podOp(fmt.Sprintf("%s/p%d", []string{"a", "b", "c", "d"}[(g+rnd(3))%4], rnd(npods)), func(old *trim.Pod) *trim.Pod {
							if old != nil && !(quiet.Load() && old.Spec.NodeName == node) {
								_ = pods.Delete(old)
							}
							return nil
						})
					case 3:
						_ = nss.Update(mkNS([]string{"a", "b"}[rnd(2)]))
						kv.Load().changed()
					case 4:
						policyOp(mkPolicy(rnd(npolicies)))
					case 6: // a policy of other nodes' pods: its peers change
						// Now and then once the kernel has caught up (the
						// other goroutines may have changed the context since).
						for k, until := kv.Load(), time.Now().Add(time.Duration(rnd(3))*25*time.Millisecond); k.done.Load() < k.seq.Load() && time.Now().Before(until); {
							time.Sleep(time.Millisecond)
						}
						np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "c", Name: fmt.Sprintf("far%d", rnd(2))}}
						np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
						peers := [][]networkingv1.NetworkPolicyPeer{
							{{IPBlock: &networkingv1.IPBlock{CIDR: "2001:db8::/64"}}}, // no judged pod
							{{IPBlock: &networkingv1.IPBlock{CIDR: "2001:db8::/64"}}, {IPBlock: &networkingv1.IPBlock{CIDR: "203.0.113.0/24"}}},
							{{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/64"}}}, // every judged IPv6 pod
							{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": vals[rnd(2)]}}}},
						}[rnd(4)]
						np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: peers}}
						np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: peers}}
						policyOp(np)
					case 8: // a pod of d, elsewhere: patched, mostly
						i := 1 + 3*rnd(npods/3)
						p := mkPod(i)
						p.Namespace, p.Spec.NodeName = "d", "node-b"
						p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:30::%x", i+1+16*rnd(2))}, {IP: fmt.Sprintf("203.0.113.%d", i+1)}}
						tp := trim.NewPod(p)
						podOp(tp.Namespace+"/"+tp.Name, func(*trim.Pod) *trim.Pod { _ = pods.Update(tp); return tp })
					case 9:
						podOp(fmt.Sprintf("d/p%d", 1+3*rnd(npods/3)), func(old *trim.Pod) *trim.Pod {
							if old != nil {
								_ = pods.Delete(old)
							}
							return nil
						})
					case 7: // the tracker gives a pod an anycast IP, or takes it
						key := fmt.Sprintf("%s/p%d", []string{"a", "b", "c"}[rnd(3)], rnd(npods))
						if o, ok, _ := pods.GetByKey(key); quiet.Load() && (!ok || o.(*trim.Pod).Spec.NodeName == node) {
							break // quiet: other nodes' pods alone
						}
						kv.Load().extraChanged(extra.toggle(key, anycast[rnd(len(anycast))]))
					case 5:
						for _, obj := range nps.List() {
							if rnd(3) == 0 && obj.(*networkingv1.NetworkPolicy).Namespace != "d" {
								_ = nps.Delete(obj)
							}
						}
						kv.Load().changed()
					}
				}
			}()
		}
		if round%4 == 2 { // a restart while the changes go on
			stop()
			stop = start()
		}
		wg.Wait()
		failing.Store(false)
		k := kv.Load()
		// No last kick: the changes the handler skipped must need none.
		want, pwant := k.seq.Load(), k.pseq.Load()
		want0 := want
		deadline := time.Now().Add(20 * time.Second)
		for k.last.Load() == nil || k.done.Load() < want || k.pdone.Load() < pwant { // a restarted process loads once first
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the kernel's program did not follow the last change (loaded %d of %d)", round, k.done.Load(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Quiescent: kernel == Compile(objects now).
		in := verdicts.Input{Node: node, ExtraPodIPs: extra.ExtraPodIPs, PodsForIP: extra.PodsForIP}
		in.Pods, _ = podL.List(labels.Everything())
		in.Namespaces, _ = nsL.List(labels.Everything())
		in.Policies, _ = npL.List(labels.Everything())
		prog := verdicts.Compile(in)
		var addrs []netip.Addr
		for _, p := range in.Pods {
			for _, ip := range p.Status.PodIPs {
				addrs = append(addrs, netip.MustParseAddr(ip.IP))
			}
		}
		addrs = append(addrs, netip.MustParseAddr("fd00:10::ff"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("203.0.113.1"))
		for _, ip := range anycast {
			addrs = append(addrs, netip.MustParseAddr(ip), netip.MustParseAddr(ip))
		}
		checked := 0
		for range 300 {
			k := probe.Packet{Src: addrs[rnd(len(addrs))], Dst: addrs[rnd(len(addrs))], Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: uint16(79 + rnd(3))}
			if k.Src.Is4() != k.Dst.Is4() || k.Src == k.Dst {
				continue
			}
			checked++
			want := prog.Allows(verdicts.Packet(k))
			seen[want]++
			if got := lab.Allows(t, k); got != want {
				// Stale, or rendered wrong? What the loaded program says.
				lastSays := kv.Load().last.Load().Allows(verdicts.Packet(k))
				t.Fatalf("round %d (FLOCK_SEED=%d): %s → %s port %d: kernel %v, program of the objects now %v, program loaded last %v (loaded change %d of %d)\n%s\nlog:\n%s", round, seed, k.Src, k.Dst, k.DstPort, got, want, lastSays, kv.Load().done.Load(), want0, describeIn(in), logBuf.String())
			}
		}
		if checked == 0 {
			t.Fatalf("round %d: no packet checked", round)
		}
	}
	t.Logf("packets: %d passed, %d dropped; pod changes compiled for none: %d, patched: %d (pseq %d), policy updates: %d", seen[true], seen[false], skipped.Load()+kv.Load().skipped.Load(), patches.Load()+kv.Load().patches.Load(), kv.Load().pseq.Load(), policySkipped.Load()+kv.Load().policySkipped.Load())
	// Quiescent, the context unchanged (no policy of c's pods): changes of
	// pods that no policy reads are skipped (the filter is exercised whatever the timing
	// above), and the kernel still decides as the objects now do.
	k := kv.Load()
	extra.mu.Lock()
	extra.byPod = nil // c's pods hold no anycast IP: their changes need no program
	extra.mu.Unlock()
	k.changed()
	for _, obj := range nps.List() {
		if np := obj.(*networkingv1.NetworkPolicy); np.Namespace == "c" {
			_ = nps.Delete(np)
			k.changed()
		}
	}
	waitLoaded := func() {
		t.Helper()
		want, pwant, deadline := k.seq.Load(), k.pseq.Load(), time.Now().Add(20*time.Second)
		for k.done.Load() < want || k.pdone.Load() < pwant {
			if time.Now().After(deadline) {
				t.Fatalf("the kernel's program did not follow (loaded %d of %d)", k.done.Load(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitLoaded()
	dialsAt := k.dials.Load()
	before := k.skipped.Load()
	for i := range 5 {
		p := mkPod(3*i + 2)
		p.Namespace, p.Spec.NodeName, p.Spec.Containers = "c", "node-b", nil
		p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("fd00:20::%x", 3*i+3)}}
		tp := trim.NewPod(p)
		var old *trim.Pod
		if o, ok, _ := pods.GetByKey("c/" + tp.Name); ok {
			old = o.(*trim.Pod)
		}
		_ = pods.Update(tp)
		k.podChanged(old, tp)
	}
	if got := k.skipped.Load() - before; got != 5 {
		t.Errorf("quiescent: %d of 5 changes of pods no policy reads skipped", got)
	}
	// A policy of other nodes' pods whose peer changes to another that
	// matches no judged pod is skipped too; one that isolates them
	// otherwise for this node's pods is not.
	far := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "c", Name: "far"}}
	far.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	far.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "2001:db8::/64"}}}}}
	_ = nps.Add(far)
	k.changed()
	waitLoaded()
	farther := far.DeepCopy()
	farther.Spec.Ingress[0].From = append(farther.Spec.Ingress[0].From, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "2001:db8:1::/64"}})
	_ = nps.Update(farther)
	before, seq := k.policySkipped.Load(), k.seq.Load()
	k.policyChanged(far, farther)
	if k.policySkipped.Load() != before+1 || k.seq.Load() != seq {
		t.Errorf("an update of a policy whose new peer matches no judged pod: compiled for (skipped %d → %d)", before, k.policySkipped.Load())
	}
	near := farther.DeepCopy()
	near.Spec.Ingress[0].From = nil // every peer: this node's pods may now reach c's
	_ = nps.Update(near)
	k.policyChanged(farther, near)
	if k.seq.Load() == seq {
		t.Error("an update of a policy that lets this node's judged pods in: not compiled for")
	}
	waitLoaded()
	// An anycast IP given to a pod of another node, in a namespace no
	// policy reads, asks for a program but keeps the context (it is paced
	// as other nodes' pods are); one given to this node's pod changes it.
	for _, c := range []struct {
		key     string
		context bool
	}{{"c/p2", false}, {"c/p2", false}, {"a/p0", true}} {
		p := mkPod(2)
		p.Namespace, p.Spec.NodeName, p.Spec.Containers = "c", "node-b", nil
		p.Status.PodIPs = []corev1.PodIP{{IP: "fd00:20::3"}}
		_ = pods.Update(trim.NewPod(p))
		if c.context { // a/p0 is this node's
			lp := mkPod(0)
			lp.Namespace, lp.Spec.NodeName = "a", node
			local := trim.NewPod(lp)
			var old *trim.Pod
			if o, ok, _ := pods.GetByKey("a/p0"); ok {
				old = o.(*trim.Pod)
			}
			_ = pods.Update(local)
			k.podChanged(old, local)
		}
		k.changed()
		waitLoaded()
		gen, seq := k.gen.Load(), k.seq.Load()
		k.extraChanged(extra.toggle(c.key, "2001:db8:a::9"))
		if k.seq.Load() == seq || (k.gen.Load() != gen) != c.context || (!c.context && k.urgent.Load()) {
			t.Errorf("%s given or losing an anycast IP: compiled for %v, context changed %v, urgent %v; want a new context %v",
				c.key, k.seq.Load() != seq, k.gen.Load() != gen, k.urgent.Load(), c.context)
		}
		waitLoaded()
	}
	// A pod elsewhere that its namespace's policy selects, and that no
	// rule of this node's pods names, moves to another address: its
	// entries are patched, nothing is compiled, and the kernel decides
	// as a compile would.
	minePod := mkPod(0)
	minePod.Namespace, minePod.Spec.NodeName, minePod.Labels = "a", node, map[string]string{"app": "mine"}
	minePod.Status.PodIPs = []corev1.PodIP{{IP: "fd00:10::1"}}
	mine := trim.NewPod(minePod)
	egress := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "mine-out"}}
	egress.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "mine"}}
	egress.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	egress.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:30::/64"}}}}}
	_ = nps.Update(egress)
	dcore := mkPod(1)
	dcore.Namespace, dcore.Spec.NodeName, dcore.Labels = "d", "node-b", map[string]string{"app": "x"}
	dcore.Spec.Containers = []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}}}
	dcore.Status.PodIPs = []corev1.PodIP{{IP: "fd00:30::99"}}
	dpod := trim.NewPod(dcore)
	for _, p := range []*trim.Pod{mine, dpod} {
		var old *trim.Pod
		if o, ok, _ := pods.GetByKey(p.Namespace + "/" + p.Name); ok {
			old = o.(*trim.Pod)
		}
		_ = pods.Update(p)
		k.podChanged(old, p)
	}
	k.changed()
	waitLoaded()
	movedCore := dcore.DeepCopy()
	movedCore.Status.PodIPs = []corev1.PodIP{{IP: "fd00:30::98"}}
	moved := trim.NewPod(movedCore)
	_ = pods.Update(moved)
	seq, patched := k.seq.Load(), k.patches.Load()
	k.podChanged(dpod, moved)
	waitLoaded()
	if k.seq.Load() != seq || k.patches.Load() != patched+1 {
		t.Errorf("a pod elsewhere that moved: %d compiles, %d patches; want 0 and 1", k.seq.Load()-seq, k.patches.Load()-patched)
	}
	in := verdicts.Input{Node: node, ExtraPodIPs: extra.ExtraPodIPs, PodsForIP: extra.PodsForIP}
	in.Pods, _ = podL.List(labels.Everything())
	in.Namespaces, _ = nsL.List(labels.Everything())
	in.Policies, _ = npL.List(labels.Everything())
	now := verdicts.Compile(in)
	for _, dst := range []string{"fd00:30::98", "fd00:30::99"} {
		for port := uint16(79); port <= 81; port++ {
			pk := probe.Packet{Src: netip.MustParseAddr("fd00:10::1"), Dst: netip.MustParseAddr(dst), Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: port}
			want := now.Allows(verdicts.Packet(pk))
			seen[want]++
			if got := lab.Allows(t, pk); got != want {
				t.Errorf("after a patch, %s → %s port %d: kernel %v, a compile %v", pk.Src, pk.Dst, port, got, want)
			}
		}
	}
	// A pod elsewhere that a rule of this node's pod names as a peer
	// comes, moves next to where it was, and goes: each change is patched
	// into the rule's set of peers, nothing is compiled, and the kernel
	// decides as a compile would.
	egress = egress.DeepCopy()
	egress.Spec.Egress = append(egress.Spec.Egress, networkingv1.NetworkPolicyEgressRule{
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr.To(intstr.FromInt32(443))}},
		To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "w"}}}}})
	_ = nps.Update(egress)
	k.changed()
	waitLoaded()
	peerCore := mkPod(2)
	peerCore.Name, peerCore.Namespace, peerCore.Spec.NodeName, peerCore.Spec.Containers = "peer", "c", "node-b", nil
	peerCore.Status.PodIPs = []corev1.PodIP{{IP: "fd00:20::1000"}}
	peerMovedCore := peerCore.DeepCopy()
	peerMovedCore.Status.PodIPs = []corev1.PodIP{{IP: "fd00:20::1001"}}
	peer, peerMoved := trim.NewPod(peerCore), trim.NewPod(peerMovedCore)
	for _, step := range []struct{ old, cur *trim.Pod }{{nil, peer}, {peer, peerMoved}, {peerMoved, nil}} {
		if step.cur != nil {
			_ = pods.Update(step.cur)
		} else {
			_ = pods.Delete(step.old)
		}
		seq, patched := k.seq.Load(), k.patches.Load()
		k.podChanged(step.old, step.cur)
		waitLoaded()
		if k.seq.Load() != seq || k.patches.Load() != patched+1 {
			t.Errorf("a peer elsewhere %s → %s: %d compiles, %d patches; want 0 and 1", ipsOf(step.old), ipsOf(step.cur), k.seq.Load()-seq, k.patches.Load()-patched)
		}
		in.Pods, _ = podL.List(labels.Everything())
		in.Policies, _ = npL.List(labels.Everything())
		now := verdicts.Compile(in)
		for _, dst := range []string{"fd00:20::fff", "fd00:20::1000", "fd00:20::1001", "fd00:20::1002"} {
			for _, port := range []uint16{80, 443} {
				pk := probe.Packet{Src: netip.MustParseAddr("fd00:10::1"), Dst: netip.MustParseAddr(dst), Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: port}
				want := now.Allows(verdicts.Packet(pk))
				seen[want]++
				if got := lab.Allows(t, pk); got != want {
					t.Errorf("after a peer's patch (%s → %s), %s → %s port %d: kernel %v, a compile %v", ipsOf(step.old), ipsOf(step.cur), pk.Src, pk.Dst, port, got, want)
				}
			}
		}
	}
	// Every load and patch since the quiescent point went over one
	// connection. A transaction the kernel refuses (the table deleted
	// under it) closes it; the load that follows dials anew and the
	// kernel decides as a compile would again.
	if d := k.dials.Load() - dialsAt; d != 0 {
		t.Errorf("%d nftables connections dialled for the quiescent checks' loads and patches, want none (one lasts)", d)
	}
	del, err := nftables.New(nftables.WithNetNSFd(int(lab.NS)))
	if err != nil {
		t.Fatal(err)
	}
	del.DelTable(&nftables.Table{Name: Table, Family: nftables.TableFamilyINet})
	if err := del.Flush(); err != nil {
		t.Fatalf("delete table %s: %v", Table, err)
	}
	back := peerCore.DeepCopy()
	back.Status.PodIPs = []corev1.PodIP{{IP: "fd00:20::1002"}}
	_ = pods.Update(trim.NewPod(back))
	patched, loads := k.patches.Load(), k.seq.Load()
	k.podChanged(nil, trim.NewPod(back))
	waitLoaded()
	if k.patches.Load() != patched || k.seq.Load() == loads || k.dials.Load()-dialsAt != 1 {
		t.Errorf("a patch the kernel refused: %d patches, %d loads, %d connections dialled; want 0, a load, 1", k.patches.Load()-patched, k.seq.Load()-loads, k.dials.Load()-dialsAt)
	}
	in.Pods, _ = podL.List(labels.Everything())
	now = verdicts.Compile(in)
	for _, dst := range []string{"fd00:20::1001", "fd00:20::1002", "fd00:30::98"} {
		for _, port := range []uint16{80, 443} {
			pk := probe.Packet{Src: netip.MustParseAddr("fd00:10::1"), Dst: netip.MustParseAddr(dst), Proto: unix.IPPROTO_TCP, SrcPort: 40000, DstPort: port}
			want := now.Allows(verdicts.Packet(pk))
			seen[want]++
			if got := lab.Allows(t, pk); got != want {
				t.Errorf("after the table was deleted and loaded again, %s → %s port %d: kernel %v, a compile %v", pk.Src, pk.Dst, port, got, want)
			}
		}
	}
	if seen[true] == 0 || seen[false] == 0 {
		t.Errorf("packets: %d passed, %d dropped: want both", seen[true], seen[false])
	}
}

// ipsOf prints p's status IPs (nil: none).
func ipsOf(p *trim.Pod) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(p.Status.PodIPs)
}

func describeIn(in verdicts.Input) string {
	out := ""
	for _, p := range in.Pods {
		var ports []corev1.ContainerPort
		for _, c := range p.Spec.Containers {
			ports = append(ports, c.Ports...)
		}
		out += fmt.Sprintf("pod %s/%s node=%s labels=%v ips=%v ports=%v\n", p.Namespace, p.Name, p.Spec.NodeName, p.Labels, p.Status.PodIPs, ports)
	}
	for _, n := range in.Namespaces {
		out += fmt.Sprintf("namespace %s labels=%v\n", n.Name, n.Labels)
	}
	for _, np := range in.Policies {
		out += fmt.Sprintf("policy %s/%s types=%v select=%v ingress=%+v egress=%+v\n", np.Namespace, np.Name, np.Spec.PolicyTypes, np.Spec.PodSelector.String(), np.Spec.Ingress, np.Spec.Egress)
	}
	return out
}

// stores are the pod, namespace and NetworkPolicy caches as flock-policy's
// informers index them. The pod cache holds *trim.Pod, as the informer's
// transform makes them (trim.NewPod).
func stores() (pods, nss, nps cache.Indexer) {
	pods = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	nss = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	nps = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	return pods, nss, nps
}

// indexPods gives k the pods by IP that flock-policy's pod handler keeps,
// told of every pod in pods (the informer's first list): the tests' pod
// changes then reach it through podChanged, as the handler's do.
func indexPods(k *kernelVerdicts, pods cache.Indexer) {
	k.ips = newPodsByIP()
	for _, o := range pods.List() {
		k.ips.update(nil, o.(*trim.Pod))
	}
	k.holders = k.ips.lookup
}
