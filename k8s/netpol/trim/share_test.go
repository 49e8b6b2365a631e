package trim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// Pods of a few workloads are trimmed from several goroutines while the
// collector runs and pods are dropped at random: every trimmed pod keeps
// exactly its own labels and ports (a shared object is never another
// workload's, nor changed under it), the pods held at the end that have
// the same ports share one slice, and once none is held the shared
// containers are forgotten.
func TestSharingUnderConcurrency(t *testing.T) {
	seed := testutil.Seed(t)
	const shapes, goroutines, rounds = 12, 4, 3000
	shape := func(i int) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("w%d-%d", i, rand.Int()),
			Labels: map[string]string{"app": fmt.Sprintf("w%d", i), "tier": fmt.Sprint(i % 3)}}}
		p.Spec.Containers = []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(8000 + i), Protocol: corev1.ProtocolTCP}}}}
		if i%4 == 0 {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "side", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}}})
		}
		return p
	}
	check := func(i int, p *Pod) error {
		want := shape(i)
		if !reflect.DeepEqual(p.Labels, want.Labels) {
			return fmt.Errorf("shape %d: labels %v, want %v", i, p.Labels, want.Labels)
		}
		if !reflect.DeepEqual(p.Spec.Containers, want.Spec.Containers) {
			return fmt.Errorf("shape %d: containers %v, want %v", i, p.Spec.Containers, want.Spec.Containers)
		}
		return nil
	}
	type kept struct {
		i int
		p *Pod
	}
	held := make([][]kept, goroutines)
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(seed), uint64(g)))
			var mine []kept
			for range rounds {
				i := r.IntN(shapes)
				p := NewPod(shape(i))
				if err := check(i, p); err != nil {
					errs <- err
					return
				}
				switch r.IntN(10) {
				case 0: // dropped at once
				case 1:
					if len(mine) > 0 { // an older one dropped
						j := r.IntN(len(mine))
						mine = append(mine[:j], mine[j+1:]...)
					}
				case 2:
					runtime.GC()
				default:
					mine = append(mine, kept{i, p})
				}
			}
			for _, k := range mine {
				if err := check(k.i, k.p); err != nil {
					errs <- fmt.Errorf("held to the end: %w", err)
					return
				}
			}
			held[g] = mine
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("FLOCK_SEED=%d: %v", seed, err)
	}
	first := map[int]*corev1.Container{}
	for _, mine := range held {
		for _, k := range mine {
			if f, ok := first[k.i]; ok && f != &k.p.Spec.Containers[0] {
				t.Fatalf("FLOCK_SEED=%d: two pods held of shape %d have their own containers", seed, k.i)
			}
			first[k.i] = &k.p.Spec.Containers[0]
		}
	}
	held, first = nil, nil
	n := 0
	for range 100 {
		runtime.GC()
		shared.Lock()
		n = len(shared.m)
		shared.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("FLOCK_SEED=%d: no pod is held, and containers of %d shapes are remembered", seed, n)
}
