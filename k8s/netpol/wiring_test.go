package netpol

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// syncingExtra is an ExtraIPs that answers as flock-policy's tracker
// does (agent/policyips, which k8s packages do not import): its first
// answer once the stores and its handler's registrations synced.
type syncingExtra struct {
	synced atomic.Bool
	seen   atomic.Int64
}

func (x *syncingExtra) ExtraPodIPs(*trim.Pod) []string { return nil }
func (x *syncingExtra) PodsForIP(string) []string      { return nil }
func (x *syncingExtra) HasSynced() bool                { return x.synced.Load() }
func (x *syncingExtra) Handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{AddFunc: func(any) { x.seen.Add(1) }}
}

func (x *syncingExtra) Run(ctx context.Context, _ trim.PodLister, _ corelisters.NamespaceLister, synced []cache.InformerSynced, changed func(ips, pods []string)) error {
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil
	}
	x.synced.Store(true)
	changed(nil, nil)
	<-ctx.Done()
	return nil
}

// Run's wiring without the kernel: the engine's controller, flock's
// transform, the extra IPs' handler (one value on the pod and namespace
// informers) and the kernel's handlers on real informers. The tracker's first answer, which the engine's queue
// and the first load wait for, comes once the stores and its handler's
// registrations synced. The pod informer's three handlers (the engine's,
// the tracker's, the kernel's) share one listener.
func TestRunWiringTrackerSyncs(t *testing.T) {
	var objs []runtime.Object
	for i := range 30 {
		p := bulkyPod("shop", fmt.Sprintf("web%d", i))
		if i%3 == 0 {
			p.Spec.NodeName = "node-b"
		}
		objs = append(objs, p)
	}
	objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	client := copyingClient(objs...)
	factory := newFactory(client, nil)
	ips := newPodsByIP()
	engineCfg := networkpolicy.Config{NodeName: "node-a", NRIdisabled: true, NoRules: true, PodsByIP: enginePodsByIP(ips.lookup)}
	tr := &syncingExtra{}
	engineCfg.ExtraIPsSynced = tr.HasSynced
	if _, err := newController(client, factory, nil, nil, nil, nil, engineCfg); err != nil {
		t.Fatal(err)
	}
	podInf, nsInf := factory.Core().V1().Pods(), factory.Core().V1().Namespaces()
	// The engine reads the pods by IP flock keeps (Config.PodsByIP): it
	// adds no index of its own, a set of keys an address. The pods by IP
	// are complete once the kernel's pod handler synced (as Run waits).
	if idx := podInf.Informer().GetIndexer().GetIndexers(); len(idx) != 1 {
		t.Errorf("the pod informer's indexes: %v, want the namespace's alone", slices.Collect(maps.Keys(idx)))
	}
	extraSynced, err := addHandler(tr.Handler(), podInf.Informer(), nsInf.Informer())
	if err != nil {
		t.Fatal(err)
	}
	nps := factory.Networking().V1().NetworkPolicies()
	watched := []cache.SharedIndexInformer{podInf.Informer(), nsInf.Informer(), nps.Informer()}
	var synced []kubeclient.Synced
	for _, inf := range watched {
		synced = append(synced, kubeclient.Synced{Name: "an informer", Synced: inf.HasSynced})
	}
	podLister := trim.NewPodLister(podInf.Informer().GetIndexer())
	kv := newKernelVerdicts("node-a", podLister, nsInf.Lister(), nps.Lister(), tr, synced, slog.New(slog.NewTextHandler(io.Discard, nil)))
	kv.ips, kv.holders = ips, ips.lookup
	var indexed cache.ResourceEventHandlerRegistration
	for i, inf := range watched {
		reg, err := inf.AddEventHandler(kv.handler())
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			indexed = reg
		}
	}
	// What the factory made (Informer() wraps it in a typed view).
	if ol, ok := factory.InformerFor(&corev1.Pod{}, nil).(oneListener); !ok {
		t.Errorf("the pod informer is a %T, not a oneListener", factory.InformerFor(&corev1.Pod{}, nil))
	} else if n := len(*ol.f.hs.Load()); n != 3 {
		t.Errorf("the pod informer's shared listener has %d handlers, want the engine's, the tracker's and the kernel's", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }()
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, podLister, nsInf.Lister(), extraSynced, kv.extraChanged) }()
	start := time.Now()
	for !tr.HasSynced() {
		if time.Since(start) > 15*time.Second {
			for i, s := range extraSynced {
				t.Logf("extraSynced[%d] = %v", i, s())
			}
			t.Fatal("tracker never synced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := tr.seen.Load(); n != 31 {
		t.Errorf("the handler was told of %d objects at its first answer, want the 30 pods and 1 namespace", n)
	}
	t.Logf("first answer after %s", time.Since(start))
	for !indexed.HasSynced() {
		if time.Since(start) > 15*time.Second {
			t.Fatal("the pods by IP never synced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := ips.lookup("fd00:10::1"); len(got) != 30 { // bulkyPod's address
		t.Errorf("the pods by IP say %d pods hold fd00:10::1, want the 30", len(got))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
