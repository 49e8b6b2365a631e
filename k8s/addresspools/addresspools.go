// Package addresspools watches the AddressPools (cluster-scoped) and the
// namespaces' labels (for the pools' namespaceSelector), the inputs of the
// agent's authorization decision (agent/authz), and writes the pools'
// status.claims and the node's entry of status.inUse.
//
// Use: New, go Run(ctx, onChange), WaitSynced, then Pools and
// NamespaceLabels; UpdateClaims and UpdateInUse from time to time.
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
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
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
	running    atomic.Bool

	mu     sync.Mutex
	logged map[string]string // pool name → resourceVersion whose conversion error was logged
}

// New builds the informers (AddressPools through dyn, Namespaces through
// namespaces); Run runs them. log nil: slog.Default().
func New(dyn dynamic.Interface, namespaces Namespaces, log *slog.Logger) *Watcher {
	if log == nil {
		log = slog.Default()
	}
	ns := kubeclient.NewInformer(namespaces, &corev1.Namespace{}, nil)
	// Only names and labels matter: keep the cache small. Set before Run,
	// so it cannot fail.
	_ = ns.SetTransform(func(obj any) (any, error) {
		n, ok := obj.(*corev1.Namespace)
		if !ok {
			return obj, nil // a tombstone
		}
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels,
		}}, nil
	})
	return &Watcher{
		dyn: dyn, log: log,
		pools: kubeclient.NewDynamicInformer(dyn, GVR, nil), namespaces: ns,
		logged: map[string]string{},
	}
}

// Run runs the informers until ctx ends, then returns nil. Once both have
// listed, it calls onChange once, then again after every change of a
// pool's spec (a pool added, changed or deleted) or of a namespace's labels
// (a namespace added or deleted, its labels changed); status-only writes
// (UpdateClaims, UpdateInUse) do not count. Changes that arrive while
// onChange runs are coalesced into one more call; all calls come from
// Run's goroutine.
func (w *Watcher) Run(ctx context.Context, onChange func()) error {
	if onChange == nil {
		return errors.New("address pools: Run needs an onChange callback")
	}
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("address pools: Run called twice")
	}
	kick := make(chan struct{}, 1)
	signal := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	poolReg, err := w.pools.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { signal() },
		UpdateFunc: func(o, n any) {
			ou, ok1 := o.(*unstructured.Unstructured)
			nu, ok2 := n.(*unstructured.Unstructured)
			if ok1 && ok2 && ou.GetGeneration() == nu.GetGeneration() && reflect.DeepEqual(ou.Object["spec"], nu.Object["spec"]) {
				return // status or metadata only
			}
			signal()
		},
		DeleteFunc: func(any) { signal() },
	})
	if err != nil {
		return fmt.Errorf("address pools: %w", err)
	}
	defer func() { _ = w.pools.RemoveEventHandler(poolReg) }()
	nsReg, err := w.namespaces.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { signal() },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Namespace)
			nn, ok2 := n.(*corev1.Namespace)
			if ok1 && ok2 && labels.Equals(on.Labels, nn.Labels) {
				return
			}
			signal()
		},
		DeleteFunc: func(any) { signal() },
	})
	if err != nil {
		return fmt.Errorf("address pools: namespaces: %w", err)
	}
	defer func() { _ = w.namespaces.RemoveEventHandler(nsReg) }()

	var running sync.WaitGroup
	defer running.Wait() // after ctx ended: the informers' goroutines are done
	running.Go(func() { w.pools.RunWithContext(ctx) })
	running.Go(func() { w.namespaces.RunWithContext(ctx) })

	if !cache.WaitForCacheSync(ctx.Done(), w.pools.HasSynced, w.namespaces.HasSynced) {
		return nil // ctx ended
	}
	// The first call covers everything listed so far.
	select {
	case <-kick:
	default:
	}
	onChange()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
			onChange()
		}
	}
}

// WaitSynced returns once both informers have listed, or an error
// wrapping ctx.Err().
func (w *Watcher) WaitSynced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), w.pools.HasSynced) {
		return fmt.Errorf("address pools: informer did not sync: %w", ctx.Err())
	}
	if !cache.WaitForCacheSync(ctx.Done(), w.namespaces.HasSynced) {
		return fmt.Errorf("address pools: namespace informer did not sync: %w", ctx.Err())
	}
	return nil
}

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

// Pools returns the cached AddressPools, sorted by name. An object that
// does not convert is skipped (and logged once per resourceVersion); the
// API server's schema makes that rare. The pools are not validated:
// authz.Compile does that.
func (w *Watcher) Pools() []v1alpha1.AddressPool {
	var out []v1alpha1.AddressPool
	for _, u := range w.cached() {
		var ap v1alpha1.AddressPool
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ap); err != nil {
			w.logBad(u, err)
			continue
		}
		out = append(out, ap)
	}
	return out
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
