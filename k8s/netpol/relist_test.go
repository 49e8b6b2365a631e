package netpol

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// reviewLW is an API server of pods whose watches the test breaks: a
// relist (or a watch-list) then drops a pod the informer did not see go,
// which client-go hands the handlers as a DeletedFinalStateUnknown made of
// the object its cache holds (a *trim.Pod).
type reviewLW struct {
	mu       sync.Mutex
	pods     map[string]*corev1.Pod
	rv       int
	watchers chan *watch.FakeWatcher
	noWL     bool
}

func (l *reviewLW) IsWatchListSemanticsUnSupported() bool { return l.noWL }

func (l *reviewLW) list(context.Context, metav1.ListOptions) (runtime.Object, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(l.rv)}}
	for _, p := range l.pods {
		out.Items = append(out.Items, *p.DeepCopy())
	}
	return out, nil
}

func (l *reviewLW) watch(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := watch.NewFakeWithChanSize(64, false)
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		for _, p := range l.pods {
			w.Add(p.DeepCopy())
		}
		w.Action(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: strconv.Itoa(l.rv),
			Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
	}
	select {
	case l.watchers <- w:
	default:
	}
	return w, nil
}

// A relist that misses a delete: every handler sees the tombstone in its
// own form (the engine's with a *corev1.Pod in it, flock's with the
// *trim.Pod), and the cache still holds only *trim.Pod; both through a
// list and through a watch-list (client-go's default).
func TestRelistTombstoneReachesEngineAsCorePod(t *testing.T) {
	for _, noWL := range []bool{true, false} {
		name := "watch-list"
		if noWL {
			name = "list"
		}
		t.Run(name, func(t *testing.T) {
			web, db := bulkyPod("a", "web"), bulkyPod("a", "db")
			web.ResourceVersion, db.ResourceVersion = "1", "2"
			db.Spec.NodeName = "node-a"
			l := &reviewLW{pods: map[string]*corev1.Pod{"a/web": web, "a/db": db}, rv: 2, watchers: make(chan *watch.FakeWatcher, 8), noWL: noWL}
			lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{ListWithContextFunc: l.list, WatchFuncWithContext: l.watch}, l)
			inf := cache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, cache.SharedIndexInformerOptions{
				Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
			if err := inf.SetTransform(trim.Transform); err != nil {
				t.Fatal(err)
			}
			engineRec, rawRec := &recorder{}, &recorder{}
			if _, err := (enginePods{inf: inf}).Informer().AddEventHandler(engineRec); err != nil {
				t.Fatal(err)
			}
			if _, err := inf.AddEventHandler(rawRec); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go inf.RunWithContext(ctx)
			if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
				t.Fatal("no sync")
			}
			engineRec.wait(t, 2)
			rawRec.wait(t, 2)
			var w *watch.FakeWatcher
			select {
			case w = <-l.watchers:
			case <-time.After(10 * time.Second):
				t.Fatal("no watch")
			}
			// db goes while the watch is broken: the relist does not have it.
			l.mu.Lock()
			delete(l.pods, "a/db")
			l.rv = 10
			l.mu.Unlock()
			w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old"})

			var engineTomb, rawTomb cache.DeletedFinalStateUnknown
			found := func(r *recorder, into *cache.DeletedFinalStateUnknown) bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				for _, e := range r.events {
					if ts, ok := e.obj.(cache.DeletedFinalStateUnknown); ok && e.op == "delete" {
						*into = ts
						return true
					}
				}
				return false
			}
			deadline := time.Now().Add(20 * time.Second)
			for !found(engineRec, &engineTomb) || !found(rawRec, &rawTomb) {
				if time.Now().After(deadline) {
					t.Fatalf("no tombstone after the relist: engine %+v, raw %+v", engineRec.events, rawRec.events)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if p, ok := engineTomb.Obj.(*corev1.Pod); !ok || engineTomb.Key != "a/db" || p.Name != "db" || p.Spec.NodeName != "node-a" {
				t.Errorf("the engine's tombstone: key %q, a %T (%+v), want a/db as *corev1.Pod", engineTomb.Key, engineTomb.Obj, engineTomb.Obj)
			}
			if p, ok := rawTomb.Obj.(*trim.Pod); !ok || rawTomb.Key != "a/db" || p.Name != "db" {
				t.Errorf("flock's tombstone: key %q, a %T, want a/db as *trim.Pod", rawTomb.Key, rawTomb.Obj)
			}
			for _, o := range inf.GetStore().List() {
				if _, ok := o.(*trim.Pod); !ok {
					t.Errorf("the cache holds a %T after the relist", o)
				}
			}
			if _, ok, _ := inf.GetStore().GetByKey("a/db"); ok {
				t.Error("a/db still cached after the relist")
			}
		})
	}
}
