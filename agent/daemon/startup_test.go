package daemon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sync/errgroup"
)

// fakeStartup records the steps, and starts real components (each
// records its start) through a real registry.
type fakeStartup struct {
	mu       sync.Mutex
	steps    []string
	comps    components
	g        *errgroup.Group
	failSync error
	failRest error
}

func (f *fakeStartup) record(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps = append(f.steps, s)
}

func (f *fakeStartup) start(ctx context.Context, p phase) {
	f.record("phase " + p.String())
	f.comps.start(ctx, f.g, p)
}
func (f *fakeStartup) sync(context.Context) error {
	f.record("sync")
	return f.failSync
}
func (f *fakeStartup) authorize() { f.record("authorize") }
func (f *fakeStartup) restore(context.Context) error {
	f.record("restore")
	return f.failRest
}
func (f *fakeStartup) originate(context.Context) { f.record("originate") }
func (f *fakeStartup) nodes(context.Context)     { f.record("nodes") }
func (f *fakeStartup) services(context.Context)  { f.record("services") }
func (f *fakeStartup) peer()                     { f.record("peer") }
func (f *fakeStartup) serve()                    { f.record("serve") }
func (f *fakeStartup) hold() func()              { return func() {} }

func (f *fakeStartup) snapshot() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.steps)
}

func newFakeStartup() (*fakeStartup, context.Context) {
	f := &fakeStartup{}
	g, ctx := errgroup.WithContext(context.Background())
	f.g = g
	// Components mark their start; recovery ones run until the end,
	// serving ones return at once.
	started := func(name string) RunFunc {
		return func(ctx context.Context) error { f.record("start " + name); return nil }
	}
	f.comps.register("speaker", duringRecovery, started("speaker"))
	f.comps.register("informers", duringRecovery, started("informers"))
	f.comps.register("cni server", whenServing, started("cni server"))
	f.comps.register("reconcilers", whenServing, started("reconcilers"))
	return f, ctx
}

// before reports whether a happened before b (both happened).
func before(steps []string, a, b string) bool {
	i, j := slices.Index(steps, a), slices.Index(steps, b)
	return i >= 0 && j >= 0 && i < j
}

// The start-up order the design rests on: the informers run and sync
// before anything is authorized; the AddressPools are the authority
// before allocations are restored; restore before the node's routes are
// originated; nothing that serves requests or changes state starts
// before the agent is ready; the peers come last, once every node's
// NodeConfig is listed and the Service routes are decided.
func TestStartupOrder(t *testing.T) {
	f, ctx := newFakeStartup()
	if err := startup(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := f.g.Wait(); err != nil {
		t.Fatal(err)
	}
	steps := f.snapshot()
	for _, c := range []string{"start speaker", "start informers", "start cni server", "start reconcilers"} {
		if !slices.Contains(steps, c) {
			t.Errorf("%s never happened: %v", c, steps)
		}
	}
	for _, o := range [][2]string{
		{"phase recovery", "sync"},
		{"sync", "authorize"}, {"authorize", "restore"}, {"restore", "originate"},
		{"originate", "serve"},
		{"serve", "phase serving"}, {"serve", "start cni server"}, {"serve", "start reconcilers"},
		{"phase serving", "nodes"}, {"nodes", "peer"},
		{"phase serving", "services"}, {"services", "peer"},
	} {
		if !before(steps, o[0], o[1]) {
			t.Errorf("%q must come before %q: %v", o[0], o[1], steps)
		}
	}
}

// A failed step stops start-up there: after a failed sync nothing is
// authorized or restored; after a failed restore nothing is originated,
// peered or served.
func TestStartupStopsAtTheFailedStep(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     func(*fakeStartup)
		lastRun string
	}{
		{"sync", func(f *fakeStartup) { f.failSync = errors.New("informers did not sync: RBAC") }, "sync"},
		{"restore", func(f *fakeStartup) { f.failRest = errors.New("record x: unreadable") }, "restore"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, ctx := newFakeStartup()
			tc.set(f)
			err := startup(ctx, f)
			if err == nil {
				t.Fatal("start-up succeeded")
			}
			_ = f.g.Wait()
			steps := f.snapshot()
			var after []string
			for _, s := range steps[slices.Index(steps, tc.lastRun)+1:] {
				if !strings.HasPrefix(s, "start speaker") && !strings.HasPrefix(s, "start informers") {
					after = append(after, s)
				}
			}
			if len(after) > 0 {
				t.Errorf("after the failed %s: %v ran (all: %v)", tc.lastRun, after, steps)
			}
		})
	}
}

// A component's error stops the agent, naming the component.
func TestComponentErrorNamesIt(t *testing.T) {
	var c components
	g, ctx := errgroup.WithContext(context.Background())
	c.register("cni server", whenServing, RunFunc(func(context.Context) error { return errors.New("accept: too many open files") }))
	c.register("admin api", whenServing, RunFunc(func(ctx context.Context) error { <-ctx.Done(); return nil }))
	c.start(ctx, g, whenServing)
	c.start(ctx, g, whenServing) // a phase starts once
	if err := g.Wait(); err == nil || err.Error() != "cni server: accept: too many open files" {
		t.Fatalf("error %v, want it named after the component", err)
	}
}

// follow applies once per signal value, from any of its signals, and
// returns nil when ctx ends.
func TestFollow(t *testing.T) {
	a, b := make(chan struct{}, 1), make(chan struct{}, 1)
	applied := make(chan struct{}, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- follow(func() { applied <- struct{}{} }, a, b, nil).Run(ctx) }()
	a <- struct{}{}
	<-applied
	b <- struct{}{}
	<-applied
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Errorf("%d applies more than signals", len(applied))
	}
	if err := follow(func() {}, a, b, a, b).Run(context.Background()); err == nil {
		t.Error("follow of 4 signals: want an error")
	}
}
