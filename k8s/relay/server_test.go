package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func seeded(t *testing.T, n int) (*upstream, *Cache) {
	t.Helper()
	up, c := newUpstream(), NewCache(0)
	if err := up.attach(c); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		up.apply(fmt.Sprintf("ns/p%d", i), func(*corev1.Pod) *corev1.Pod { return testPod("ns", fmt.Sprintf("p%d", i), i) })
	}
	return up, c
}

// A watcher cut off resumes from its resource version: the changes it
// missed meanwhile arrive, none twice, none lost.
func TestWatchResumesWhereItWas(t *testing.T) {
	up, c := seeded(t, 10)
	r := startRelay(t, c)
	api := fake.NewClientset()
	publish(t, api, map[string]*relayUnderTest{"relay-a": r})
	n := newNode(t, api, testToken)
	if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	lists := func() int { return int(c.listsServed.Load()) }
	// client-go lists again after a watch cut within a second of no
	// events; a longer one, it resumes.
	up.apply("ns/p1", func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{"app": "x"}; return p })
	time.Sleep(1500 * time.Millisecond)
	before := lists()
	r.srv.CloseClientConnections()
	for i := range 10 {
		up.apply(fmt.Sprintf("ns/p%d", i), func(p *corev1.Pod) *corev1.Pod {
			if i%3 == 0 {
				return nil
			}
			p.Labels = map[string]string{"app": "moved"}
			return p
		})
	}
	if err := converged(n, up.snapshot(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := lists(); got != before {
		t.Fatalf("the node listed again (%d initial snapshots, %d before the cut): it should have resumed", got, before)
	}
}

// Updates that change nothing trim keeps are not sent; the others are,
// once each.
func TestUnchangedUpdatesAreNotSent(t *testing.T) {
	up, c := seeded(t, 3)
	events := func() int { c.mu.Lock(); defer c.mu.Unlock(); return int(c.seq) + len(c.ring) }
	before := events()
	up.apply("ns/p1", func(p *corev1.Pod) *corev1.Pod {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		p.Annotations = map[string]string{"noise": "more"}
		p.Spec.Containers[0].Image = "registry.example/app:2"
		return p
	})
	if got := events(); got != before {
		t.Fatalf("%d events for an update trim does not see, want none", got-before)
	}
	up.apply("ns/p1", func(p *corev1.Pod) *corev1.Pod { p.Status.PodIPs = []corev1.PodIP{{IP: "2001:db8::1"}}; return p })
	up.apply("ns/p2", func(*corev1.Pod) *corev1.Pod { return nil })
	if got := events(); got != before+2 {
		t.Fatalf("%d events for an address and a delete, want 2", got-before)
	}
	// The resource version still moved: bookmarks and lists say so.
	_, rv, _, err := c.snapshot()
	if err != nil || formatRV(rv) != formatRV(up.rv) {
		t.Fatalf("cache at %d (%v), want %d", rv, err, up.rv)
	}
}

// A relay's informer listing again delivers changes out of order: the
// relay stops serving rather than serve a history with holes.
func TestCacheFailsOnARelist(t *testing.T) {
	for name, relist := range map[string]func(cache.ResourceEventHandler){
		"a delete it missed": func(h cache.ResourceEventHandler) {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/p0", Obj: testPod("ns", "p0", 0)})
		},
		"an older resource version": func(h cache.ResourceEventHandler) {
			p := testPod("ns", "p1", 1)
			p.ResourceVersion = "101"
			p.Labels = map[string]string{"app": "relisted"}
			h.OnUpdate(p, p)
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, c := seeded(t, 3)
			relist(c.Handler())
			select {
			case <-c.Failed():
			default:
				t.Fatal("cache still serving")
			}
			if _, _, _, err := c.snapshot(); err == nil || !strings.Contains(err.Error(), "listed again") {
				t.Fatalf("snapshot: %v, want the relist named", err)
			}
		})
	}
}

// Bad requests are refused with the field and value named, as the API
// server refuses them (a Status of the right code).
func TestRefusals(t *testing.T) {
	_, c := seeded(t, 2)
	r := startRelay(t, c)
	pool := x509.NewCertPool()
	pool.AddCert(r.srv.Certificate())
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "example.com"}}}
	for _, tc := range []struct {
		name, path, token, accept string
		code                      int
		says                      string
	}{
		{"no token", PodsPath, "", mediaType, 401, "no bearer token"},
		{"bad token", PodsPath, "stolen", mediaType, 401, `token "stolen"`},
		{"JSON only", PodsPath, testToken, "application/json", 406, `Accept "application/json"`},
		{"a label selector", PodsPath + "?labelSelector=app%3Dx", testToken, mediaType, 400, `labelSelector "app=x"`},
		{"a field selector", PodsPath + "?watch=1&fieldSelector=spec.nodeName%3Dn1", testToken, mediaType, 400, `fieldSelector "spec.nodeName=n1"`},
		{"initial events without bookmarks", PodsPath + "?watch=1&sendInitialEvents=true", testToken, mediaType, 400, "allowWatchBookmarks"},
		{"a bad resource version", PodsPath + "?watch=1&resourceVersion=abc", testToken, mediaType, 400, `resource version "abc"`},
		{"another path", "/api/v1/namespaces/ns/pods", testToken, mediaType, 404, "/api/v1/namespaces/ns/pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, r.srv.URL+tc.path, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			req.Header.Set("Accept", tc.accept)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.says) {
				t.Fatalf("%d %q, want %d naming %q", resp.StatusCode, body, tc.code, tc.says)
			}
		})
	}
}

// A watch from before what the relay holds is told to list again (410),
// and the node does, from the relay.
func TestTooOldAWatchListsAgain(t *testing.T) {
	up, c := newUpstream(), NewCache(5)
	if err := up.attach(c); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		up.apply(fmt.Sprintf("ns/p%d", i), func(*corev1.Pod) *corev1.Pod { return testPod("ns", fmt.Sprintf("p%d", i), i) })
	}
	r := startRelay(t, c)
	api := fake.NewClientset()
	publish(t, api, map[string]*relayUnderTest{"relay-a": r})
	n := newNode(t, api, testToken)
	if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.from(up.rv - 6); err == nil {
		t.Fatal("a watch from before the history was accepted")
	}
	before := c.listsServed.Load()
	r.srv.CloseClientConnections()
	for i := range 20 { // more than the history holds
		up.apply(fmt.Sprintf("ns/q%d", i), func(*corev1.Pod) *corev1.Pod { return testPod("ns", fmt.Sprintf("q%d", i), i) })
	}
	if err := converged(n, up.snapshot(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if c.listsServed.Load() == before {
		t.Fatal("the node did not list again")
	}
}

// Refused by every relay (here: its token), a node reads the API server.
func TestNoRelayMeansTheAPIServer(t *testing.T) {
	_, c := seeded(t, 2)
	r := startRelay(t, c)
	api := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "from-api", ResourceVersion: "1"}})
	publish(t, api, map[string]*relayUnderTest{"relay-a": r})
	n := newNodeWith(t, api, "not-the-token", true) // the fake API cannot stream lists
	want := map[string]*corev1.Pod{"ns/from-api": {ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "from-api"}}}
	if err := converged(n, want, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	n.source.mu.Lock()
	using := n.source.using
	n.source.mu.Unlock()
	if using != "the API server" {
		t.Fatalf("pods from %q", using)
	}
}

// A watch quiet for longer than the write timeout stays open (HTTP/2
// resets a stream whose write deadline passes, written to or not): the
// next change arrives on it, and the node does not list again.
func TestAQuietWatchStaysOpen(t *testing.T) {
	up, c := seeded(t, 3)
	r := startRelay(t, c)
	r.relay.WriteTimeout, r.relay.Bookmark = 100*time.Millisecond, time.Hour
	api := fake.NewClientset()
	publish(t, api, map[string]*relayUnderTest{"relay-a": r})
	n := newNode(t, api, testToken)
	if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	lists := c.listsServed.Load()
	up.apply("ns/p0", func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{"app": "x"}; return p })
	time.Sleep(time.Second) // quiet, ten write timeouts
	up.apply("ns/p1", func(p *corev1.Pod) *corev1.Pod { p.Labels = map[string]string{"app": "y"}; return p })
	if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := c.listsServed.Load(); got != lists {
		t.Fatalf("the node listed again (%d snapshots, %d before): its watch was cut while quiet", got, lists)
	}
}

// counted is a relay whose metrics are read by the test.
func counted(t *testing.T, c *Cache, coalesce time.Duration) (*relayUnderTest, *Metrics) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	return startRelayWith(t, c, func(s *Server) { s.Metrics, s.Coalesce, s.Bookmark = m, coalesce, time.Hour }), m
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// Under churn a watch's events go out a flush an interval, which gzip
// compresses better than a flush an event: the same changes cost a
// watcher fewer bytes, and every one of them arrives.
func TestEventsOfAnIntervalGoOutTogether(t *testing.T) {
	up, c := seeded(t, 50)
	each, eachM := counted(t, c, -1)
	together, togetherM := counted(t, c, 250*time.Millisecond)
	var nodes []*node
	for i, r := range []*relayUnderTest{each, together} {
		api := fake.NewClientset()
		publish(t, api, map[string]*relayUnderTest{fmt.Sprint("relay-", i): r})
		n := newNode(t, api, testToken)
		if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	before := [2]float64{counter(t, eachM.Bytes), counter(t, togetherM.Bytes)}
	sentBefore := [2]float64{counter(t, eachM.Events), counter(t, togetherM.Events)}
	const changes = 150
	for i := range changes {
		up.apply(fmt.Sprintf("ns/p%d", i%50), func(p *corev1.Pod) *corev1.Pod {
			p.Labels = map[string]string{"app": fmt.Sprint("v", i)}
			return p
		})
		time.Sleep(3 * time.Millisecond)
	}
	for _, n := range nodes {
		if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range []*Metrics{eachM, togetherM} {
		if got := counter(t, m.Events) - sentBefore[i]; got != changes {
			t.Fatalf("relay %d sent %v events for %d changes", i, got, changes)
		}
	}
	one, batched := counter(t, eachM.Bytes)-before[0], counter(t, togetherM.Bytes)-before[1]
	t.Logf("%d changes: %.0f bytes flushed an event, %.0f an interval", changes, one, batched)
	if batched > 0.85*one {
		t.Errorf("flushed an interval, the watch cost %.0f bytes; flushed an event, %.0f", batched, one)
	}
}
