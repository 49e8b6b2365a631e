package kubeclient

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// One informer per key whoever asks, all run by one Run and synced by one
// WaitForSync; one asked for after Run starts runs too; Run returns once
// they all stopped; a second Run is refused.
func TestFactory(t *testing.T) {
	cs := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pw", Namespace: "flock"}})
	f := NewFactory()
	builds := 0
	pods := func() cache.SharedIndexInformer {
		builds++
		return NewInformer(noWatchList[*corev1.PodList]{cs.CoreV1().Pods("")}, &corev1.Pod{}, nil)
	}
	a, b := f.Informer("pods", pods), f.Informer("pods", pods)
	if a != b || builds != 1 {
		t.Fatalf("two asks for one key: %d builds, same informer %v", builds, a == b)
	}
	never := NewFactory()
	never.Informer("pods", func() cache.SharedIndexInformer {
		return NewInformer(noWatchList[*corev1.PodList]{cs.CoreV1().Pods("")}, &corev1.Pod{}, nil)
	})
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if err := never.WaitForSync(short); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "pods") {
		t.Fatalf("WaitForSync of a factory never run: %v, want a deadline naming the informer", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if err := f.WaitForSync(sctx); err != nil {
		t.Fatal(err)
	}
	if n := len(a.GetStore().List()); n != 1 {
		t.Errorf("pods cached: %d, want 1", n)
	}
	late := f.Informer("secrets", func() cache.SharedIndexInformer {
		return NewInformer(noWatchList[*corev1.SecretList]{cs.CoreV1().Secrets("flock")}, &corev1.Secret{}, nil)
	})
	if err := f.WaitForSync(sctx); err != nil || len(late.GetStore().List()) != 1 {
		t.Fatalf("an informer asked for after Run: %v, %d cached", err, len(late.GetStore().List()))
	}
	if err := f.Run(ctx); err == nil {
		t.Error("second Run: no error")
	}
	var stopped sync.WaitGroup
	stopped.Go(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	stopped.Wait()
	if !a.IsStopped() || !late.IsStopped() {
		t.Error("Run returned with informers still running")
	}
}

// noWatchList is a fake's client, saying what the fake clientset says: it
// cannot stream a list through a watch (WatchList).
type noWatchList[L runtime.Object] struct{ ListerWatcher[L] }

func (noWatchList[L]) IsWatchListSemanticsUnSupported() bool { return true }
