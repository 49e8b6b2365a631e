package trim

import (
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"
	"weak"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

// fatPod is a pod as a Deployment's ReplicaSet and the kubelet leave it:
// every field flock-policy reads (every field Pod keeps) set to a
// distinctive, non-zero value, and the usual bulk it does not read.
func fatPod() *corev1.Pod {
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 10}
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}}
	env := []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	mounts := []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}, {Name: "kube-api-access-x", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	now := metav1.Now()
	ctrl := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "shop", Name: "web-7d9f8b6c5d-x2x4q", UID: "0b5e6c1a-uid", ResourceVersion: "4711", Generation: 1,
			GenerateName: "web-7d9f8b6c5d-", CreationTimestamp: now,
			Labels: map[string]string{"app": "web", "pod-template-hash": "7d9f8b6c5d", "tier": "front"},
			Annotations: map[string]string{
				pods.MirrorAnnotation:                              "static-uid-1",
				AnycastAnnotation:                                  "2001:db8:a::80",
				"flock.fritzlab.net/addresses":                     "2001:db8:b::1",
				"kubectl.kubernetes.io/restartedAt":                "2026-01-01T00:00:00Z",
				"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"web","image":"registry.example/web:1.2.3"}]}}`,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f8b6c5d", UID: "rs-uid", Controller: &ctrl}},
			Finalizers:      []string{"example.com/cleanup"},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 2048)}},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 1024)}},
			},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-7", HostNetwork: true, ServiceAccountName: "web", SchedulerName: "default-scheduler",
			InitContainers: []corev1.Container{{Name: "init", Image: "registry.example/init:1", Command: []string{"/init"},
				Ports: []corev1.ContainerPort{{Name: "init-port", ContainerPort: 7000, Protocol: corev1.ProtocolTCP}}}},
			Containers: []corev1.Container{
				{Name: "web", Image: "registry.example/web:1.2.3", Args: []string{"--listen=:8080"}, Env: env, Resources: res,
					VolumeMounts: mounts, LivenessProbe: probe, ReadinessProbe: probe,
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP, HostPort: 80, HostIP: "0.0.0.0"},
						{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}}},
				{Name: "sidecar", Image: "registry.example/proxy:9", Env: env, Resources: res, VolumeMounts: mounts},
				{Name: "metrics", Image: "registry.example/exporter:2",
					Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolSCTP}}},
			},
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web"}}}},
				{Name: "kube-api-access-x", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			Affinity:    &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable,
			HostIP: "192.0.2.7", HostIPs: []corev1.HostIP{{IP: "192.0.2.7"}, {IP: "2001:db8::7"}},
			PodIP: "fd00:10::7", PodIPs: []corev1.PodIP{{IP: "fd00:10::7"}, {IP: "198.51.100.7"}},
			StartTime: &now,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Ready: true, RestartCount: 2, Image: "registry.example/web:1.2.3", ImageID: "sha256:abc",
				ContainerID: "containerd://0123456789abcdef", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
		},
	}
}

// What is read survives with its value; what is not is gone.
func TestPodKeepsWhatIsRead(t *testing.T) {
	fat := fatPod()
	orig := fat.DeepCopy()
	p := NewPod(fat)
	if !reflect.DeepEqual(fat, orig) {
		t.Fatal("NewPod changed its argument")
	}
	want := &Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-7d9f8b6c5d-x2x4q", UID: "0b5e6c1a-uid", ResourceVersion: "4711",
			Labels:      orig.Labels,
			Annotations: map[string]string{pods.MirrorAnnotation: "static-uid-1", AnycastAnnotation: "2001:db8:a::80"}},
		Spec: PodSpec{NodeName: "node-7", HostNetwork: true, Containers: []corev1.Container{
			{Name: "web", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}}},
			{Name: "metrics", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolSCTP}}},
		}},
		Status: PodStatus{Phase: corev1.PodRunning, PodIPs: orig.Status.PodIPs},
	}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("trimmed pod:\n got %+v\nwant %+v", p, want)
	}
	// Core is the same pod as a corev1.Pod, and trims to it again.
	core := p.Core()
	if again := NewPod(core); !reflect.DeepEqual(again, p) {
		t.Fatalf("NewPod(Core()): %+v, want %+v", again, p)
	}
	if core.Spec.NodeName != "node-7" || !core.Spec.HostNetwork || core.Status.Phase != corev1.PodRunning ||
		!reflect.DeepEqual(core.Status.PodIPs, orig.Status.PodIPs) || !reflect.DeepEqual(core.Spec.Containers, want.Spec.Containers) ||
		!reflect.DeepEqual(core.ObjectMeta, want.ObjectMeta) {
		t.Fatalf("Core: %+v, want the kept fields of %+v", core, want)
	}
	// The bulk, in protobuf bytes, against what was cached before: the
	// pod without its managed fields.
	old := orig.DeepCopy()
	old.ManagedFields = nil
	before, after := old.Size(), core.Size()
	t.Logf("pod: %d bytes of protobuf (%d with managed fields), %d trimmed", before, orig.Size(), after)
	if after*4 > before {
		t.Errorf("trimmed pod is %d of %d bytes: want at most a quarter", after, before)
	}
}

// Every field Pod has is at the path corev1.Pod has it, with its type:
// readers read a cached pod as they would a pod, and Core and NewPod
// carry each field (TestPodKeepsWhatIsRead sets them all).
func TestPodFieldsAreCorePaths(t *testing.T) {
	var walk func(ours, theirs reflect.Type, path string)
	walk = func(ours, theirs reflect.Type, path string) {
		for i := range ours.NumField() {
			f := ours.Field(i)
			tf, ok := theirs.FieldByName(f.Name)
			switch {
			case !ok:
				t.Errorf("%s.%s: corev1.Pod has no such field", path, f.Name)
			case f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == reflect.TypeFor[Pod]().PkgPath():
				walk(f.Type, tf.Type, path+"."+f.Name)
			case f.Type != tf.Type:
				t.Errorf("%s.%s: %v, corev1.Pod's is %v", path, f.Name, f.Type, tf.Type)
			}
		}
	}
	walk(reflect.TypeFor[Pod](), reflect.TypeFor[corev1.Pod](), "Pod")
}

// Transform makes a cached Pod of a decoded pod, and is idempotent: a
// Pod is returned as it is.
func TestTransformTrimsAPod(t *testing.T) {
	fat := fatPod()
	want := NewPod(fat.DeepCopy())
	got, err := Transform(fat)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Transform's pod:\n got %+v\nwant %+v", got, want)
	}
	if again, _ := Transform(got); again != got {
		t.Fatalf("transforming twice: %p, want the same %p", again, got)
	}
}

// DeepCopyObject copies everything, the shared labels and containers too.
func TestPodDeepCopy(t *testing.T) {
	p := NewPod(fatPod())
	cp := p.DeepCopyObject().(*Pod)
	if !reflect.DeepEqual(cp, p) {
		t.Fatalf("copy %+v, want %+v", cp, p)
	}
	cp.Labels["tier"] = "back"
	cp.Spec.Containers[0].Ports[0].ContainerPort++
	cp.Status.PodIPs[0].IP = "fd00:10::8"
	if p.Labels["tier"] != "front" || p.Spec.Containers[0].Ports[0].ContainerPort != 8080 || p.Status.PodIPs[0].IP != "fd00:10::7" {
		t.Fatalf("changing the copy changed the pod: %+v", p)
	}
}

func TestNamespaceAndNode(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "shop", UID: "ns-uid", ResourceVersion: "9", Labels: map[string]string{"team": "a"},
		Annotations:   map[string]string{"scheduler.alpha.kubernetes.io/node-selector": "x"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}, Finalizers: []string{"f"}}
	keep := metav1.ObjectMeta{Name: "shop", UID: "ns-uid", ResourceVersion: "9", Labels: map[string]string{"team": "a"}}
	ns := &corev1.Namespace{ObjectMeta: meta, Spec: corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{"kubernetes"}}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}
	if got, _ := Transform(ns); !reflect.DeepEqual(got, &corev1.Namespace{ObjectMeta: keep}) {
		t.Errorf("namespace: %+v", got)
	}
	node := &corev1.Node{ObjectMeta: meta, Spec: corev1.NodeSpec{PodCIDR: "10.0.0.0/24"},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"a"}, SizeBytes: 1}}, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady}}}}
	if got, _ := Transform(node); !reflect.DeepEqual(got, &corev1.Node{ObjectMeta: keep}) {
		t.Errorf("node: %+v", got)
	}
	// Other objects lose their managed fields only.
	np := &networkingv1.NetworkPolicy{ObjectMeta: meta, Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	got, err := Transform(np.DeepCopy())
	want := np.DeepCopy()
	want.ManagedFields = nil
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("network policy: %+v, %v", got, err)
	}
	// A tombstone passes unchanged.
	tomb := cache.DeletedFinalStateUnknown{Key: "shop/web", Obj: fatPod()}
	if got, err := Transform(tomb); err != nil || !reflect.DeepEqual(got, tomb) {
		t.Errorf("tombstone: %v, %v", got, err)
	}
}

func TestUnchanged(t *testing.T) {
	base := fatPod()
	noise := map[string]func(p *corev1.Pod){
		"resourceVersion":   func(p *corev1.Pod) { p.ResourceVersion = "4712" },
		"conditions":        func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse },
		"containerStatuses": func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount++ },
		"hostIPs":           func(p *corev1.Pod) { p.Status.HostIPs = nil },
		"podIP":             func(p *corev1.Pod) { p.Status.PodIP = "" },
		"other annotation":  func(p *corev1.Pod) { p.Annotations["kubectl.kubernetes.io/restartedAt"] = "now" },
		"managedFields":     func(p *corev1.Pod) { p.ManagedFields = nil },
		"deletionTimestamp": func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now },
		"image":             func(p *corev1.Pod) { p.Spec.Containers[0].Image = "registry.example/web:1.2.4" },
		"portless container": func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "debug"})
		},
		"hostPort":       func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 0 },
		"init container": func(p *corev1.Pod) { p.Spec.InitContainers = nil },
	}
	for name, f := range noise {
		cur := base.DeepCopy()
		f(cur)
		if !Unchanged(base, cur) || !Unchanged(NewPod(base), NewPod(cur)) {
			t.Errorf("%s: an update of nothing read counts as a change", name)
		}
	}
	// No labels read alike, however encoded.
	noLabels, emptyLabels := base.DeepCopy(), base.DeepCopy()
	noLabels.Labels, emptyLabels.Labels = nil, map[string]string{}
	if !Unchanged(noLabels, emptyLabels) {
		t.Error("nil and empty labels count as a change")
	}
	read := map[string]func(p *corev1.Pod){
		"name":               func(p *corev1.Pod) { p.Name = "other" },
		"namespace":          func(p *corev1.Pod) { p.Namespace = "other" },
		"uid":                func(p *corev1.Pod) { p.UID = "new-incarnation" },
		"label":              func(p *corev1.Pod) { p.Labels["tier"] = "back" },
		"label removed":      func(p *corev1.Pod) { delete(p.Labels, "tier") },
		"mirror annotation":  func(p *corev1.Pod) { delete(p.Annotations, pods.MirrorAnnotation) },
		"anycast annotation": func(p *corev1.Pod) { p.Annotations[AnycastAnnotation] = "2001:db8:a::81" },
		"nodeName":           func(p *corev1.Pod) { p.Spec.NodeName = "node-8" },
		"hostNetwork":        func(p *corev1.Pod) { p.Spec.HostNetwork = false },
		"port name":          func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].Name = "https" },
		"port number":        func(p *corev1.Pod) { p.Spec.Containers[2].Ports[0].ContainerPort = 9091 },
		"port protocol":      func(p *corev1.Pod) { p.Spec.Containers[0].Ports[1].Protocol = corev1.ProtocolTCP },
		"port added":         func(p *corev1.Pod) { p.Spec.Containers[1].Ports = []corev1.ContainerPort{{ContainerPort: 15001}} },
		"phase":              func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded },
		"podIPs":             func(p *corev1.Pod) { p.Status.PodIPs = p.Status.PodIPs[:1] },
		"podIPs cleared":     func(p *corev1.Pod) { p.Status.PodIPs = nil },
	}
	for name, f := range read {
		cur := base.DeepCopy()
		f(cur)
		if Unchanged(base, cur) || Unchanged(NewPod(base), NewPod(cur)) {
			t.Errorf("%s: a change of what is read counts as none", name)
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "1", Labels: map[string]string{"team": "x"}}}
	nsStatus := ns.DeepCopy()
	nsStatus.ResourceVersion, nsStatus.Annotations, nsStatus.Status.Phase = "2", map[string]string{"a": "b"}, corev1.NamespaceTerminating
	if !Unchanged(ns, nsStatus) {
		t.Error("namespace: an update of nothing read counts as a change")
	}
	nsLabel := ns.DeepCopy()
	nsLabel.Labels["team"] = "y"
	if Unchanged(ns, nsLabel) {
		t.Error("namespace: a label change counts as none")
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "1", Labels: map[string]string{"zone": "a"}}}
	nodeStatus := node.DeepCopy()
	nodeStatus.ResourceVersion, nodeStatus.Status.Conditions = "2", []corev1.NodeCondition{{Type: corev1.NodeReady}}
	nodeLabel := node.DeepCopy()
	nodeLabel.Labels["zone"] = "b"
	if !Unchanged(node, nodeStatus) || Unchanged(node, nodeLabel) {
		t.Error("node: a status update is a change, or a label change is none")
	}
	// Other types, and mixed ones, always count as changes.
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np"}}
	if Unchanged(np, np) || Unchanged(base, ns) || Unchanged(nil, base) {
		t.Error("an object of another type, or a type change, counts as unchanged")
	}
}

// heapPerPod is the heap a cached pod holds, decoded from protobuf as
// the informer gets it and passed through transform.
func heapPerPod(t *testing.T, transform func(*corev1.Pod) any) float64 {
	raw, err := fatPod().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	keep := make([]any, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range keep {
		var p corev1.Pod
		if err := p.Unmarshal(raw); err != nil {
			t.Fatal(err)
		}
		keep[i] = transform(&p)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(keep)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
}

// The cache holds a fraction of what it held with managed fields
// dropped only, and well under what a corev1.Pod trimmed to the same
// fields holds (its spec and status structs are inline: 1,240 bytes).
func TestCachedPodHeap(t *testing.T) {
	old := heapPerPod(t, func(p *corev1.Pod) any { p.ManagedFields = nil; return p })
	trimmedCore := heapPerPod(t, func(p *corev1.Pod) any { return Trimmed(p) })
	cached := heapPerPod(t, func(p *corev1.Pod) any { return NewPod(p) })
	t.Logf("heap per cached pod: %.0f bytes with managed fields dropped, %.0f as a trimmed corev1.Pod, %.0f as a Pod", old, trimmedCore, cached)
	if cached*3 > old {
		t.Errorf("a cached pod holds %.0f bytes, one without managed fields %.0f: want at most a third", cached, old)
	}
	if cached*2 > trimmedCore {
		t.Errorf("a cached pod holds %.0f bytes, a trimmed corev1.Pod %.0f: want at most half", cached, trimmedCore)
	}
}

// BenchmarkUnchanged is the price of the check every pod update of the
// cluster pays (as cached), against a compile it may save.
func BenchmarkUnchanged(b *testing.B) {
	old := NewPod(fatPod())
	cur := NewPod(fatPod())
	cur.ResourceVersion = "4712"
	b.ReportAllocs()
	for b.Loop() {
		if !Unchanged(old, cur) {
			b.Fatal("changed")
		}
	}
}

// step is one step of a path into an object: a struct field, a slice
// element (i < 0: the slice shortened), a map entry (i < 0: deleted).
type step struct {
	kind reflect.Kind
	i    int
	key  reflect.Value
}

// leafPaths lists the paths to v's non-zero leaves (strings, bools,
// integers, map entries), and to its slices shortened.
func leafPaths(v reflect.Value, path []step, out *[][]step) {
	at := func(s step) []step { return append(slices.Clone(path), s) }
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			leafPaths(v.Elem(), at(step{kind: reflect.Pointer}), out)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				leafPaths(v.Field(i), at(step{kind: reflect.Struct, i: i}), out)
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			leafPaths(v.Index(i), at(step{kind: reflect.Slice, i: i}), out)
		}
		if v.Len() > 0 {
			*out = append(*out, at(step{kind: reflect.Slice, i: -1}))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			*out = append(*out, at(step{kind: reflect.Map, key: k}), at(step{kind: reflect.Map, key: k, i: -1}))
		}
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int32, reflect.Int64:
		if !v.IsZero() {
			*out = append(*out, path)
		}
	}
}

// change makes a different value of a leaf.
func change(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "'")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	default:
		v.SetInt(v.Int() + 1)
	}
}

// mutate changes what path leads to in the object ptr points to.
func mutate(ptr reflect.Value, path []step) string {
	v, name := ptr, ""
	for _, s := range path {
		switch s.kind {
		case reflect.Pointer:
			v = v.Elem()
		case reflect.Struct:
			name += "." + v.Type().Field(s.i).Name
			v = v.Field(s.i)
		case reflect.Slice:
			if s.i < 0 {
				v.Set(v.Slice(0, v.Len()-1))
				return name + " shortened"
			}
			name += fmt.Sprintf("[%d]", s.i)
			v = v.Index(s.i)
		case reflect.Map:
			name += fmt.Sprintf("[%v]", s.key)
			if s.i < 0 {
				v.SetMapIndex(s.key, reflect.Value{})
				return name + " deleted"
			}
			nv := reflect.New(v.Type().Elem()).Elem()
			nv.Set(v.MapIndex(s.key))
			change(nv)
			v.SetMapIndex(s.key, nv)
			return name
		}
	}
	change(v)
	return name
}

// Whatever Pod, Namespace and Node keep, Unchanged compares: a change of
// any leaf of a trimmed object but its resourceVersion is a change. (A
// field added to the trim and not to Unchanged fails here, if fatPod
// sets it.)
func TestUnchangedComparesAllKept(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "n", UID: "uid", ResourceVersion: "1", Labels: map[string]string{"a": "b", "c": "d"}}
	for _, obj := range []k8sruntime.Object{
		NewPod(fatPod()), Namespace(&corev1.Namespace{ObjectMeta: meta}), Node(&corev1.Node{ObjectMeta: meta}),
	} {
		var paths [][]step
		leafPaths(reflect.ValueOf(obj), nil, &paths)
		n := 0
		for _, path := range paths {
			cp := obj.DeepCopyObject()
			name := mutate(reflect.ValueOf(cp), path)
			if name == ".ObjectMeta.ResourceVersion" {
				if !Unchanged(obj, cp) {
					t.Errorf("%T: a new resourceVersion alone is a change", obj)
				}
				continue
			}
			n++
			if Unchanged(obj, cp) {
				t.Errorf("%T: %s changed, and Unchanged says it is not", obj, name)
			}
		}
		t.Logf("%T: %d changes of kept fields, each noticed", obj, n)
	}
}

// The replicas of a workload share their trimmed containers; pods whose
// ports differ in any kept field do not; and once no pod holds them,
// they are forgotten.
func TestContainersShared(t *testing.T) {
	a, b := NewPod(fatPod()), NewPod(fatPod())
	if len(a.Spec.Containers) == 0 || &a.Spec.Containers[0] != &b.Spec.Containers[0] {
		t.Fatal("two replicas' trimmed containers are not one slice")
	}
	if !reflect.DeepEqual(a.Spec.Containers, b.Spec.Containers) || len(a.Spec.Containers) != len(b.Spec.Containers) {
		t.Fatal("shared containers differ")
	}
	for name, change := range map[string]func(p *corev1.Pod){
		"a port's number":    func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort++ },
		"a port's name":      func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].Name += "x" },
		"a port's protocol":  func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].Protocol = corev1.ProtocolUDP },
		"a container's name": func(p *corev1.Pod) { p.Spec.Containers[0].Name += "x" },
		"a port more": func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: 1})
		},
		"names that run into": func(p *corev1.Pod) {
			p.Spec.Containers[0].Name, p.Spec.Containers[0].Ports[0].Name = p.Spec.Containers[0].Name+"1", "1"+p.Spec.Containers[0].Ports[0].Name
		},
	} {
		p := fatPod()
		change(p)
		c := NewPod(p)
		if &c.Spec.Containers[0] == &a.Spec.Containers[0] {
			t.Errorf("%s changed: the containers are still shared", name)
		}
		if got, want := c.Spec.Containers[0].Ports, p.Spec.Containers[0].Ports; len(got) != len(want) || got[0].Name != want[0].Name || got[0].ContainerPort != want[0].ContainerPort || got[0].Protocol != want[0].Protocol {
			t.Errorf("%s changed: trimmed ports %v, pod's %v", name, got, want)
		}
	}
	key := func() int {
		shared.Lock()
		defer shared.Unlock()
		return len(shared.m)
	}
	held := key()
	a, b = nil, nil
	for range 100 {
		runtime.GC()
		if key() < held {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("no pod holds the containers any more, and %d are remembered (were %d)", key(), held)
}

// Pods with the same labels share one map, equal to theirs; other labels
// another; and what is remembered is bounded: pods whose labels are their
// own (a StatefulSet's) leave at most two generations behind.
func TestLabelsShared(t *testing.T) {
	a, b := NewPod(fatPod()), NewPod(fatPod())
	if reflect.ValueOf(a.Labels).UnsafePointer() != reflect.ValueOf(b.Labels).UnsafePointer() || !reflect.DeepEqual(a.Labels, fatPod().Labels) {
		t.Fatalf("two replicas' labels: not one map equal to theirs (%v, %v)", a.Labels, b.Labels)
	}
	p := fatPod()
	p.Labels["tier"] = "back"
	if c := NewPod(p); reflect.ValueOf(c.Labels).UnsafePointer() == reflect.ValueOf(a.Labels).UnsafePointer() || !reflect.DeepEqual(c.Labels, p.Labels) {
		t.Fatalf("other labels: %v shared, or not the pod's", c.Labels)
	}
	p.Labels = nil
	if c := NewPod(p); c.Labels != nil {
		t.Fatalf("no labels: %v", c.Labels)
	}
	rememberedBounded(t, "labels", labelGeneration, func(i int) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"statefulset.kubernetes.io/pod-name": fmt.Sprintf("web-%d", i)}}}
	}, func() int {
		labels.Lock()
		defer labels.Unlock()
		return len(labels.cur) + len(labels.old)
	})
}

// rememberedBounded trims 3 generations of pods, each with its own
// (pod(i)), and checks at most two generations are remembered.
func rememberedBounded(t *testing.T, what string, generation int, pod func(i int) *corev1.Pod, remembered func() int) {
	t.Helper()
	for i := range 3 * generation {
		NewPod(pod(i))
	}
	if n := remembered(); n > 2*generation {
		t.Errorf("%d %s remembered after %d pods of their own: want at most %d", n, what, 3*generation, 2*generation)
	}
}

// A hash collision never shares another pod's labels or containers: what
// is remembered under the hash is checked against what is asked for.
func TestSharingSurvivesCollisions(t *testing.T) {
	p := fatPod()
	other := map[string]string{"app": "someone-else"}
	labels.Lock()
	labels.cur[labelsKey(p.Labels)] = other
	labels.Unlock()
	if got := NewPod(p).Labels; !reflect.DeepEqual(got, p.Labels) {
		t.Errorf("labels %v under a colliding hash: got %v, want the pod's", other, got)
	}
	theirs := []corev1.Container{{Name: "other", Ports: []corev1.ContainerPort{{Name: "x", ContainerPort: 1, Protocol: corev1.ProtocolUDP}}}}
	key, _ := containersKey(p.Spec.Containers)
	shared.Lock()
	shared.m[key] = sharedContainers{weak.Make(&theirs[0]), len(theirs)}
	shared.Unlock()
	got := NewPod(p).Spec.Containers
	if !sameContainers(got, p.Spec.Containers) || &got[0] == &theirs[0] {
		t.Errorf("containers %v under a colliding hash: got %v, want the pod's %v", theirs, got, p.Spec.Containers)
	}
	runtime.KeepAlive(theirs)
}

// BenchmarkTrim is what every pod change of the cluster pays to be
// trimmed, for a replica of a workload already seen.
func BenchmarkTrim(b *testing.B) {
	src := fatPod()
	NewPod(src)
	b.ReportAllocs()
	for b.Loop() {
		NewPod(src)
	}
}

func TestShortUID(t *testing.T) {
	const uid = "0b5e6c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b"
	short := ShortUID(uid)
	if short != "0b5e6c1a" {
		t.Fatalf("ShortUID(%s) = %s", uid, short)
	}
	for _, c := range []struct {
		uid, held types.UID
		same      bool
	}{
		{uid, uid, true},
		{uid, short, true},
		{uid, "0b5e6c1b", false},
		{uid, "0b5e6c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5c", false},
		{uid, "", false},
		{uid, "0b5e6c1", false}, // not ShortUID's: too short
		{"short", "short", true},
		{"short", ShortUID("short"), true},
		{"0b5e6c1a", "0b5e6c1a", true},
	} {
		if got := SameUID(c.uid, c.held); got != c.same {
			t.Errorf("SameUID(%q, %q) = %t, want %t", c.uid, c.held, got, c.same)
		}
	}
}

// A namespace's and a node's names are one copy across pods, decoded or
// trimmed, and stay one across collections (unique.Make's did not: each
// collection freed them, and later pods got copies of their own). What is
// remembered of names gone is bounded.
func TestNamesShared(t *testing.T) {
	at := func(s string) *byte { return unsafe.StringData(s) }
	a := NewPod(fatPod())
	b, err := fatPod().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.GC()
	d, err := DecodePod(b)
	if err != nil {
		t.Fatal(err)
	}
	c := NewPod(fatPod())
	for _, p := range []*Pod{c, d} {
		if at(p.Namespace) != at(a.Namespace) || at(p.Spec.NodeName) != at(a.Spec.NodeName) {
			t.Fatalf("namespace %q and node %q: another copy after a collection", p.Namespace, p.Spec.NodeName)
		}
	}
	if p := fatPod(); a.Namespace != p.Namespace || a.Spec.NodeName != p.Spec.NodeName {
		t.Fatalf("names %q, %q: want the pod's %q, %q", a.Namespace, a.Spec.NodeName, p.Namespace, p.Spec.NodeName)
	}
	if p := NewPod(&corev1.Pod{}); p.Namespace != "" || p.Spec.NodeName != "" {
		t.Fatalf("no names: %q, %q", p.Namespace, p.Spec.NodeName)
	}
	rememberedBounded(t, "names", nameGeneration, func(i int) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", i)}}
	}, func() int {
		names.Lock()
		defer names.Unlock()
		return len(names.cur) + len(names.old)
	})
}

// name never returns, nor keeps as a key, a view of the caller's buffer
// (DecodePod's, reused), in either generation, and a name asked for in
// each generation keeps its one copy.
func TestNameNeverAView(t *testing.T) {
	names.Lock() // a known start: the rotation comes at the G-th ask
	names.asked, names.cur, names.old = 0, map[string]string{}, nil
	names.Unlock()
	buf := []byte("review-ns-xyz")
	view := unsafe.String(unsafe.SliceData(buf), len(buf))
	got := []string{name(view)} // a miss: cloned
	for range nameGeneration {  // asks 2..G+1: one rotation (at G), the name is in old
		name("review-other")
	}
	got = append(got, name(view)) // found in old: old's copy, moved to cur
	got = append(got, name(view)) // found in cur
	copy(buf, "XXXXXXXXXXXXX")
	for i, s := range got {
		if s != "review-ns-xyz" || unsafe.StringData(s) == unsafe.SliceData(buf) {
			t.Fatalf("ask %d: %q, a view of the buffer", i, s)
		}
	}
	if unsafe.StringData(got[0]) != unsafe.StringData(got[1]) || unsafe.StringData(got[1]) != unsafe.StringData(got[2]) {
		t.Fatal("a name asked in each generation got a new copy")
	}
	names.Lock()
	for k := range names.cur {
		if unsafe.StringData(k) == unsafe.SliceData(buf) {
			t.Fatal("a map key is a view of the buffer")
		}
	}
	names.Unlock()
}
