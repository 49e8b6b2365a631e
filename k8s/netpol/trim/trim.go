// Package trim cuts the objects flock-policy caches down to what it reads.
// It watches every pod of the cluster: kept whole, they are most of its
// memory, and most of their updates (the kubelet's conditions and
// container statuses) change nothing it reads. Transform is the
// informers' transform, which caches a pod as a Pod (a type of its own,
// a third of a corev1.Pod's size); Unchanged tells the event handlers
// which updates they may ignore.
//
// What is kept is what the readers read, and nothing else:
//   - the engine (third_party/kube-network-policies): a pod's namespace,
//     name, labels, spec.nodeName, spec.hostNetwork, the ports of
//     spec.containers (name, containerPort, protocol), status.phase and
//     status.podIPs; a namespace's and a node's name and labels;
//   - the compiler (k8s/netpol/verdicts) and the view (k8s/netpol): the
//     same;
//   - the ExtraIPs tracker (agent/policyips): a pod's UID (whole for this
//     node's pods; of other nodes' pods the relays send the first
//     characters, ShortUID, which SameUID matches) and the annotations
//     kubernetes.io/config.mirror (pods.ID) and flock.fritzlab.net/anycast.
//
// A reader that needs another field of a pod must add it to Pod: one it
// does not have does not compile. The engine reads corev1.Pods made from
// cached ones (Pod.Core); the differential tests (verdicts, policyips)
// run the readers over trimmed objects too.
package trim

import (
	"hash/maphash"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
	"weak"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/listers"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

// AnycastAnnotation is agent/annotations.Anycast, which k8s packages may
// not import (imports point down); agent/policyips tests they agree.
const AnycastAnnotation = "flock.fritzlab.net/anycast"

// keptAnnotations are the only annotations read: the tracker's, and the
// one that marks the bookmark ending a watch's initial events (a bookmark
// is a pod, which DecodePod decodes as any other).
var keptAnnotations = []string{pods.MirrorAnnotation, AnycastAnnotation, metav1.InitialEventsAnnotationKey}

// Pod is a pod as flock-policy caches it: what it reads, and nothing
// else. A corev1.Pod is 1,240 bytes before any of its strings, maps and
// slices (its spec and status structs are inline); this is under 350, and
// it is one for each pod of the cluster. Its fields have the paths
// corev1.Pod gives them (p.Spec.NodeName, p.Status.PodIPs), so readers
// read it as they would a pod. Cached pods are shared: never change one.
type Pod struct {
	metav1.ObjectMeta
	Spec   PodSpec
	Status PodStatus
}

// PodSpec is what is kept of a pod's spec.
type PodSpec struct {
	NodeName    string
	HostNetwork bool
	// Containers are the containers with ports, their names and ports
	// alone (name, containerPort, protocol).
	Containers []corev1.Container
}

// PodStatus is what is kept of a pod's status.
type PodStatus struct {
	Phase  corev1.PodPhase
	PodIPs []corev1.PodIP
}

// GetObjectKind: a cached pod is a runtime.Object (client-go's stores and
// tombstones carry runtime.Objects); it has no kind of its own.
func (p *Pod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies p (its shared labels and containers too).
func (p *Pod) DeepCopyObject() k8sruntime.Object {
	if p == nil {
		return nil
	}
	out := &Pod{Spec: p.Spec, Status: p.Status}
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if p.Spec.Containers != nil {
		out.Spec.Containers = make([]corev1.Container, len(p.Spec.Containers))
		for i := range p.Spec.Containers {
			p.Spec.Containers[i].DeepCopyInto(&out.Spec.Containers[i])
		}
	}
	out.Status.PodIPs = slices.Clone(p.Status.PodIPs)
	return out
}

// Core is p as a corev1.Pod, for readers that take one (the engine): it
// shares p's labels, annotations, containers and IPs, which the reader
// must not change.
func (p *Pod) Core() *corev1.Pod {
	if p == nil {
		return nil
	}
	return &corev1.Pod{ObjectMeta: p.ObjectMeta,
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork, Containers: p.Spec.Containers},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIPs: p.Status.PodIPs}}
}

// NewPod is p with only what flock-policy reads (p is not changed; the
// result shares p's pod IPs, and its labels and containers with pods
// that have the same). Containers without ports are left out: only ports
// are read of them.
func NewPod(p *corev1.Pod) *Pod {
	out := &Pod{ObjectMeta: meta(&p.ObjectMeta)}
	out.Namespace = name(p.Namespace)
	out.Labels = sharedLabels(p.Labels, false)
	for _, k := range keptAnnotations {
		if v, ok := p.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = make(map[string]string, len(keptAnnotations))
			}
			out.Annotations[k] = v
		}
	}
	out.Spec.NodeName = name(p.Spec.NodeName)
	out.Spec.HostNetwork = p.Spec.HostNetwork
	out.Spec.Containers = containers(p.Spec.Containers)
	out.Status.Phase = p.Status.Phase
	if len(p.Status.PodIPs) > 0 {
		out.Status.PodIPs = p.Status.PodIPs
	}
	return out
}

// Trimmed is NewPod's pod as a corev1.Pod (the relays serve these).
func Trimmed(p *corev1.Pod) *corev1.Pod { return NewPod(p).Core() }

// containers are cs's containers with ports, their names and ports
// alone; nil if none has a port. The replicas of a workload have the
// same ones: they share one slice (as long as one of them holds it), a
// third of what a cached pod held. Cached objects are never changed, so
// sharing is safe (a caller that changes one copies it first, as
// client-go asks). They are found by a hash of what they hold, checked
// against it: every pod change of the cluster comes through here, and
// one that finds its containers allocates nothing.
func containers(cs []corev1.Container) []corev1.Container {
	key, n := containersKey(cs)
	if n == 0 {
		return nil
	}
	shared.Lock()
	defer shared.Unlock()
	if e, ok := shared.m[key]; ok {
		if first := e.first.Value(); first != nil {
			if have := unsafe.Slice(first, e.n); sameContainers(have, cs) {
				return have
			}
		}
	}
	out := make([]corev1.Container, 0, n)
	for i := range cs {
		c := &cs[i]
		if len(c.Ports) == 0 {
			continue
		}
		// Copied: cs may be DecodePod's views of a buffer.
		ports := make([]corev1.ContainerPort, len(c.Ports))
		for j, cp := range c.Ports {
			ports[j] = corev1.ContainerPort{Name: strings.Clone(cp.Name), ContainerPort: cp.ContainerPort, Protocol: corev1.Protocol(strings.Clone(string(cp.Protocol)))}
		}
		out = append(out, corev1.Container{Name: strings.Clone(c.Name), Ports: ports})
	}
	// A collision replaces the one remembered; the pods holding it keep it.
	shared.m[key] = sharedContainers{weak.Make(&out[0]), n}
	// Forgotten once no pod holds them.
	runtime.AddCleanup(&out[0], func(key uint64) {
		shared.Lock()
		defer shared.Unlock()
		if e, ok := shared.m[key]; ok && e.first.Value() == nil {
			delete(shared.m, key)
		}
	}, key)
	return out
}

// containersKey is the hash of cs's containers with ports, and their number.
func containersKey(cs []corev1.Container) (uint64, int) {
	h := maphash.Hash{}
	h.SetSeed(seed)
	n := 0
	for i := range cs {
		if len(cs[i].Ports) == 0 {
			continue
		}
		n++
		writeField(&h, cs[i].Name)
		for _, cp := range cs[i].Ports {
			writeField(&h, cp.Name)
			writeField(&h, string(cp.Protocol))
			maphash.WriteComparable(&h, cp.ContainerPort)
		}
		h.WriteByte('\n')
	}
	return h.Sum64(), n
}

// sameContainers: a and b have the same containers with ports, in order,
// with the same names and ports (their name, number and protocol).
func sameContainers(a, b []corev1.Container) bool {
	for {
		for len(a) > 0 && len(a[0].Ports) == 0 {
			a = a[1:]
		}
		for len(b) > 0 && len(b[0].Ports) == 0 {
			b = b[1:]
		}
		if len(a) == 0 || len(b) == 0 {
			return len(a) == len(b)
		}
		if a[0].Name != b[0].Name || !slices.EqualFunc(a[0].Ports, b[0].Ports, func(x, y corev1.ContainerPort) bool {
			return x.Name == y.Name && x.ContainerPort == y.ContainerPort && x.Protocol == y.Protocol
		}) {
			return false
		}
		a, b = a[1:], b[1:]
	}
}

// sharedLabels is a map equal to l, the one given for equal labels
// lately: the replicas of a workload share one (with its strings), a
// third of what a cached pod held. Maps cannot be held weakly, so what is
// remembered is what was asked for in the last two generations of
// labelGeneration asks; a map forgotten stays shared by the pods that
// hold it. nil for no labels. Labels are found as containers are, by a
// hash checked against them. views: l's strings are views of a buffer
// (DecodePod's), copied if l is kept.
func sharedLabels(l map[string]string, views bool) map[string]string {
	if len(l) == 0 {
		return nil
	}
	key := labelsKey(l)
	labels.Lock()
	defer labels.Unlock()
	if labels.asked++; labels.asked%labelGeneration == 0 {
		labels.old, labels.cur = labels.cur, make(map[uint64]map[string]string, len(labels.cur))
	}
	if m, ok := labels.cur[key]; ok && maps.Equal(m, l) {
		return m
	}
	m, ok := labels.old[key]
	switch {
	case ok && maps.Equal(m, l):
	case views:
		m = make(map[string]string, len(l))
		for k, v := range l {
			m[strings.Clone(k)] = strings.Clone(v)
		}
	default:
		m = maps.Clone(l) // a collision replaces the one remembered
	}
	labels.cur[key] = m
	return m
}

// labelsKey is the hash of l: the sum of its pairs' (a map has no order).
func labelsKey(l map[string]string) uint64 {
	var key uint64
	h := maphash.Hash{}
	h.SetSeed(seed)
	for k, v := range l {
		h.Reset()
		writeField(&h, k)
		writeField(&h, v)
		key += h.Sum64()
	}
	return key
}

// labelGeneration is how many pods a generation of remembered labels
// lasts. It bounds what is remembered of pods gone (pods whose labels are
// their own, as a StatefulSet's are, share nothing), and a workload's
// labels stay remembered while one of its pods is asked for in each.
const labelGeneration = 1 << 15

var labels = struct {
	sync.Mutex
	asked    uint64
	cur, old map[uint64]map[string]string
}{cur: map[uint64]map[string]string{}}

// name is s, the copy of it given lately (s may be a view of a buffer:
// what is kept is a copy). A cluster's pods are in few namespaces and on
// few nodes: one copy of each name, which also lets the compiler tell a
// namespace by where its name is. The copies are held as labels are, for
// two generations of nameGeneration asks: unique.Make held them weakly,
// by a box no pod holds, so every collection forgot them and the next
// pods made them again, a new copy each time (under churn, with a
// collection every few seconds, a tenth of flock-policy's CPU).
func name(s string) string {
	if s == "" {
		return ""
	}
	names.Lock()
	defer names.Unlock()
	if names.asked++; names.asked%nameGeneration == 0 {
		names.old, names.cur = names.cur, make(map[string]string, len(names.cur))
	}
	if c, ok := names.cur[s]; ok {
		return c
	}
	c, ok := names.old[s]
	if !ok {
		c = strings.Clone(s)
	}
	names.cur[c] = c
	return c
}

// nameGeneration is how many names a generation lasts (two a pod): it
// bounds what is remembered of namespaces and nodes gone.
const nameGeneration = 1 << 17

var names = struct {
	sync.Mutex
	asked    uint64
	cur, old map[string]string
}{cur: map[string]string{}}

// shared are the containers pods hold, by the hash of what they hold:
// weakly, by the first of them (a slice's array lives as long as a
// pointer into it).
var shared = struct {
	sync.Mutex
	m map[uint64]sharedContainers
}{m: map[uint64]sharedContainers{}}

type sharedContainers struct {
	first weak.Pointer[corev1.Container]
	n     int
}

// seed is the hashes' seed.
var seed = maphash.MakeSeed()

// writeField writes s, length first (a name may hold any byte).
func writeField(h *maphash.Hash, s string) {
	maphash.WriteComparable(h, len(s))
	h.WriteString(s)
}

// Namespace is n's name, UID, resourceVersion and labels.
func Namespace(n *corev1.Namespace) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: meta(&n.ObjectMeta)}
}

// Node is n's name, UID, resourceVersion and labels (the admin policies'
// node selectors).
func Node(n *corev1.Node) *corev1.Node {
	return &corev1.Node{ObjectMeta: meta(&n.ObjectMeta)}
}

// meta keeps the identity, the resourceVersion (the informer's and the
// compiler's), and the labels.
func meta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	out := metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
	if len(m.Labels) > 0 {
		out.Labels = m.Labels
	}
	return out
}

// Transform is the informers' transform: a pod becomes a *Pod,
// namespaces and nodes are trimmed, any other object loses its managed
// fields (often its largest part), which nothing reads. It is idempotent,
// as client-go asks. Every pod change of the cluster comes through here.
func Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return NewPod(o), nil
	case *Pod:
		return o, nil
	case *corev1.Namespace:
		return Namespace(o), nil
	case *corev1.Node:
		return Node(o), nil
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// Unchanged reports whether an update of a pod, namespace or node from
// old to cur changes nothing flock-policy reads: their trimmed forms
// differ at most in resourceVersion. The kubelet's status updates
// (conditions, container statuses) are such updates, and so is every
// object of a relist. Objects of other types are never unchanged. It
// compares the fields Pod, Namespace and Node keep, in place: every pod
// update of the cluster pays for it.
func Unchanged(old, cur any) bool {
	switch o := old.(type) {
	case *Pod:
		c, ok := cur.(*Pod)
		return ok && samePod(&o.ObjectMeta, &c.ObjectMeta, podKept{o.Spec, o.Status.Phase, o.Status.PodIPs}, podKept{c.Spec, c.Status.Phase, c.Status.PodIPs})
	case *corev1.Pod:
		c, ok := cur.(*corev1.Pod)
		return ok && samePod(&o.ObjectMeta, &c.ObjectMeta, keptOf(o), keptOf(c))
	case *corev1.Namespace:
		c, ok := cur.(*corev1.Namespace)
		return ok && sameMeta(&o.ObjectMeta, &c.ObjectMeta)
	case *corev1.Node:
		c, ok := cur.(*corev1.Node)
		return ok && sameMeta(&o.ObjectMeta, &c.ObjectMeta)
	}
	return false
}

// sameMeta compares what meta keeps but the resourceVersion.
func sameMeta(a, b *metav1.ObjectMeta) bool {
	return a.Name == b.Name && a.Namespace == b.Namespace && a.UID == b.UID && maps.Equal(a.Labels, b.Labels)
}

// podKept is what Pod keeps of a spec and status, read in place.
type podKept struct {
	spec   PodSpec
	phase  corev1.PodPhase
	podIPs []corev1.PodIP
}

func keptOf(p *corev1.Pod) podKept {
	return podKept{PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork, Containers: p.Spec.Containers}, p.Status.Phase, p.Status.PodIPs}
}

// samePod compares what Pod keeps but the resourceVersion.
func samePod(a, b *metav1.ObjectMeta, ka, kb podKept) bool {
	if !sameMeta(a, b) || ka.spec.NodeName != kb.spec.NodeName || ka.spec.HostNetwork != kb.spec.HostNetwork ||
		ka.phase != kb.phase || !slices.Equal(ka.podIPs, kb.podIPs) {
		return false
	}
	for _, k := range keptAnnotations {
		va, oka := a.Annotations[k]
		vb, okb := b.Annotations[k]
		if va != vb || oka != okb {
			return false
		}
	}
	return sameContainers(ka.spec.Containers, kb.spec.Containers)
}

// PodLister reads a pod cache whose transform is Transform: its pods are
// *Pod (client-go's generated pod lister would fail on them).
type PodLister struct{ listers.ResourceIndexer[*Pod] }

// NewPodLister reads indexer, which has client-go's namespace index (an
// informer factory's informers have it).
func NewPodLister(indexer cache.Indexer) PodLister {
	return PodLister{listers.New[*Pod](indexer, corev1.Resource("pods"))}
}

// Pods reads namespace's pods.
func (l PodLister) Pods(namespace string) listers.ResourceIndexer[*Pod] {
	return listers.NewNamespaced(l.ResourceIndexer, namespace)
}

// shortUID is how many characters of a pod's UID the relays send other
// nodes than the pod's: a UID is random (a UUID), and whole it was half
// the bytes of a pod's event after compression, which every node is
// sent; 8 hex digits still tell two incarnations of a pod apart, but for
// one pair in 4 billion.
const shortUID = 8

// ShortUID is uid as the relays send it to other nodes than the pod's.
func ShortUID(uid types.UID) types.UID {
	if len(uid) > shortUID {
		return uid[:shortUID]
	}
	return uid
}

// SameUID reports whether held, a pod's UID as flock-policy holds it
// (whole, or ShortUID's from a relay), is uid.
func SameUID(uid, held types.UID) bool {
	return uid == held || len(held) == shortUID && len(uid) > shortUID && uid[:shortUID] == held
}
