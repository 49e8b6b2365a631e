package netpol

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// viewer is a handler that keeps what it was told: each pod's resource
// version by key.
type viewer struct {
	mu      sync.Mutex
	view    map[string]string
	initial int // adds in the informer's first list
	reg     cache.ResourceEventHandlerRegistration
}

func newViewer() *viewer { return &viewer{view: map[string]string{}} }

func (v *viewer) OnAdd(obj any, initial bool) {
	p := obj.(*corev1.Pod)
	v.mu.Lock()
	v.view[p.Namespace+"/"+p.Name] = p.ResourceVersion
	if initial {
		v.initial++
	}
	v.mu.Unlock()
}

func (v *viewer) OnUpdate(_, cur any) { v.OnAdd(cur, false) }

func (v *viewer) OnDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p := obj.(*corev1.Pod)
	v.mu.Lock()
	delete(v.view, p.Namespace+"/"+p.Name)
	v.mu.Unlock()
}

func (v *viewer) snapshot() (map[string]string, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return maps.Clone(v.view), v.initial
}

func storeView(inf cache.SharedIndexInformer) map[string]string {
	out := map[string]string{}
	for _, o := range inf.GetStore().List() {
		p := o.(*corev1.Pod)
		out[p.Namespace+"/"+p.Name] = p.ResourceVersion
	}
	return out
}

func onePod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: "1"}}
}

func newPodListener(client *fake.Clientset) oneListener {
	return newOneListener(coreinformers.NewPodInformer(client, metav1.NamespaceAll, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}))
}

// Handlers added before the first event share one registration; each one
// is told of every object of the first list before its HasSynced says
// so. One added once events flow gets a registration of its own, which
// client-go hands the store's objects; a removed one is told no more.
func TestOneListenerSharesOneRegistration(t *testing.T) {
	const n = 40
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, onePod(fmt.Sprintf("p%d", i)))
	}
	client := fake.NewClientset(objs...)
	inf := newPodListener(client)
	var early []*viewer
	for range 3 {
		v := newViewer()
		reg, err := inf.AddEventHandler(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := reg.(*member); !ok {
			t.Fatalf("a handler added before the informer started has a %T, not a shared registration", reg)
		}
		v.reg = reg
		early = append(early, v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.Run(ctx.Done())
	waitFor(t, "the shared registration to sync", func() bool { return early[0].reg.HasSynced() })
	for i, v := range early {
		if !v.reg.HasSynced() {
			t.Errorf("handler %d: not synced with the shared registration", i)
		}
		if view, initial := v.snapshot(); initial != n || len(view) != n {
			t.Errorf("handler %d synced having been told of %d objects (%d of the first list), want %d", i, len(view), initial, n)
		}
	}
	late := newViewer()
	reg, err := inf.AddEventHandler(late)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := reg.(*member); ok {
		t.Fatal("a handler added after the first event shares the registration: it would miss the objects before it")
	}
	late.reg = reg
	waitFor(t, "the late handler to sync", reg.HasSynced)
	if view, _ := late.snapshot(); len(view) != n {
		t.Errorf("the late handler synced having been told of %d objects, want %d", len(view), n)
	}
	if err := inf.RemoveEventHandler(early[1].reg); err != nil {
		t.Fatal(err)
	}
	if err := inf.RemoveEventHandler(late.reg); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("shop").Create(ctx, onePod("after"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the others to be told of a new pod", func() bool {
		a, _ := early[0].snapshot()
		b, _ := early[2].snapshot()
		return len(a) == n+1 && len(b) == n+1
	})
	time.Sleep(50 * time.Millisecond) // a removed handler told late would show now
	for name, v := range map[string]*viewer{"shared": early[1], "own": late} {
		if view, _ := v.snapshot(); len(view) != n {
			t.Errorf("the removed handler (%s registration) was told of %d objects after its removal", name, len(view)-n)
		}
	}
}

// A stopped informer takes no handler, shared or not, as client-go's:
// neither without any before, nor beside handlers that shared a
// registration never delivered an event (an empty store).
func TestOneListenerRefusesAHandlerOnceStopped(t *testing.T) {
	for _, shared := range []bool{false, true} {
		inf := newPodListener(fake.NewClientset())
		if shared {
			if _, err := inf.AddEventHandler(newViewer()); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); inf.Run(ctx.Done()) }()
		cancel()
		<-done
		if _, err := inf.AddEventHandler(newViewer()); err == nil {
			t.Errorf("a handler was added to a stopped informer (another added before it: %v)", shared)
		}
	}
}

// Handlers added before and after the events begin, and removed, while
// pods are created, updated and deleted from many goroutines. At each
// quiescent point every handler still added holds exactly the store (no
// event lost, none twice out of order), and a handler removed before a
// phase is told nothing of it. FLOCK_SEED=<n> repeats a run.
func TestOneListenerRandomized(t *testing.T) {
	seed := testutil.Seed(t)
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	var objs []runtime.Object
	for i := range 1 + r.IntN(30) {
		objs = append(objs, onePod(fmt.Sprintf("init-%d", i)))
	}
	client := fake.NewClientset(objs...)
	inf := newPodListener(client)
	var (
		mu      sync.Mutex
		live    []*viewer
		removed = map[*viewer]int{} // the phase it was removed before
	)
	add := func() {
		v := newViewer()
		reg, err := inf.AddEventHandler(v)
		if err != nil {
			t.Error(err)
			return
		}
		v.reg = reg
		mu.Lock()
		live = append(live, v)
		mu.Unlock()
	}
	for range 1 + r.IntN(4) {
		add()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.Run(ctx.Done())
	waitFor(t, "the informer to sync", inf.HasSynced)
	// The fake client's watch begins after its list: writes wait for it.
	waitFor(t, "the informer's watch", func() bool {
		for _, a := range client.Actions() {
			if a.GetVerb() == "watch" {
				return true
			}
		}
		return false
	})
	for phase := range 4 {
		var wg sync.WaitGroup
		for w := range 4 {
			g := rand.New(rand.NewPCG(uint64(seed), uint64(100*phase+w)))
			wg.Go(func() {
				pods := client.CoreV1().Pods("shop")
				var mine []string
				for i := range 30 {
					switch op := g.IntN(10); {
					case op < 5 || len(mine) == 0:
						name := fmt.Sprintf("ph%d-w%d-%d", phase, w, i)
						if _, err := pods.Create(ctx, onePod(name), metav1.CreateOptions{}); err != nil {
							t.Error(err)
						}
						mine = append(mine, name)
					case op < 8:
						p, err := pods.Get(ctx, mine[g.IntN(len(mine))], metav1.GetOptions{})
						if err != nil {
							t.Error(err)
							continue
						}
						p.Labels = map[string]string{"rev": fmt.Sprint(i)}
						if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
							t.Error(err)
						}
					default:
						j := g.IntN(len(mine))
						if err := pods.Delete(ctx, mine[j], metav1.DeleteOptions{}); err != nil {
							t.Error(err)
						}
						mine = append(mine[:j], mine[j+1:]...)
					}
					if g.IntN(15) == 0 {
						add() // shares nothing now: events flow
					}
				}
			})
		}
		wg.Wait()
		waitFor(t, fmt.Sprintf("phase %d: every handler to hold the store", phase), func() bool {
			want := storeView(inf)
			mu.Lock()
			defer mu.Unlock()
			for _, v := range live {
				if got, _ := v.snapshot(); !maps.Equal(got, want) {
					return false
				}
			}
			return true
		})
		for v, before := range removed {
			view, _ := v.snapshot()
			for k := range view {
				var ph int
				if _, err := fmt.Sscanf(k, "shop/ph%d-", &ph); err == nil && ph >= before {
					t.Errorf("phase %d: a handler removed before phase %d was told of %s", phase, before, k)
				}
			}
		}
		// Remove some before the next phase.
		mu.Lock()
		for i := 0; i < len(live); i++ {
			if len(live) > 1 && r.IntN(4) == 0 {
				v := live[i]
				if err := inf.RemoveEventHandler(v.reg); err != nil {
					t.Error(err)
				}
				removed[v] = phase + 1
				live = append(live[:i], live[i+1:]...)
				i--
			}
		}
		mu.Unlock()
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
