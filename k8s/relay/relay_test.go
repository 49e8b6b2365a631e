package relay

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

const testToken = "node-token"

type tokenAuth struct{}

func (tokenAuth) Authorize(_ context.Context, token string) error {
	if token != testToken {
		return fmt.Errorf("%w: token %q", ErrUnauthorized, token)
	}
	return nil
}

// upstream is a model of the API server's pods: every change gets the
// next resource version and reaches the relay's handler in that order, as
// an informer delivers them.
type upstream struct {
	mu   sync.Mutex
	rv   uint64
	pods map[string]*corev1.Pod
	hs   map[*Cache]cache.ResourceEventHandler
}

func newUpstream() *upstream {
	return &upstream{rv: 100, pods: map[string]*corev1.Pod{}, hs: map[*Cache]cache.ResourceEventHandler{}}
}

// attach feeds a new relay cache the current pods and opens it.
func (u *upstream) attach(c *Cache) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	h := c.Handler()
	u.hs[c] = h
	for _, p := range u.pods {
		h.OnAdd(p, true)
	}
	return c.Live(strconv.FormatUint(u.rv, 10))
}

func (u *upstream) detach(c *Cache) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.hs, c)
}

func (u *upstream) apply(key string, edit func(p *corev1.Pod) *corev1.Pod) {
	u.mu.Lock()
	defer u.mu.Unlock()
	old := u.pods[key]
	var cp *corev1.Pod
	if old != nil {
		cp = old.DeepCopy()
	}
	cur := edit(cp)
	u.rv++
	switch {
	case cur == nil && old == nil:
		return
	case cur == nil:
		gone := old.DeepCopy()
		gone.ResourceVersion = strconv.FormatUint(u.rv, 10)
		delete(u.pods, key)
		for _, h := range u.hs {
			h.OnDelete(gone)
		}
	default:
		cur.ResourceVersion = strconv.FormatUint(u.rv, 10)
		u.pods[key] = cur
		for _, h := range u.hs {
			if old == nil {
				h.OnAdd(cur, false)
			} else {
				h.OnUpdate(old, cur)
			}
		}
	}
}

func (u *upstream) snapshot() map[string]*corev1.Pod {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string]*corev1.Pod, len(u.pods))
	for k, p := range u.pods {
		out[k] = trim.Trimmed(p)
	}
	return out
}

func testPod(ns, name string, i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("uid-%s-%s-%d", ns, name, i)),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%7)}, Annotations: map[string]string{"noise": "dropped"}},
		Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%5), Containers: []corev1.Container{
			{Name: "c", Image: "registry.example/app:1", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		// An address: other nodes are sent it (seenByOthers).
		Status: corev1.PodStatus{Phase: corev1.PodPending, PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("fd00:7e57::%x", i)}}},
	}
}

// relayUnderTest is a relay's HTTPS server and what points a node at it.
type relayUnderTest struct {
	srv   *httptest.Server
	relay *Server
	entry Entry
}

func startRelay(t *testing.T, c *Cache) *relayUnderTest {
	t.Helper()
	return startRelayWith(t, c, nil)
}

// startRelayWith starts a relay whose Server set changes first.
func startRelayWith(t *testing.T, c *Cache, set func(*Server)) *relayUnderTest {
	t.Helper()
	s := &Server{Cache: c, Auth: tokenAuth{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Bookmark: 200 * time.Millisecond}
	if set != nil {
		set(s)
	}
	srv := httptest.NewUnstartedServer(s)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(func() { s.Stop(); srv.CloseClientConnections(); srv.Close() })
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return &relayUnderTest{srv: srv, relay: s, entry: Entry{URL: srv.URL, Certificate: string(cert), ServerName: "example.com"}}
}

// node is a node's informer of pods through a PodSource.
type node struct {
	api    *fake.Clientset
	source *PodSource
	inf    cache.SharedIndexInformer
	cancel context.CancelFunc
	done   chan struct{}
}

func newNode(t *testing.T, api *fake.Clientset, token string) *node {
	return newNodeWith(t, api, token, false)
}

func newNodeWith(t *testing.T, api *fake.Clientset, token string, noWatchList bool) *node {
	return newNamedNode(t, api, token, noWatchList, "n1")
}

// newNamedNode is a node of that name (its order of the relays).
func newNamedNode(t *testing.T, api *fake.Clientset, token string, noWatchList bool, name string) *node {
	t.Helper()
	dir := t.TempDir()
	tf := filepath.Join(dir, "token")
	if err := os.WriteFile(tf, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	src := &PodSource{API: api.CoreV1().Pods(""), Directory: api.CoreV1().ConfigMaps("flock-system"), Node: name, TokenFile: tf,
		Refresh: time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), NoWatchList: noWatchList}
	n := &node{api: api, source: src, done: make(chan struct{})}
	n.inf = kubeclient.NewInformer(src, &trim.Pod{}, nil)
	_ = n.inf.SetTransform(trim.Transform)
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { defer close(n.done); n.inf.RunWithContext(ctx) }()
	t.Cleanup(n.stop)
	return n
}

func (n *node) stop() {
	n.cancel()
	<-n.done
}

// publish lists the relays in the node's directory.
func publish(t *testing.T, api *fake.Clientset, relays map[string]*relayUnderTest) {
	t.Helper()
	data := map[string]string{}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: "flock-system"}, Data: data}
	for name, r := range relays {
		if err := Publish(context.Background(), api.CoreV1().ConfigMaps("flock-system"), name, r.entry); err != nil {
			t.Fatal(err)
		}
	}
	if len(relays) == 0 {
		_ = api.CoreV1().ConfigMaps("flock-system").Delete(context.Background(), cm.Name, metav1.DeleteOptions{})
	}
}

// converged waits for the node's cache to hold what want holds, as trim
// keeps it (resource versions aside: updates that change nothing are not
// sent). The node's informer transforms with trim.Transform: its cache
// holds *trim.Pod, compared with trim.NewPod of want's.
func converged(n *node, want map[string]*corev1.Pod, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := sameAs(n.inf.GetStore(), want, n.source.Node, strings.HasPrefix(n.source.Using(), "relay"))
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sameAs: store holds want's pods as the node reads them: the whole UID
// of its own pods (of every pod, for a node without a name), of other
// pods the whole UID (the API server's) or its start (the relays'). From
// relays (relayed), a named node holds other nodes' pods only while they
// have addresses.
func sameAs(store cache.Store, want map[string]*corev1.Pod, node string, relayed bool) error {
	var errs []error
	got := map[string]*trim.Pod{}
	for _, o := range store.List() {
		p, ok := o.(*trim.Pod)
		if !ok {
			errs = append(errs, fmt.Errorf("a %T in the node's cache, want *trim.Pod", o))
			continue
		}
		got[p.Namespace+"/"+p.Name] = p
	}
	keys := make([]string, 0, len(want)+len(got))
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		var w *trim.Pod
		if p := want[k]; p != nil && (!relayed || node == "" || p.Spec.NodeName == node || len(p.Status.PodIPs) > 0) {
			w = trim.NewPod(p)
		}
		g := got[k]
		switch {
		case g == nil && w == nil: // not the node's to hold
		case g == nil:
			errs = append(errs, fmt.Errorf("%s missing", k))
		case w == nil:
			errs = append(errs, fmt.Errorf("%s held, deleted upstream", k))
		case !trim.Unchanged(w, withUID(g, w, node)):
			errs = append(errs, fmt.Errorf("%s differs: labels %v ips %v phase %s, want %v %v %s", k, g.Labels, g.Status.PodIPs, g.Status.Phase, w.Labels, w.Status.PodIPs, w.Status.Phase))
		}
		if len(errs) > 5 {
			break
		}
	}
	return errors.Join(errs...)
}

func TestInformerFollowsTheRelay(t *testing.T) {
	for _, noWatchList := range []bool{false, true} {
		t.Run(fmt.Sprintf("watch-list %t", !noWatchList), func(t *testing.T) { testInformerFollowsTheRelay(t, noWatchList) })
	}
}

func testInformerFollowsTheRelay(t *testing.T, noWatchList bool) {
	up := newUpstream()
	c := NewCache(0)
	if err := up.attach(c); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		up.apply(fmt.Sprintf("ns/p%d", i), func(*corev1.Pod) *corev1.Pod { return testPod("ns", fmt.Sprintf("p%d", i), i) })
	}
	r := startRelay(t, c)
	api := fake.NewClientset()
	publish(t, api, map[string]*relayUnderTest{"relay-a": r})
	n := newNodeWith(t, api, testToken, noWatchList)
	if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
		t.Fatalf("initial: %v", err)
	}
	up.apply("ns/p3", func(p *corev1.Pod) *corev1.Pod {
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: "2001:db8::3"}}
		return p
	})
	up.apply("ns/p4", func(*corev1.Pod) *corev1.Pod { return nil })
	up.apply("ns/p5", func(p *corev1.Pod) *corev1.Pod { p.Labels["app"] = "other"; return p })
	if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
		t.Fatalf("after changes: %v", err)
	}
	if n.source.using != "relay relay-a" {
		t.Fatalf("pods from %q, want relay relay-a", n.source.using)
	}
}

// withUID is g with w's whole UID if the relays may send node g's short
// (another node's pod) and did.
func withUID(g, w *trim.Pod, node string) *trim.Pod {
	if g.UID == w.UID || node == "" || w.Spec.NodeName == node || g.UID != trim.ShortUID(w.UID) {
		return g
	}
	c := *g
	c.UID = w.UID
	return &c
}

// TestEachNodeIsSentTheUIDsItReads: a node is sent the whole UID of its
// own pods, and of other pods only their start (trim.ShortUID: enough to
// tell incarnations apart, which the tracker does with claims); in a
// list, in a watch's initial events and in its events. A request that
// names no node (flock-policy before the header) is sent every UID
// whole: its tracker matches whole UIDs.
func TestEachNodeIsSentTheUIDsItReads(t *testing.T) {
	eachWatchMode(t, func(t *testing.T, up *upstream, c *Cache, noWatchList bool) {
		pod := func(name, node string) func(*corev1.Pod) *corev1.Pod {
			return func(*corev1.Pod) *corev1.Pod {
				p := testPod("ns", name, 1)
				p.UID = types.UID("0b5e6c1a-2f3d-4e5f-8a9b-" + name)
				p.Spec.NodeName = node
				return p
			}
		}
		up.apply("ns/own", pod("own", "n1"))
		up.apply("ns/other", pod("other", "n2"))
		r := startRelay(t, c)
		api := fake.NewClientset()
		publish(t, api, map[string]*relayUnderTest{"relay-a": r})
		n1 := newNamedNode(t, api, testToken, noWatchList, "n1")
		anon := newNamedNode(t, api, testToken, noWatchList, "")
		check := func(when string, whole map[string]bool) {
			t.Helper()
			for _, n := range []*node{n1, anon} {
				if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
					t.Fatalf("%s, node %q: %v", when, n.source.Node, err)
				}
				for name, own := range whole {
					o, ok, _ := n.inf.GetStore().GetByKey("ns/" + name)
					if !ok {
						t.Fatalf("%s, node %q: ns/%s missing", when, n.source.Node, name)
					}
					want := types.UID("0b5e6c1a-2f3d-4e5f-8a9b-" + name)
					if !own && n != anon {
						want = "0b5e6c1a"
					}
					if uid := o.(*trim.Pod).UID; uid != want {
						t.Fatalf("%s, node %q: ns/%s has UID %q, want %q", when, n.source.Node, name, uid, want)
					}
				}
			}
		}
		check("initial", map[string]bool{"own": true, "other": false})
		up.apply("ns/own2", pod("own2", "n1"))
		up.apply("ns/other2", pod("other2", "n3"))
		up.apply("ns/own", func(p *corev1.Pod) *corev1.Pod { p.Labels["app"] = "changed"; return p })
		up.apply("ns/other", func(p *corev1.Pod) *corev1.Pod { p.Labels["app"] = "changed"; return p })
		check("after changes", map[string]bool{"own": true, "own2": true, "other": false, "other2": false})
	})
}

// TestOtherNodesAreSentPodsWithAddresses: a node is sent another node's
// pod only while it has addresses (in a list, a watch's initial events and
// its events): added when it gains them, deleted when it loses them or
// goes. Its own pods and requests naming no node are sent every pod.
func TestOtherNodesAreSentPodsWithAddresses(t *testing.T) {
	eachWatchMode(t, func(t *testing.T, up *upstream, c *Cache, noWatchList bool) {
		pod := func(name, node string, ips ...string) func(*corev1.Pod) *corev1.Pod {
			return func(*corev1.Pod) *corev1.Pod {
				p := testPod("ns", name, 1)
				p.Spec.NodeName = node
				p.Status.PodIPs = nil
				for _, ip := range ips {
					p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
				}
				return p
			}
		}
		ips := func(ips ...string) func(*corev1.Pod) *corev1.Pod {
			return func(p *corev1.Pod) *corev1.Pod {
				p.Status.PodIPs = nil
				for _, ip := range ips {
					p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
				}
				return p
			}
		}
		// Before the nodes: what they list.
		up.apply("ns/own-pending", pod("own-pending", "n1"))
		up.apply("ns/other-pending", pod("other-pending", "n2"))
		up.apply("ns/other-up", pod("other-up", "n2", "2001:db8::1"))
		r := startRelay(t, c)
		api := fake.NewClientset()
		publish(t, api, map[string]*relayUnderTest{"relay-a": r})
		n1 := newNamedNode(t, api, testToken, noWatchList, "n1")
		anon := newNamedNode(t, api, testToken, noWatchList, "")
		// The addresses of the pods n1's handlers are told are deleted:
		// a handler removes a pod from where it was by them.
		var mu sync.Mutex
		deleted := map[string][][]string{} // each delete's addresses, by pod
		if _, err := n1.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(o any) {
			p := o.(*trim.Pod)
			ips := []string{}
			for _, ip := range p.Status.PodIPs {
				ips = append(ips, ip.IP)
			}
			mu.Lock()
			defer mu.Unlock()
			deleted[p.Name] = append(deleted[p.Name], ips)
		}}); err != nil {
			t.Fatal(err)
		}
		wasDeleted := func(name string, ips ...string) {
			t.Helper()
			testutil.WaitFor(t, fmt.Sprintf("n1's handlers told %s is deleted, with %v", name, ips), func() bool {
				mu.Lock()
				defer mu.Unlock()
				return slices.ContainsFunc(deleted[name], func(got []string) bool { return slices.Equal(got, append([]string{}, ips...)) })
			})
		}
		check := func(when string, n1Holds ...string) {
			t.Helper()
			for _, n := range []*node{n1, anon} {
				if err := converged(n, up.snapshot(), 10*time.Second); err != nil {
					t.Fatalf("%s, node %q: %v", when, n.source.Node, err)
				}
				if !strings.HasPrefix(n.source.Using(), "relay") {
					t.Fatalf("%s, node %q: pods from %q, want a relay", when, n.source.Node, n.source.Using())
				}
			}
			// converged knows the rule; the keys say it plainly too.
			got := n1.inf.GetStore().ListKeys()
			slices.Sort(got)
			slices.Sort(n1Holds)
			if !slices.Equal(got, n1Holds) {
				t.Fatalf("%s: node n1 holds %v, want %v", when, got, n1Holds)
			}
			if all := anon.inf.GetStore().ListKeys(); len(all) != len(up.snapshot()) {
				t.Fatalf("%s: a node without a name holds %v, want every pod (%d)", when, all, len(up.snapshot()))
			}
		}
		check("listed", "ns/own-pending", "ns/other-up")
		up.apply("ns/other-new", pod("other-new", "n3"))
		up.apply("ns/other-pending", ips("2001:db8::2", "198.51.100.2"))
		check("other-pending given addresses", "ns/own-pending", "ns/other-up", "ns/other-pending")
		up.apply("ns/other-up", ips())
		up.apply("ns/other-new", func(p *corev1.Pod) *corev1.Pod { p.Labels["app"] = "relabelled"; return p })
		check("other-up's addresses taken", "ns/own-pending", "ns/other-pending")
		wasDeleted("other-up", "2001:db8::1")
		up.apply("ns/other-up", ips("2001:db8::3"))
		up.apply("ns/other-new", func(*corev1.Pod) *corev1.Pod { return nil })
		up.apply("ns/own-pending", func(*corev1.Pod) *corev1.Pod { return nil })
		check("other-up readdressed, others deleted", "ns/other-pending", "ns/other-up")
		// A delete is sent whatever the node holds (it may hold a pod
		// without addresses from the API server).
		wasDeleted("other-new")
		up.apply("ns/other-up", ips())
		up.apply("ns/other-up", func(*corev1.Pod) *corev1.Pod { return nil })
		check("other-up's addresses taken, then deleted", "ns/other-pending")
		wasDeleted("other-up", "2001:db8::3")
	})
}

// eachWatchMode runs f against a cache fed by up, for a node that lists
// then watches and for one whose watch streams the list.
func eachWatchMode(t *testing.T, f func(t *testing.T, up *upstream, c *Cache, noWatchList bool)) {
	for _, noWatchList := range []bool{false, true} {
		t.Run(fmt.Sprintf("watch-list %t", !noWatchList), func(t *testing.T) {
			up := newUpstream()
			c := NewCache(0)
			if err := up.attach(c); err != nil {
				t.Fatal(err)
			}
			f(t, up, c, noWatchList)
		})
	}
}
