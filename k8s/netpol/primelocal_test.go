package netpol

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// primeLocal must not overwrite a newer state of a local pod that a
// handler records while it lists.
func TestPrimeLocalKeepsNewer(t *testing.T) {
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	lc := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "l"}}
	lc.Spec.NodeName = "node-a"
	L := trim.NewPod(lc) // as the informer's transform caches it
	_ = pods.Add(L)      // not yet given an address
	hp := &hookedPods{Indexer: pods}
	k := newKernelVerdicts("node-a", trim.NewPodLister(hp), nil, nil, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	indexPods(k, pods)
	l1 := lc.DeepCopy()
	l1.Status.PodIPs = []corev1.PodIP{{IP: "fd00::1"}}
	L1 := trim.NewPod(l1)
	var handled sync.WaitGroup
	hp.after = func() { // the informer, meanwhile (its handler on its own goroutine)
		_ = pods.Update(L1)
		handled.Add(1)
		go func() { defer handled.Done(); k.podChanged(L, L1) }()
		time.Sleep(50 * time.Millisecond)
	}
	k.primeLocal()
	handled.Wait()
	if !k.isLocal("fd00::1") {
		t.Errorf("L holds fd00::1 (store and handler agree), but Local(fd00::1) is false: k.local = %v", k.local)
	}
}
