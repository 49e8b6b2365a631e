// Package addresspools watches the AddressPools (cluster-scoped) and the
// namespaces' labels (for the pools' namespaceSelector), the inputs of the
// authorization decision (k8s/authz), and writes the pools'
// status.claims and the node's entry of status.inUse.
//
// Use: New, go Run(ctx, onChange), WaitSynced, then Pools and
// NamespaceLabels; UpdateReady, UpdateClaims and UpdateInUse from time to
// time.
package addresspools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/decode"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// Namespaces is the Namespace API: kubeclient's and client-go's typed
// clients both fit.
type Namespaces interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.NamespaceList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// GVR of AddressPool.
var GVR = v1alpha1.GroupVersion.WithResource(v1alpha1.AddressPoolResource)

// Watcher caches the AddressPools and the namespaces' labels.
type Watcher struct {
	dyn        dynamic.Interface
	log        *slog.Logger
	pools      cache.SharedIndexInformer
	namespaces cache.SharedIndexInformer
	changed    chan struct{}
	// handlers are the event handlers' registrations (synced: every event
	// of the first lists delivered).
	handlers []cache.ResourceEventHandlerRegistration

	mu     sync.Mutex
	logged map[string]string // pool name → resourceVersion whose conversion error was logged
}

// New takes the informers of AddressPools (through dyn) and Namespaces
// (through namespaces) from f. log nil: slog.Default().
func New(f *kubeclient.Factory, dyn dynamic.Interface, namespaces Namespaces, log *slog.Logger) *Watcher {
	if log == nil {
		log = slog.Default()
	}
	ns := f.Informer("namespaces", func() cache.SharedIndexInformer {
		ns := kubeclient.NewInformer(namespaces, &corev1.Namespace{}, nil)
		// Only names and labels matter: keep the cache small. Set before
		// it runs, so it cannot fail.
		_ = ns.SetTransform(func(obj any) (any, error) {
			n, ok := obj.(*corev1.Namespace)
			if !ok {
				return obj, nil // a tombstone
			}
			return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
				Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels,
			}}, nil
		})
		return ns
	})
	w := &Watcher{
		dyn: dyn, log: log, changed: make(chan struct{}, 1),
		pools:      f.Informer(GVR.String(), func() cache.SharedIndexInformer { return kubeclient.NewDynamicInformer(dyn, GVR, nil) }),
		namespaces: ns,
		logged:     map[string]string{},
	}
	pr, _ := w.pools.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { w.notify() },
		UpdateFunc: func(o, n any) {
			ou, ok1 := o.(*unstructured.Unstructured)
			nu, ok2 := n.(*unstructured.Unstructured)
			if ok1 && ok2 && ou.GetGeneration() == nu.GetGeneration() && reflect.DeepEqual(ou.Object["spec"], nu.Object["spec"]) {
				return // status or metadata only
			}
			w.notify()
		},
		DeleteFunc: func(any) { w.notify() },
	})
	nr, _ := w.namespaces.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { w.notify() },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Namespace)
			nn, ok2 := n.(*corev1.Namespace)
			if ok1 && ok2 && labels.Equals(on.Labels, nn.Labels) {
				return
			}
			w.notify()
		},
		DeleteFunc: func(any) { w.notify() },
	})
	w.handlers = []cache.ResourceEventHandlerRegistration{pr, nr}
	return w
}

// notify never blocks an informer: a pending value covers every change.
func (w *Watcher) notify() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Changed receives a value (coalesced) after a pool's spec changed (a
// pool added, changed or deleted) or a namespace's labels did (a
// namespace added or deleted, its labels changed); status-only writes
// (UpdateClaims, UpdateInUse) do not count. Read Pools and
// NamespaceLabels again then.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// cached returns the cached AddressPool objects (shared with the cache: do
// not modify), sorted by name.
func (w *Watcher) cached() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range w.pools.GetStore().List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b *unstructured.Unstructured) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// Pools returns the cached AddressPools, sorted by name. An object whose
// spec does not convert is skipped (and logged once per resourceVersion,
// naming the fields); the API server's schema makes that rare. The pools
// are not validated: authz.Compile does that.
func (w *Watcher) Pools() []v1alpha1.AddressPool {
	var out []v1alpha1.AddressPool
	for _, u := range w.cached() {
		ap, err := convert(u)
		if err != nil {
			w.logBad(u, err)
			continue
		}
		out = append(out, ap)
	}
	return out
}

// convert converts a cached object; an error names every field that does
// not convert, by its path ("spec.use: cannot unmarshal string "pod" into
// a list"), in one line. A status that does not convert is left out (the
// agents write their parts of it again): the pool is its spec.
func convert(u *unstructured.Unstructured) (v1alpha1.AddressPool, error) {
	var ap v1alpha1.AddressPool
	if err := decode.FromUnstructured(u.Object, &ap, ""); err == nil {
		return ap, nil
	}
	noStatus := make(map[string]any, len(u.Object))
	for k, v := range u.Object {
		if k != "status" {
			noStatus[k] = v
		}
	}
	ap = v1alpha1.AddressPool{}
	if err := decode.FromUnstructured(noStatus, &ap, ""); err != nil {
		return v1alpha1.AddressPool{}, errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return ap, nil
}

func (w *Watcher) logBad(u *unstructured.Unstructured, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	name, rv := u.GetName(), u.GetResourceVersion()
	if seen, ok := w.logged[name]; ok && seen == rv {
		return
	}
	w.logged[name] = rv
	w.log.Error("AddressPool does not convert; ignoring it", "pool", name, "resourceVersion", rv, "err", err)
}

// NamespaceLabels returns the labels of namespace ns (an empty, non-nil
// set for a namespace without labels), or nil if the cache does not know
// the namespace.
func (w *Watcher) NamespaceLabels(ns string) labels.Set {
	obj, ok, err := w.namespaces.GetStore().GetByKey(ns)
	if err != nil || !ok {
		return nil
	}
	n, ok := obj.(*corev1.Namespace)
	if !ok {
		return nil
	}
	out := labels.Set{}
	maps.Copy(out, n.Labels)
	return out
}

// UpdateClaims writes status.claims (through the status subresource) of
// every cached pool whose count in counts (absent: 0) differs from what it
// shows. Several agents write the same numbers: an equal count is skipped,
// and a conflict is retried once against the object as the API server has
// it now (skipped if that already shows the count). A pool deleted
// meanwhile is skipped. The errors of all pools are joined.
func (w *Watcher) UpdateClaims(ctx context.Context, counts map[string]int) error {
	var errs []error
	for _, u := range w.cached() {
		name := u.GetName()
		want := int64(min(max(counts[name], 0), math.MaxInt32))
		if claimsOf(u) == want {
			continue
		}
		err := w.writeClaims(ctx, u.DeepCopy(), want)
		if apierrors.IsConflict(err) {
			var fresh *unstructured.Unstructured
			fresh, err = w.dyn.Resource(GVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				if claimsOf(fresh) == want {
					continue
				}
				err = w.writeClaims(ctx, fresh, want)
			}
		}
		switch {
		case err == nil, apierrors.IsNotFound(err):
		default:
			errs = append(errs, fmt.Errorf("AddressPool %s: write status.claims %d: %w", name, want, err))
		}
	}
	return errors.Join(errs...)
}

func (w *Watcher) writeClaims(ctx context.Context, u *unstructured.Unstructured, n int64) error {
	if n == 0 {
		unstructured.RemoveNestedField(u.Object, "status", "claims") // omitempty, as the Go type
	} else if err := unstructured.SetNestedField(u.Object, n, "status", "claims"); err != nil {
		return err
	}
	_, err := w.dyn.Resource(GVR).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}

// claimsOf reads status.claims (0 when absent or not a number).
func claimsOf(u *unstructured.Unstructured) int64 {
	v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "claims")
	if !ok {
		return 0
	}
	switch n := v.(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	case int:
		return int64(n)
	case float64:
		return int64(n)
	}
	return 0
}
