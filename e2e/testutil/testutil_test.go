package testutil

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// fakeTB records failures; Fatalf ends the calling goroutine, as
// testing's does, so helpers run through do.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	fails    []string
	cleanups []func()
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fails = append(f.fails, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}

func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

func (f *fakeTB) cleanup() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// do runs fn as a test body would and returns the failures.
func (f *fakeTB) do(fn func()) []string {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.fails...)
}

func TestEventually(t *testing.T) {
	var n int
	ft := &fakeTB{}
	fails := ft.do(func() {
		Eventually(ft, "the third look", func() (bool, string) { n++; return n == 3, "" })
	})
	if len(fails) != 0 || n != 3 {
		t.Errorf("fails %q after %d looks, want none after 3", fails, n)
	}

	ft = &fakeTB{}
	start := time.Now()
	fails = ft.do(func() {
		EventuallyWithin(ft, 30*time.Millisecond, "the impossible", func() (bool, string) { return false, "still not" })
		t.Error("EventuallyWithin returned after its deadline")
	})
	if len(fails) != 1 || !strings.Contains(fails[0], "the impossible") || !strings.Contains(fails[0], "still not") {
		t.Errorf("fails %q, want one naming what and the last message", fails)
	}
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Errorf("gave up after %v, before its deadline", took)
	}

	n = 0
	ft = &fakeTB{}
	fails = ft.do(func() { WaitFor(ft, "the second look", func() bool { n++; return n == 2 }) })
	if len(fails) != 0 || n != 2 {
		t.Errorf("WaitFor: fails %q after %d looks", fails, n)
	}
}

func TestConsistently(t *testing.T) {
	var n int
	ft := &fakeTB{}
	fails := ft.do(func() {
		Consistently(ft, "holds", 20*time.Millisecond, func() (bool, string) { n++; return true, "" })
	})
	if len(fails) != 0 || n < 2 {
		t.Errorf("fails %q after %d looks, want none after several", fails, n)
	}
	n = 0
	fails = ft.do(func() {
		Consistently(ft, "breaks", time.Minute, func() (bool, string) { n++; return n < 3, "broke" })
		t.Error("Consistently returned although its condition broke")
	})
	if len(fails) != 1 || !strings.Contains(fails[0], "breaks: broke") {
		t.Errorf("fails %q", fails)
	}
}

func TestRun(t *testing.T) {
	ft := &fakeTB{}
	var stopped bool
	ft.do(func() {
		ctx, stop := Run(ft, func(ctx context.Context) error { <-ctx.Done(); stopped = true; return nil })
		if ctx.Err() != nil {
			t.Error("context ended before stop")
		}
		stop()
		if !stopped || ctx.Err() == nil {
			t.Error("stop returned before Run did")
		}
		stop() // again, and as a cleanup: harmless
	})
	ft.cleanup()
	if len(ft.fails) != 0 {
		t.Errorf("fails %q", ft.fails)
	}

	ft = &fakeTB{}
	ft.do(func() { Run(ft, func(ctx context.Context) error { <-ctx.Done(); return errors.New("broken") }) })
	ft.cleanup()
	if len(ft.fails) != 1 || !strings.Contains(ft.fails[0], "broken") {
		t.Errorf("fails %q, want Run's error", ft.fails)
	}
}

// WaitWatching returns once a watch is open, not before; an event after
// it reaches the watch (the fakes drop those that come earlier).
func TestStartAndWaitWatching(t *testing.T) {
	cs := fake.NewClientset()
	ft := &fakeTB{}
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		WaitWatching(ft, cs, "pods")
	}()
	select {
	case <-returned:
		t.Fatalf("WaitWatching returned before any watch (fails %q)", ft.fails)
	case <-time.After(20 * time.Millisecond):
	}

	got := make(chan string, 10)
	ctx := Start(t, func(ctx context.Context) error {
		w, err := cs.CoreV1().Pods("ns").Watch(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case ev := <-w.ResultChan():
				got <- ev.Object.(*corev1.Pod).Name
			}
		}
	}, func(context.Context) error { return nil })
	<-returned
	if len(ft.fails) != 0 {
		t.Fatalf("WaitWatching: %q", ft.fails)
	}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-got:
		if name != "p" {
			t.Errorf("event for %q", name)
		}
	case <-time.After(Timeout):
		t.Fatal("the watch WaitWatching saw missed the event")
	}

	// A component that does not sync fails the test.
	ft = &fakeTB{}
	fails := ft.do(func() {
		Start(ft, func(ctx context.Context) error { <-ctx.Done(); return nil },
			func(context.Context) error { return errors.New("never listed") })
	})
	ft.cleanup()
	if len(fails) != 1 || !strings.Contains(fails[0], "never listed") {
		t.Errorf("fails %q", fails)
	}
}
