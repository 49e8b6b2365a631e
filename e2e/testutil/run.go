package testutil

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// Run runs f until the test ends or stop is called. stop (also run as a
// cleanup) cancels f's context and waits for f to return, failing the
// test if f returned an error or is still running Timeout later.
func Run(t testing.TB, f func(context.Context) error) (ctx context.Context, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(Timeout):
				t.Errorf("Run still running %v after its context ended", Timeout)
			}
		})
	}
	t.Cleanup(stop)
	return ctx, stop
}

// Start runs an informer-backed component as Run does (run is its Run)
// and waits until synced (its WaitSynced) returns nil. It returns run's
// context, which ends with the test.
func Start(t testing.TB, run, synced func(context.Context) error) context.Context {
	t.Helper()
	ctx, _ := Run(t, run)
	sctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	if err := synced(sctx); err != nil {
		t.Fatalf("not synced: %v", err)
	}
	return ctx
}

// Recorder is what client-go's fake clients record, the typed
// (kubernetes/fake) and the dynamic (dynamic/fake) ones alike.
type Recorder interface {
	Actions() []clienttesting.Action
}

// WaitWatching waits until a watch of resource ("pods", …) was opened
// through c. The fakes deliver an event only to the watches open when it
// happens, so one made between an informer's list and its watch is lost:
// a test changes nothing before the informer watches. (A watch shows in
// Actions only once the fake's reactor has registered it.)
func WaitWatching(t testing.TB, c Recorder, resource string) {
	t.Helper()
	WaitFor(t, "a watch of "+resource, func() bool {
		for _, a := range c.Actions() {
			if a.GetVerb() == "watch" && a.GetResource().Resource == resource {
				return true
			}
		}
		return false
	})
}

// RunInformer runs inf until the test ends (in the agent, the informer
// factory's job) and waits for its first list.
func RunInformer(t testing.TB, inf cache.SharedIndexInformer) context.Context {
	t.Helper()
	return Start(t, func(ctx context.Context) error {
		inf.RunWithContext(ctx)
		return nil
	}, func(ctx context.Context) error {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return fmt.Errorf("informer did not sync: %w", ctx.Err())
		}
		return nil
	})
}
