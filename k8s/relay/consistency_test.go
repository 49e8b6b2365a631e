package relay

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// fakeUpstream is the API server's pods as the relay's informer sees
// them: a list at listRV, and a watch the test feeds.
type fakeUpstream struct {
	listRV string
	w      *watch.FakeWatcher
}

func (f *fakeUpstream) List(context.Context, metav1.ListOptions) (*corev1.PodList, error) {
	return &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: f.listRV}}, nil
}

func (f *fakeUpstream) Watch(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return f.w, nil
}

// Once live, a relist of the relay's informer fails the cache before its
// objects reach the handler: they come in list order, and one newer than
// a change still to come would be sent first (a node would then resume
// past that change and never see it).
func TestARelistFailsTheCacheBeforeItsObjects(t *testing.T) {
	up, c := seeded(t, 3)
	u := c.Upstream(&fakeUpstream{listRV: "500", w: watch.NewFake()})
	before := len(c.ring)
	if _, err := u.List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Failed():
	default:
		t.Fatal("a relist once live left the cache serving")
	}
	// The relist's objects: none is sent.
	up.apply("ns/p0", func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{"app": "newer"}; return p })
	if len(c.ring) != before {
		t.Fatalf("%d events after the cache failed", len(c.ring)-before)
	}
	// A watch that streams a list is a relist too.
	_, c2 := seeded(t, 1)
	tru := true
	if _, err := c2.Upstream(&fakeUpstream{w: watch.NewFake()}).Watch(t.Context(), metav1.ListOptions{SendInitialEvents: &tru}); err != nil {
		t.Fatal(err)
	}
	if c2.Ready() == nil {
		t.Fatal("a watch-list once live left the cache serving")
	}
	// Before Live, the first list is no relist.
	c3 := NewCache(0)
	if _, err := c3.Upstream(&fakeUpstream{listRV: "7", w: watch.NewFake()}).List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if c3.Err() != nil {
		t.Fatalf("the first list failed the cache: %v", c3.Err())
	}
}

// Live starts at the first list's resource version, which Upstream
// learns from a list or from the bookmark that ends a watch-list's
// initial events: changes after it that are still on their way to the
// handler are in order, not a relist.
func TestLiveStartsAtTheFirstList(t *testing.T) {
	for name, first := range map[string]func(*Upstream, *fakeUpstream) error{
		"list": func(u *Upstream, _ *fakeUpstream) error {
			_, err := u.List(context.Background(), metav1.ListOptions{})
			return err
		},
		"watch-list": func(u *Upstream, f *fakeUpstream) error {
			tru := true
			w, err := u.Watch(context.Background(), metav1.ListOptions{SendInitialEvents: &tru})
			if err != nil {
				return err
			}
			go f.w.Action(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "150",
				Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
			<-w.ResultChan()
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := NewCache(0)
			f := &fakeUpstream{listRV: "150", w: watch.NewFake()}
			u := c.Upstream(f)
			if err := first(u, f); err != nil {
				t.Fatal(err)
			}
			if u.ListRV() != "150" {
				t.Fatalf("list at %q, want 150", u.ListRV())
			}
			h := c.Handler()
			p := testPod("ns", "p", 0)
			p.ResourceVersion = "140"
			h.OnAdd(p, true)
			if err := c.Live(u.ListRV()); err != nil {
				t.Fatal(err)
			}
			q := p.DeepCopy()
			q.ResourceVersion, q.Labels = "160", map[string]string{"app": "new"}
			h.OnUpdate(p, q) // queued when Live ran
			if err := c.Ready(); err != nil {
				t.Fatalf("an in-order change failed the cache: %v", err)
			}
			if n := len(c.ring); n != 1 {
				t.Fatalf("%d events, want the change at 160", n)
			}
		})
	}
}

// A request for a resource version the relay has not reached waits for
// it, then is told "too large" (the node asks elsewhere); it is never
// answered with older state. A plain watch from there is not sent what
// the node already has.
func TestNotOlderThanAsked(t *testing.T) {
	up, c := seeded(t, 3) // at 103
	r := startRelay(t, c)
	tf := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tf, []byte(testToken), 0o600); err != nil {
		t.Fatal(err)
	}
	pods, err := (&PodSource{TokenFile: tf}).newClient(r.entry)
	if err != nil {
		t.Fatal(err)
	}
	tru := true
	opts := metav1.ListOptions{ResourceVersion: "200", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, SendInitialEvents: &tru, AllowWatchBookmarks: true}
	if _, err := pods.Watch(t.Context(), opts); !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		t.Fatalf("watch-list not older than 200 from a relay at 103: %v, want too large", err)
	}
	if _, err := pods.List(t.Context(), metav1.ListOptions{ResourceVersion: "200", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}); !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		t.Fatalf("list not older than 200 from a relay at 103: %v, want too large", err)
	}
	// Reached while it waits: served.
	go func() {
		time.Sleep(200 * time.Millisecond)
		up.apply("ns/p0", func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{"app": "104"}; return p })
	}()
	opts.ResourceVersion = "104"
	w, err := pods.Watch(t.Context(), opts)
	if err != nil {
		t.Fatalf("watch-list not older than 104, reached within the wait: %v", err)
	}
	w.Stop()
	// A plain watch from 106 while the relay is at 104: the changes at
	// 105 and 106 are the node's already; 107 is sent.
	w, err = pods.Watch(t.Context(), metav1.ListOptions{ResourceVersion: "106", AllowWatchBookmarks: false})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 3 {
		up.apply("ns/p1", func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{"app": string(rune('a' + i))}; return p })
	}
	select {
	case ev := <-w.ResultChan():
		if rv := ev.Object.(*corev1.Pod).ResourceVersion; rv != "107" {
			t.Fatalf("first event at %s, want 107", rv)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
}

// A relist after the first list but before Live fails the cache too: its
// objects may reach the handler after Live, in list order, and Live
// would start at the first list's version.
func TestARelistBeforeLiveFailsTheCache(t *testing.T) {
	c := NewCache(0)
	f := &fakeUpstream{listRV: "100", w: watch.NewFake()}
	u := c.Upstream(f)
	if _, err := u.List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	// A continuation page is the same list.
	if _, err := u.List(t.Context(), metav1.ListOptions{Continue: "page-2"}); err != nil {
		t.Fatal(err)
	}
	if c.Err() != nil {
		t.Fatalf("a continuation failed the cache: %v", c.Err())
	}
	f.listRV = "200"
	if _, err := u.List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Live(u.ListRV()); err != nil {
		t.Fatal(err)
	}
	if c.Ready() == nil {
		t.Fatal("a relist before Live left the cache serving")
	}
	a := testPod("ns", "a", 0)
	a.ResourceVersion = "150"
	c.Handler().OnAdd(a, false)
	if len(c.ring) != 0 {
		t.Fatalf("%d events sent by a failed cache", len(c.ring))
	}
}
