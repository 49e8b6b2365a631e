package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// step is one answer of scriptedUpstream's Watch: a watch the test
// feeds, or an error.
type step struct {
	w     *watch.FakeWatcher
	err   error
	block bool // the dial is not answered
}

// scriptedUpstream answers the relay informer's watches in order and
// records what each asked; a watch past the script waits for the test's
// end. Lists are counted: the informer streams its lists (watch-list).
type scriptedUpstream struct {
	mu    sync.Mutex
	steps []step
	asked []metav1.ListOptions
	lists int
	ctx   context.Context
}

func (s *scriptedUpstream) List(context.Context, metav1.ListOptions) (*corev1.PodList, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists++
	return nil, fmt.Errorf("the relay's informer listed instead of streaming")
}

func (s *scriptedUpstream) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	s.mu.Lock()
	s.asked = append(s.asked, o)
	n := len(s.asked)
	s.mu.Unlock()
	if n > len(s.steps) {
		<-s.ctx.Done()
		return nil, s.ctx.Err()
	}
	st := s.steps[n-1]
	if st.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if st.err != nil {
		return nil, st.err
	}
	return st.w, nil
}

func (s *scriptedUpstream) watches() []metav1.ListOptions {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]metav1.ListOptions(nil), s.asked...)
}

func rvPod(name, rv string) *corev1.Pod {
	p := testPod("ns", name, 0)
	p.ResourceVersion = rv
	return p
}

func initialEventsEnd(rv string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv,
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
}

// fast resumes at once, and gives up after a second.
var fast = Resume{First: time.Millisecond, Most: 10 * time.Millisecond, GiveUp: time.Second}

// liveRelay runs the relay's informer over up as flock-relay does, its
// watches resumed as r says, and makes its cache live once the first
// list is in.
func liveRelay(t *testing.T, up kubeclient.ListerWatcher[*corev1.PodList], r Resume) *Cache {
	t.Helper()
	if s, ok := up.(*scriptedUpstream); ok {
		s.ctx = t.Context()
	}
	c := NewCache(0)
	u := c.Upstream(up)
	u.Resume = r
	inf := kubeclient.NewInformer(u, &corev1.Pod{}, nil)
	if err := inf.SetTransform(trim.Transform); err != nil {
		t.Fatal(err)
	}
	reg, err := inf.AddEventHandler(c.Handler())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, func(ctx context.Context) error { inf.RunWithContext(ctx); return nil })
	testutil.Eventually(t, "the first list in", func() (bool, string) {
		return inf.HasSynced() && reg.HasSynced() && u.ListRV() != "", "list at " + u.ListRV()
	})
	if err := c.Live(u.ListRV()); err != nil {
		t.Fatal(err)
	}
	return c
}

// failedAfterTheList makes a relay live on a first watch-list of one
// pod, ends that watch, answers the watches after it with then, and
// returns the relay's cache once it failed (the test fails if it goes
// on serving).
func failedAfterTheList(t *testing.T, r Resume, then ...step) *Cache {
	t.Helper()
	first := watch.NewFakeWithChanSize(4, false)
	up := &scriptedUpstream{steps: append([]step{{w: first}}, then...)}
	first.Add(rvPod("a", "10"))
	first.Action(watch.Bookmark, initialEventsEnd("10"))
	c := liveRelay(t, up, r)
	first.Stop()
	select {
	case <-c.Failed():
	case <-time.After(testutil.Timeout):
		t.Fatalf("the relay goes on serving after %d watches", len(up.watches()))
	}
	return c
}

// A watch of the API server that ends, fails or is refused for a while
// (a restarting API server, a load balancer's 503, its watch timeout) is
// resumed from the last resource version the relay passed: the relay
// keeps serving, with no change missed. Before, the reflector listed
// again and the relay exited to start over, dropping every node's watch.
func TestTheRelayFollowsUpstreamThroughWatchFailures(t *testing.T) {
	first, resumed, last := watch.NewFakeWithChanSize(4, false), watch.NewFakeWithChanSize(4, false), watch.NewFakeWithChanSize(4, false)
	up := &scriptedUpstream{steps: []step{
		{w: first},
		{err: apierrors.NewServiceUnavailable("the API server is restarting")},
		{err: apierrors.NewTooManyRequests("slow down", 0)},
		{w: resumed},
		{err: apierrors.NewInternalError(fmt.Errorf("etcd leader changed"))},
		{w: last},
	}}
	first.Add(rvPod("a", "10"))
	first.Action(watch.Bookmark, initialEventsEnd("10"))
	c := liveRelay(t, up, DefaultResume)

	first.Add(rvPod("b", "11"))
	first.Stop() // the API server's watch timeout: the watch ends
	testutil.Eventually(t, "the watch resumed", func() (bool, string) {
		return len(up.watches()) >= 4, fmt.Sprintf("%d watches", len(up.watches()))
	})
	resumed.Add(rvPod("c", "12"))
	resumed.Action(watch.Bookmark, rvPod("", "15"))
	// A 503 in the stream, without Retry-After.
	resumed.Error(&apierrors.NewServiceUnavailable("going away").ErrStatus)
	testutil.Eventually(t, "the last watch", func() (bool, string) {
		return len(up.watches()) >= 6, fmt.Sprintf("%d watches", len(up.watches()))
	})
	last.Modify(rvPod("a", "16"))
	testutil.Eventually(t, "every change in the cache", func() (bool, string) {
		return c.Len() == 3 && c.current() == 16, fmt.Sprintf("%d pods at %d", c.Len(), c.current())
	})
	if err := c.Ready(); err != nil {
		t.Fatalf("the relay stopped serving: %v", err)
	}
	asked := up.watches()
	up.mu.Lock()
	if up.lists != 0 {
		t.Errorf("%d lists", up.lists)
	}
	up.mu.Unlock()
	// Each watch after the first starts where the relay is, streams no
	// list, and keeps the reflector's selectors and timeout.
	want := []string{"", "11", "11", "11", "15", "15"}
	for i, o := range asked[:6] {
		initial := o.SendInitialEvents != nil && *o.SendInitialEvents
		if initial != (i == 0) || (i > 0 && o.ResourceVersion != want[i]) {
			t.Errorf("watch %d asked from %q (initial events %v), want from %q", i, o.ResourceVersion, initial, want[i])
		}
		if i > 0 && (!o.AllowWatchBookmarks || o.ResourceVersionMatch != "" || o.TimeoutSeconds == nil || *o.TimeoutSeconds != *asked[0].TimeoutSeconds) {
			t.Errorf("watch %d: %+v (the first: %+v)", i, o, asked[0])
		}
	}
}

// Only an expired resource version makes the relay start over: the API
// server no longer holds the changes after it, and a relist's objects
// come out of order. Whether the API server refuses the watch or ends it
// with the error, the cache fails (flock-relay exits and lists afresh).
func TestAnExpiredWatchStartsTheRelayOver(t *testing.T) {
	expired := apierrors.NewResourceExpired("too old resource version: 10 (20)")
	for name, second := range map[string]func() step{
		"refused": func() step { return step{err: expired} },
		"in the stream": func() step {
			w := watch.NewFakeWithChanSize(1, false)
			w.Error(&expired.ErrStatus)
			return step{w: w}
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := failedAfterTheList(t, DefaultResume, second())
			if !errors.Is(c.Err(), errRelist) {
				t.Fatalf("failed with %v, want a relist", c.Err())
			}
		})
	}
}

// feed is a watch a flakyUpstream writes.
type feed struct {
	ch   chan watch.Event
	done chan struct{}
	once sync.Once
}

func (f *feed) ResultChan() <-chan watch.Event { return f.ch }
func (f *feed) Stop()                          { f.once.Do(func() { close(f.done) }) }

// flakyUpstream is an API server whose pods went through a fixed run of
// changes, and whose watches fail at random: refused (503, 429, 500),
// ended, or ended by an error in the stream, after a random number of
// events, with bookmarks between.
type flakyUpstream struct {
	changes []watch.Event // resource versions 11, 12, ...
	mu      sync.Mutex
	rng     *rand.Rand
	initial int
	watches int
}

func (f *flakyUpstream) List(context.Context, metav1.ListOptions) (*corev1.PodList, error) {
	return nil, fmt.Errorf("listed")
}

func (f *flakyUpstream) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watches++
	var from int // changes[from:] are sent
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		f.initial++
	} else {
		rv, err := strconv.Atoi(o.ResourceVersion)
		if err != nil || rv < 10 {
			return nil, fmt.Errorf("watch from %q", o.ResourceVersion)
		}
		from = rv - 10
		switch f.rng.IntN(6) {
		case 0:
			return nil, apierrors.NewServiceUnavailable("restarting")
		case 1:
			return nil, apierrors.NewTooManyRequests("slow down", 0)
		case 2:
			return nil, apierrors.NewInternalError(fmt.Errorf("etcd"))
		}
	}
	w := &feed{ch: make(chan watch.Event), done: make(chan struct{})}
	n := f.rng.IntN(12) // events before it ends
	end := f.rng.IntN(6)
	bookmarks := f.rng.IntN(2) == 0
	go func() {
		send := func(ev watch.Event) bool {
			select {
			case w.ch <- ev:
				return true
			case <-w.done:
				return false
			case <-ctx.Done():
				return false
			}
		}
		if o.SendInitialEvents != nil {
			if !send(watch.Event{Type: watch.Added, Object: rvPod("p0", "10")}) ||
				!send(watch.Event{Type: watch.Bookmark, Object: initialEventsEnd("10")}) {
				return
			}
		}
		for i, ev := range f.changes[from:] {
			if i == n {
				switch end {
				case 0, 1, 2:
					close(w.ch)
				case 3, 4:
					if send(watch.Event{Type: watch.Error, Object: &apierrors.NewServiceUnavailable("going away").ErrStatus}) {
						close(w.ch)
					}
				default: // one that goes on
					n = -1
				}
				if n != -1 {
					return
				}
			}
			if !send(ev) {
				return
			}
			if bookmarks && i%3 == 0 {
				if !send(watch.Event{Type: watch.Bookmark, Object: rvPod("", ev.Object.(*corev1.Pod).ResourceVersion)}) {
					return
				}
			}
		}
		select {
		case <-w.done:
		case <-ctx.Done():
		}
	}()
	return w, nil
}

// However the API server's watches fail (short of an expired version),
// the relay follows its pods to their last change, in order and without
// starting over. FLOCK_SEED replays a run.
func TestRandomizedWatchFailuresLoseNothing(t *testing.T) {
	seed := uint64(testutil.Seed(t))
	rng := rand.New(rand.NewPCG(seed, 2))
	want := map[string]string{"p0": "10"} // name → resource version
	var changes []watch.Event
	for rv := 11; rv <= 210; rv++ {
		name := fmt.Sprintf("p%d", rng.IntN(8))
		p := rvPod(name, strconv.Itoa(rv))
		switch _, ok := want[name]; {
		case !ok:
			changes = append(changes, watch.Event{Type: watch.Added, Object: p})
			want[name] = p.ResourceVersion
		case rng.IntN(3) == 0:
			changes = append(changes, watch.Event{Type: watch.Deleted, Object: p})
			delete(want, name)
		default:
			changes = append(changes, watch.Event{Type: watch.Modified, Object: p})
			want[name] = p.ResourceVersion
		}
	}
	up := &flakyUpstream{changes: changes, rng: rand.New(rand.NewPCG(seed, 3))}
	c := liveRelay(t, up, Resume{First: time.Millisecond, Most: 10 * time.Millisecond, GiveUp: time.Hour})
	testutil.Eventually(t, "the last change in the relay", func() (bool, string) {
		return c.current() == 210 || c.Err() != nil, fmt.Sprintf("at %d", c.current())
	})
	if err := c.Ready(); err != nil {
		t.Fatalf("the relay stopped serving: %v", err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.initial != 1 {
		t.Errorf("%d lists streamed, want 1", up.initial)
	}
	for name := range want {
		if !c.Has("ns", name) {
			t.Errorf("%s missing", name)
		}
	}
	if c.Len() != len(want) {
		t.Errorf("%d pods, want %d", c.Len(), len(want))
	}
	t.Logf("%d watches", up.watches)
}

// A refusal that does not pass by itself (RBAC withdrawn, a token no
// longer valid, a version the API server has not reached: an etcd
// restored), or failures that go on for Resume.GiveUp, make the relay
// start over (its cache fails, it stops serving): it must not serve
// nodes a view that no longer moves while they could read the API server.
func TestTheRelayGivesUpOnWhatDoesNotPass(t *testing.T) {
	tooLarge := apierrors.NewTimeoutError("too large resource version", 1)
	tooLarge.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge}}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", fmt.Errorf("RBAC"))
	inStream := func(err *apierrors.StatusError) step {
		w := watch.NewFakeWithChanSize(1, false)
		w.Error(&err.ErrStatus)
		return step{w: w}
	}
	unavailable := apierrors.NewServiceUnavailable("down")
	for name, tc := range map[string]struct {
		steps []step
		cause string
	}{
		"forbidden":            {[]step{{err: forbidden}}, "RBAC"},
		"unauthorized":         {[]step{{err: apierrors.NewUnauthorized("token")}}, "token"},
		"too large":            {[]step{{err: tooLarge}}, "too large"},
		"forbidden, in stream": {[]step{inStream(forbidden)}, "RBAC"},
		"503 for too long":     {slices.Repeat([]step{{err: unavailable}}, 1000), "no watch for"},
		"a dial not answered":  {[]step{{block: true}}, "did not answer"},
		"watches that end at once, for too long": {func() (s []step) {
			for range 1000 {
				w := watch.NewFake()
				w.Stop()
				s = append(s, step{w: w})
			}
			return s
		}(), "each watch ended at once"},
	} {
		t.Run(name, func(t *testing.T) {
			c := failedAfterTheList(t, fast, tc.steps...)
			if err := c.Err(); !errors.Is(err, errUpstream) || !strings.Contains(err.Error(), tc.cause) {
				t.Fatalf("failed with %v, want the API server's pods (%s)", err, tc.cause)
			}
		})
	}
}

// A plain watch from "" or "0" starts with the state, in no order: it is
// never resumed from one of its versions (the reflector's watches start
// at a list's version).
func TestAWatchFromNoVersionIsNotResumed(t *testing.T) {
	for _, from := range []string{"", "0"} {
		first := watch.NewFakeWithChanSize(4, false)
		up := &scriptedUpstream{steps: []step{{w: first}, {w: watch.NewFake()}}, ctx: t.Context()}
		u := NewCache(0).Upstream(up)
		w, err := u.Watch(t.Context(), metav1.ListOptions{ResourceVersion: from})
		if err != nil {
			t.Fatal(err)
		}
		first.Add(rvPod("a", "30"))
		first.Add(rvPod("b", "20"))
		first.Stop()
		for range 2 {
			<-w.ResultChan()
		}
		select {
		case _, ok := <-w.ResultChan():
			if ok {
				t.Fatalf("from %q: an event past the watch's end", from)
			}
		case <-time.After(testutil.Timeout):
			t.Fatalf("from %q: the watch did not end", from)
		}
		if n := len(up.watches()); n != 1 {
			t.Errorf("a watch from %q resumed: %d watches", from, n)
		}
		w.Stop()
	}
}
