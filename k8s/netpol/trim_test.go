package netpol

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// bulkyPod is a running pod with what the kubelet and controllers add
// besides what flock-policy reads.
func bulkyPod(ns, name string) *corev1.Pod {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{}}`)}}}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "web"},
		Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "then", "flock.fritzlab.net/anycast": "2001:db8:a::1"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "rs"}},
		ManagedFields:   mf}}
	p.Spec.NodeName = "node-a"
	p.Spec.Containers = []corev1.Container{{Name: "web", Image: "web:1", Env: []corev1.EnvVar{{Name: "A", Value: "b"}},
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}, {Name: "sidecar", Image: "proxy:1"}}
	p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIPs = []corev1.PodIP{{IP: "fd00:10::1"}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", Ready: true}}
	return p
}

// The caches Run builds hold trimmed objects: the engine's own transform
// (managed fields only) does not replace flock's on the pod informer, and
// the engine's form of the cached pod (enginePods) holds no more.
func TestCachesTrimmed(t *testing.T) {
	pod := bulkyPod("shop", "web")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"a": "b"}},
		Spec: corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{"kubernetes"}}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"zone": "z"}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"web:1"}, SizeBytes: 1 << 20}}}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "deny", ManagedFields: pod.ManagedFields},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	client := copyingClient(pod, ns, node, np)
	factory := newFactory(client, nil)
	nodes := factory.Core().V1().Nodes()
	nodes.Informer() // the engine asks for it only with the admin policies on
	// PodsByIP as Run sets it: without it the engine would index the pod
	// cache, which holds *trim.Pod (enginePods refuses).
	if _, err := newController(client, factory, nodes, nil, nil, nil, networkpolicy.Config{NodeName: "node-a", NRIdisabled: true, NoRules: true,
		PodsByIP: enginePodsByIP(newPodsByIP().lookup)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }()
	for inf, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", inf)
		}
	}
	apiPod, err := client.CoreV1().Pods("shop").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podInf := factory.Core().V1().Pods().Informer()
	gotPod, err := trim.NewPodLister(podInf.GetIndexer()).Pods("shop").Get("web")
	if err != nil {
		t.Fatal(err)
	}
	want := trim.NewPod(apiPod)
	if !reflect.DeepEqual(gotPod, want) {
		t.Errorf("cached pod:\n got %+v\nwant %+v", gotPod, want)
	}
	// A *trim.Pod has no volumes, conditions nor container statuses; what
	// the engine is given of it has none either.
	enginePod, err := enginePods{inf: podInf}.Lister().Pods("shop").Get("web")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(enginePod, want.Core()) {
		t.Errorf("the engine's form of the cached pod:\n got %+v\nwant %+v", enginePod, want.Core())
	}
	for name, p := range map[string]*corev1.Pod{"cached": gotPod.Core(), "engine's": enginePod} {
		if p.Annotations["kubectl.kubernetes.io/restartedAt"] != "" || len(p.Spec.Volumes) > 0 || len(p.Status.Conditions) > 0 ||
			len(p.Status.ContainerStatuses) > 0 || p.ManagedFields != nil || p.OwnerReferences != nil || len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Image != "" {
			t.Errorf("the %s pod kept what is not read: %+v", name, p)
		}
	}
	gotNS, err := factory.Core().V1().Namespaces().Lister().Get("shop")
	if err != nil {
		t.Fatal(err)
	}
	if gotNS.Annotations != nil || gotNS.Spec.Finalizers != nil || gotNS.Labels["team"] != "a" {
		t.Errorf("cached namespace: %+v", gotNS)
	}
	gotNode, err := nodes.Lister().Get("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if gotNode.Status.Images != nil || gotNode.Labels["zone"] != "z" {
		t.Errorf("cached node: %+v", gotNode)
	}
	gotNP, err := factory.Networking().V1().NetworkPolicies().Lister().NetworkPolicies("shop").Get("deny")
	if err != nil {
		t.Fatal(err)
	}
	if gotNP.ManagedFields != nil || len(gotNP.Spec.PolicyTypes) != 1 {
		t.Errorf("cached policy: %+v", gotNP)
	}
}

// Through the informers Run builds: an update that changes nothing the
// compiler reads (a pod's conditions, an annotation nobody reads)
// compiles nothing; adds, deletes, and changes of labels, pod IPs or
// phase do.
func TestUpdatesOfNothingReadCompileNothing(t *testing.T) {
	pod := bulkyPod("shop", "web")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "a"}}}
	client := copyingClient(pod, ns)
	factory := newFactory(client, nil)
	if _, err := newController(client, factory, nil, nil, nil, nil, networkpolicy.Config{NodeName: "node-a", NRIdisabled: true, NoRules: true,
		PodsByIP: enginePodsByIP(newPodsByIP().lookup)}); err != nil { // as Run sets it
		t.Fatal(err)
	}
	pods, nss, nps := factory.Core().V1().Pods(), factory.Core().V1().Namespaces(), factory.Networking().V1().NetworkPolicies()
	kv := newKernelVerdicts("node-a", trim.NewPodLister(pods.Informer().GetIndexer()), nss.Lister(), nps.Lister(), nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// offered counts the events kv's handler was given (after it ran):
	// once it reaches n, kv.seq holds the kicks of those n.
	var offered atomic.Int64
	h := kv.handler()
	counted := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { h.OnAdd(o, false); offered.Add(1) },
		UpdateFunc: func(o, n any) { h.OnUpdate(o, n); offered.Add(1) },
		DeleteFunc: func(o any) { h.OnDelete(o); offered.Add(1) },
	}
	for _, inf := range []cache.SharedIndexInformer{pods.Informer(), nss.Informer()} {
		if _, err := inf.AddEventHandler(counted); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }()
	factory.WaitForCacheSync(ctx.Done())
	wait := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for offered.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("the handler saw %d events, want %d", offered.Load(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait(2) // the pod and the namespace
	if got := kv.seq.Load(); got != 2 {
		t.Fatalf("after the initial list: %d kicks, want 2", got)
	}
	podAPI, nsAPI := client.CoreV1().Pods("shop"), client.CoreV1().Namespaces()
	editPod := func(status bool, f func(*corev1.Pod)) func() error {
		return func() error {
			p, err := podAPI.Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			f(p)
			if status {
				_, err = podAPI.UpdateStatus(ctx, p, metav1.UpdateOptions{})
			} else {
				_, err = podAPI.Update(ctx, p, metav1.UpdateOptions{})
			}
			return err
		}
	}
	editNS := func(f func(*corev1.Namespace)) func() error {
		return func() error {
			n, err := nsAPI.Get(ctx, "shop", metav1.GetOptions{})
			if err != nil {
				return err
			}
			f(n)
			_, err = nsAPI.Update(ctx, n, metav1.UpdateOptions{})
			return err
		}
	}
	steps := []struct {
		name    string
		do      func() error
		compile bool
	}{
		{"pod not ready", editPod(true, func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }), false},
		{"container restarted", editPod(true, func(p *corev1.Pod) { p.Status.ContainerStatuses[0].RestartCount++ }), false},
		{"annotation nobody reads", editPod(false, func(p *corev1.Pod) { p.Annotations["kubectl.kubernetes.io/restartedAt"] = "now" }), false},
		{"being deleted", editPod(false, func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }), false},
		{"label", editPod(false, func(p *corev1.Pod) { p.Labels["app"] = "api" }), true},
		{"anycast annotation", editPod(false, func(p *corev1.Pod) { p.Annotations["flock.fritzlab.net/anycast"] = "2001:db8:a::2" }), true},
		{"pod IPs", editPod(true, func(p *corev1.Pod) { p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: "198.51.100.1"}) }), true},
		{"phase", editPod(true, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), true},
		{"namespace annotation", editNS(func(n *corev1.Namespace) { n.Annotations = map[string]string{"a": "b"} }), false},
		{"namespace label", editNS(func(n *corev1.Namespace) { n.Labels["team"] = "b" }), true},
		{"pod created", func() error {
			_, err := podAPI.Create(ctx, bulkyPod("shop", "api"), metav1.CreateOptions{})
			return err
		}, true},
		{"pod deleted", func() error { return podAPI.Delete(ctx, "api", metav1.DeleteOptions{}) }, true},
	}
	for i, s := range steps {
		before := kv.seq.Load()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		wait(int64(3 + i))
		if got := kv.seq.Load() - before; (got == 1) != s.compile || got > 1 {
			t.Errorf("%s: %d kicks, want a compile: %v", s.name, got, s.compile)
		}
	}
}

// copyingClient is a fake clientset holding objs whose watches send
// copies: the fake hands a new watch the objects its tracker holds
// themselves, and trim.Transform trims in place what an informer is
// given (an API server's watch sends each object decoded anew).
func copyingClient(objs ...runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objs...)
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			if e.Object != nil {
				e.Object = e.Object.DeepCopyObject()
			}
			return e, true
		}), nil
	})
	return client
}
