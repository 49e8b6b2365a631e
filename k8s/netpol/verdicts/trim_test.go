package verdicts

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// bulky is p as the API serves it: what the kubelet and the controllers
// add besides what is read. The readers must ignore all of it, and the
// trim drops it. Init containers get ports of the names policies use
// (the engine reads spec.containers only).
func bulky(r *rand.Rand, tp *trim.Pod) *corev1.Pod {
	p := tp.Core().DeepCopy()
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations["kubectl.kubernetes.io/restartedAt"] = fmt.Sprint(r.IntN(100))
	p.Annotations["flock.fritzlab.net/addresses"] = "2001:db8:c::1"
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: p.Name + "-rs", UID: "rs"}}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Subresource: "status"}}
	p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "init:1", Ports: []corev1.ContainerPort{{Name: pick(r, portNames), ContainerPort: int32(pick(r, []int{53, 80, 8080})), Protocol: protoTCP}}}}
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.Name, c.Image = fmt.Sprintf("c%d", i), "app:1"
		c.Env = []corev1.EnvVar{{Name: "A", Value: "b"}}
		for j := range c.Ports {
			c.Ports[j].HostPort = int32(r.IntN(2) * 30000)
		}
	}
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar", Image: "proxy:1", Args: []string{"--x"}})
	p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: pick(r, []corev1.ConditionStatus{corev1.ConditionTrue, corev1.ConditionFalse})}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c0", Ready: true, RestartCount: int32(r.IntN(3))}}
	p.Status.HostIPs = []corev1.HostIP{{IP: "192.0.2.1"}}
	if len(p.Status.PodIPs) > 0 {
		p.Status.PodIP = p.Status.PodIPs[0].IP
	}
	return p
}

// trimmedIn is in as flock-policy's caches hold it (trim.Transform),
// and the bulky form it was trimmed from: whole are the bulky pods, and
// bulk's pods are them as whole as a trim.Pod holds them (asPod: all
// their containers, the sidecar without ports too, and all their
// metadata), for the compiler, which reads trim.Pods only.
func trimmedIn(r *rand.Rand, in Input) (bulk, trimmed Input, whole []*corev1.Pod) {
	bulk, trimmed = in, in
	bulk.Pods, trimmed.Pods = nil, nil
	for _, p := range in.Pods {
		b := bulky(r, p)
		whole = append(whole, b)
		bulk.Pods = append(bulk.Pods, asPod(b))
		tp, err := trim.Transform(b)
		if err != nil {
			panic(err)
		}
		trimmed.Pods = append(trimmed.Pods, tp.(*trim.Pod))
	}
	bulk.Namespaces, trimmed.Namespaces = nil, nil
	for _, n := range in.Namespaces {
		b := n.DeepCopy()
		b.Annotations = map[string]string{"a": "b"}
		b.Status.Phase = corev1.NamespaceActive
		bulk.Namespaces = append(bulk.Namespaces, b)
		trimmed.Namespaces = append(trimmed.Namespaces, trim.Namespace(b))
	}
	return bulk, trimmed, whole
}

// TestDifferentialTrimmed: flock-policy's caches hold trimmed objects
// (package trim). Compiled from them, the program is the one compiled
// from whole objects, and the engine judging from them decides every
// packet it judges as that program does. A field the trim drops that
// the engine or the compiler reads fails here.
func TestDifferentialTrimmed(t *testing.T) {
	s := seed(t)
	worlds, packets := scaled(t, 300), 400
	if testing.Short() {
		worlds = 50
	}
	t.Logf("FLOCK_SEED=%d", s)
	r := rand.New(rand.NewPCG(s, 0x7472696d))
	verdicts := map[bool]int{}
	// Each field the compiler reads, dropped: the corpus must notice each.
	without := map[string]func(*trim.Pod){
		"labels":      func(p *trim.Pod) { p.Labels = nil },
		"nodeName":    func(p *trim.Pod) { p.Spec.NodeName = "" },
		"hostNetwork": func(p *trim.Pod) { p.Spec.HostNetwork = false },
		"ports":       func(p *trim.Pod) { p.Spec.Containers = nil },
		"phase":       func(p *trim.Pod) { p.Status.Phase = "" },
		"podIPs":      func(p *trim.Pod) { p.Status.PodIPs = nil },
	}
	noticed := map[string]int{}
	for wi := range worlds {
		w := newWorld(r)
		bulk, trimmed, _ := trimmedIn(r, w.in)
		prog := Compile(bulk)
		if got := Compile(trimmed); !reflect.DeepEqual(got, prog) {
			t.Fatalf("world %d (FLOCK_SEED=%d): compiled from trimmed objects, the program differs\n%s", wi, s, describe(w))
		}
		for name, drop := range without {
			cut := trimmed
			cut.Pods = nil
			for _, p := range trimmed.Pods {
				q := p.DeepCopyObject().(*trim.Pod)
				drop(q)
				cut.Pods = append(cut.Pods, q)
			}
			if !reflect.DeepEqual(Compile(cut), prog) {
				noticed[name]++
			}
		}
		cut := trimmed
		cut.Namespaces = nil
		for _, n := range trimmed.Namespaces {
			cut.Namespaces = append(cut.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.Name}})
		}
		if !reflect.DeepEqual(Compile(cut), prog) {
			noticed["namespace labels"]++
		}
		tw := *w
		tw.in = trimmed
		ctrl := engine(t, &tw)
		want := judged(t, ctrl)
		if len(want) != len(prog.Selected) {
			t.Fatalf("world %d: the engine over trimmed objects judges %d addresses, the program %d", wi, len(want), len(prog.Selected))
		}
		for a := range want {
			if !prog.Selected[a] {
				t.Fatalf("world %d: the engine over trimmed objects judges %s, the program does not", wi, a)
			}
		}
		for range packets {
			k := randPacket(r, w)
			if !want[k.Src] && !want[k.Dst] {
				continue
			}
			got := prog.Allows(k)
			exp := ctrl.EvaluatePacket(context.Background(), net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), protoNames[k.Proto], int(k.SrcPort), int(k.DstPort))
			verdicts[exp]++
			if got != exp {
				t.Fatalf("world %d (FLOCK_SEED=%d): packet %s → %s proto %d port %d: program of whole objects %v, engine over trimmed %v\n%s",
					wi, s, k.Src, k.Dst, k.Proto, k.DstPort, got, exp, describe(w))
			}
		}
	}
	t.Logf("judged packets: %d allowed, %d dropped; a dropped field changed the program: %v", verdicts[true], verdicts[false], noticed)
	if verdicts[true] < worlds || verdicts[false] < worlds {
		t.Errorf("judged packets: %d allowed, %d dropped; want at least %d of each", verdicts[true], verdicts[false], worlds)
	}
	for _, name := range append(slices.Collect(maps.Keys(without)), "namespace labels") {
		if noticed[name] == 0 {
			t.Errorf("no world tells %s apart: a trim that drops it would pass", name)
		}
	}
}

// TestDifferentialAdminTrimmed: with the admin policies on, the engine
// over trimmed pods, namespaces and nodes decides every packet, queued
// ones included, as it does over whole objects (node selectors read the
// nodes' labels); the program is the same.
func TestDifferentialAdminTrimmed(t *testing.T) {
	s := seed(t)
	worlds, packets := scaled(t, 150), 300
	if testing.Short() {
		worlds = 30
	}
	t.Logf("FLOCK_SEED=%d", s)
	r := rand.New(rand.NewPCG(s, 0x61746d))
	count := map[bool]int{}
	for wi := range worlds {
		w := newAdminWorld(r)
		bulk, trimmed, bulkPods := trimmedIn(r, w.in)
		bworld, tworld := *w.world, *w.world
		bworld.in, tworld.in = bulk, trimmed
		bworld.whole, tworld.whole = bulkPods, nil
		bw, tw := *w, *w
		bw.world, tw.world = &bworld, &tworld
		bw.nodes, tw.nodes = nil, nil
		for _, n := range w.nodes {
			b := n.DeepCopy()
			b.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": "0"}
			b.Status.Images = []corev1.ContainerImage{{Names: []string{"app:1"}, SizeBytes: 1 << 20}}
			b.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
			bw.nodes = append(bw.nodes, b)
			tw.nodes = append(tw.nodes, trim.Node(b))
		}
		if !reflect.DeepEqual(Compile(trimmed), Compile(bulk)) {
			t.Fatalf("world %d (FLOCK_SEED=%d): compiled from trimmed objects, the program differs\n%s%s", wi, s, describe(w.world), describeAdmin(w))
		}
		whole, cut := adminEngine(t, &bw), adminEngine(t, &tw)
		for range packets {
			k := randPacket(r, w.world)
			src, dst, proto := net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), protoNames[k.Proto]
			exp := whole.EvaluatePacket(context.Background(), src, dst, proto, int(k.SrcPort), int(k.DstPort))
			got := cut.EvaluatePacket(context.Background(), src, dst, proto, int(k.SrcPort), int(k.DstPort))
			count[exp]++
			if got != exp {
				t.Fatalf("world %d (FLOCK_SEED=%d, ANP %v, BANP %v): packet %s → %s proto %d port %d: engine over whole objects %v, over trimmed %v\n%s%s",
					wi, s, w.anpOn, w.banpOn, k.Src, k.Dst, k.Proto, k.DstPort, exp, got, describe(w.world), describeAdmin(w))
			}
		}
	}
	t.Logf("packets: %d allowed, %d dropped", count[true], count[false])
	if count[true] < worlds || count[false] < worlds {
		t.Errorf("packets: %d allowed, %d dropped; want at least %d of each", count[true], count[false], worlds)
	}
}
