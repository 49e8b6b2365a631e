package relay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
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
			// A watch-list's is taken once its reader took the bookmark
			// (passing): a moment after the receive above.
			for deadline := time.Now().Add(5 * time.Second); u.ListRV() == "" && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
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
	relay, err := (&PodSource{TokenFile: tf}).newClient(r.entry)
	if err != nil {
		t.Fatal(err)
	}
	tru := true
	opts := metav1.ListOptions{ResourceVersion: "200", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, SendInitialEvents: &tru, AllowWatchBookmarks: true}
	if _, err := relay.watch.Watch(t.Context(), opts); !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		t.Fatalf("watch-list not older than 200 from a relay at 103: %v, want too large", err)
	}
	if _, err := relay.pods.List(t.Context(), metav1.ListOptions{ResourceVersion: "200", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}); !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
		t.Fatalf("list not older than 200 from a relay at 103: %v, want too large", err)
	}
	// Reached while it waits: served.
	go func() {
		time.Sleep(200 * time.Millisecond)
		up.apply("ns/p0", func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{"app": "104"}; return p })
	}()
	opts.ResourceVersion = "104"
	w, err := relay.watch.Watch(t.Context(), opts)
	if err != nil {
		t.Fatalf("watch-list not older than 104, reached within the wait: %v", err)
	}
	w.Stop()
	// A plain watch from 106 while the relay is at 104: the changes at
	// 105 and 106 are the node's already; 107 is sent.
	w, err = relay.watch.Watch(t.Context(), metav1.ListOptions{ResourceVersion: "106", AllowWatchBookmarks: false})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 3 {
		up.apply("ns/p1", func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{"app": string(rune('a' + i))}; return p })
	}
	select {
	case ev := <-w.ResultChan():
		// Decoded straight into the form flock-policy caches.
		if rv := ev.Object.(*trim.Pod).ResourceVersion; rv != "107" {
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

// A node is never served older state than it has. The reflector asks for
// "" (the newest, which the API server reads from etcd) after a source
// said it had not reached the node's version; a relay behind the node
// (it came from a relay ahead, or from the API server) must not answer
// that from its cache: the node's informer would delete the pods it has
// that the relay has not seen yet, and policies would drop their traffic
// until the relay caught up. The relays are asked for state not older
// than the node's newest (a list's, an event's or a bookmark's); the API
// server answers "" itself.
func TestANodeIsNeverServedOlderThanItHas(t *testing.T) {
	up := newUpstream()
	ahead, behind, current := NewCache(0), NewCache(0), NewCache(0)
	for _, c := range []*Cache{ahead, behind} {
		if err := up.attach(c); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		up.apply(fmt.Sprintf("ns/p%d", i), func(*corev1.Pod) *corev1.Pod { return testPod("ns", fmt.Sprintf("p%d", i), i) })
	}
	up.apply("ns/p0", func(*corev1.Pod) *corev1.Pod { return nil })
	for i := 10; i < 13; i++ {
		up.apply(fmt.Sprintf("ns/p%d", i), func(*corev1.Pod) *corev1.Pod { return testPod("ns", fmt.Sprintf("p%d", i), i) })
	}
	quick := func(s *Server) { s.Wait = 200 * time.Millisecond }
	relays := map[string]*relayUnderTest{"relay-ahead": startRelayWith(t, ahead, quick), "relay-behind": startRelayWith(t, behind, quick)}
	// The API server holds what upstream holds.
	api := fake.NewClientset()
	for _, p := range up.snapshot() {
		if _, err := api.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, api, map[string]*relayUnderTest{"relay-ahead": relays["relay-ahead"]})
	tf := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tf, []byte(testToken), 0o600); err != nil {
		t.Fatal(err)
	}
	src := &PodSource{API: api.CoreV1().Pods(""), Directory: api.CoreV1().ConfigMaps("flock-system"), Node: "n1", TokenFile: tf, Refresh: time.Millisecond}
	names := func(l *corev1.PodList) []string {
		var out []string
		for _, p := range l.Items {
			out = append(out, p.Name)
		}
		slices.Sort(out)
		return out
	}
	want := []string{"p1", "p10", "p11", "p12", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"}
	l, err := src.List(t.Context(), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil || !slices.Equal(names(l), want) || src.Using() != "relay relay-ahead" {
		t.Fatalf("first list: %v from %q (%v), want %v from relay-ahead", names(l), src.Using(), err, want)
	}
	// A watch's events count too: the node has p13 from it, which the
	// relay behind (at the list's version) has not seen.
	up.detach(behind)
	w, err := src.Watch(t.Context(), metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	up.apply("ns/p13", func(*corev1.Pod) *corev1.Pod { return testPod("ns", "p13", 13) })
	if _, err := api.CoreV1().Pods("ns").Create(t.Context(), trim.Trimmed(up.pods["ns/p13"]), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = append(want, "p13")
	slices.Sort(want)
	select {
	case ev := <-w.ResultChan():
		if p, ok := ev.Object.(*trim.Pod); !ok || p.Name != "p13" {
			t.Fatalf("event %v %T, want p13 added", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
	w.Stop()
	// Only the relay behind is left: "" is the API server's to answer.
	publish(t, api, map[string]*relayUnderTest{"relay-behind": relays["relay-behind"]})
	if err := Withdraw(t.Context(), api.CoreV1().ConfigMaps("flock-system"), "relay-ahead"); err != nil {
		t.Fatal(err)
	}
	l, err = src.List(t.Context(), metav1.ListOptions{ResourceVersion: ""})
	if err != nil || !slices.Equal(names(l), want) || src.Using() != "the API server" {
		t.Fatalf("list of the newest with a relay behind: %v from %q (%v), want %v from the API server", names(l), src.Using(), err, want)
	}
	tru := true
	ws, err := src.Watch(t.Context(), metav1.ListOptions{SendInitialEvents: &tru, AllowWatchBookmarks: true, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil || src.Using() != "the API server" {
		t.Fatalf("watch-list of the newest with a relay behind: from %q (%v), want the API server", src.Using(), err)
	}
	ws.Stop()
	// A relay that has caught up answers it.
	if err := up.attach(current); err != nil {
		t.Fatal(err)
	}
	relays["relay-current"] = startRelayWith(t, current, quick)
	publish(t, api, relays)
	if err := Withdraw(t.Context(), api.CoreV1().ConfigMaps("flock-system"), "relay-ahead"); err != nil {
		t.Fatal(err)
	}
	l, err = src.List(t.Context(), metav1.ListOptions{ResourceVersion: ""})
	if err != nil || !slices.Equal(names(l), want) || src.Using() != "relay relay-current" {
		t.Fatalf("list of the newest with a relay current: %v from %q (%v), want %v from relay-current", names(l), src.Using(), err, want)
	}
}

// A watch passed on (the node's source records versions, the relay's
// upstream the end of a watch-list) ends when it is stopped, even with an
// event in hand that nobody reads any more.
func TestAPassedWatchEndsWhenStopped(t *testing.T) {
	in := watch.NewFakeWithChanSize(1, false)
	in.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ResourceVersion: "7"}})
	taken := make(chan watch.Event, 1)
	w := passing(in, func(e *watch.Event) func() { return func() { taken <- *e } })
	time.Sleep(50 * time.Millisecond) // the goroutine holds the event
	w.Stop()
	select {
	case <-w.(*passingWatch).out:
	case <-time.After(5 * time.Second):
		t.Fatal("the goroutine still holds the event after Stop")
	}
	if len(taken) != 0 {
		t.Fatal("an event nobody read was counted as taken")
	}
}
