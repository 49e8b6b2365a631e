// Package nodeconfigs watches this node's NodeConfig object (cluster
// scoped, named after the node) and writes its status.
package nodeconfigs

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// GVR of NodeConfig.
var GVR = schema.GroupVersionResource{Group: "flock.fritzlab.net", Version: "v1alpha1", Resource: "nodeconfigs"}

// Watcher follows one NodeConfig.
type Watcher struct {
	dyn      dynamic.Interface
	node     string
	informer cache.SharedIndexInformer
	changed  chan struct{}
}

// New follows the NodeConfig named node with the NodeConfig informer of
// f (the one All uses: every node's NodeConfig is watched anyway, for the
// summaries' overlaps).
func New(f *kubeclient.Factory, dyn dynamic.Interface, node string) *Watcher {
	inf := f.Informer(GVR.String(), func() cache.SharedIndexInformer {
		return kubeclient.NewDynamicInformer(dyn, GVR, nil)
	})
	w := &Watcher{dyn: dyn, node: node, informer: inf, changed: make(chan struct{}, 1)}
	_, _ = inf.AddEventHandler(specChanges(func(u *unstructured.Unstructured) {
		if u.GetName() == node {
			notify(w.changed)
		}
	}))
	return w
}

// Changed receives a value (coalesced) after the spec changed: a new
// generation. Status writes (ours) bump resourceVersion, not generation,
// and do not count.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// Current is the NodeConfig as cached: its spec and generation. A spec
// that does not convert is an error (Wait and the agent's validation
// report it); no object is one too.
func (w *Watcher) Current() (*v1alpha1.NodeConfigSpec, int64, error) {
	obj, ok, err := w.informer.GetStore().GetByKey(w.node)
	if err != nil {
		return nil, 0, err
	}
	u, isU := obj.(*unstructured.Unstructured)
	if !ok || !isU {
		return nil, 0, fmt.Errorf("NodeConfig %q does not exist", w.node)
	}
	spec, err := SpecOf(u)
	return spec, u.GetGeneration(), err
}

// specChanges calls f with every object added, deleted, or updated with a
// new generation (a spec change: status writes do not count).
func specChanges(f func(*unstructured.Unstructured)) cache.ResourceEventHandler {
	call := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			f(u)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: call,
		UpdateFunc: func(o, n any) {
			ou, ok1 := o.(*unstructured.Unstructured)
			nu, ok2 := n.(*unstructured.Unstructured)
			if ok1 && ok2 && ou.GetGeneration() == nu.GetGeneration() {
				return
			}
			call(n)
		},
		DeleteFunc: call,
	}
}

// notify never blocks an informer: a pending value covers every change.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// SpecOf converts an object's spec.
func SpecOf(u *unstructured.Unstructured) (*v1alpha1.NodeConfigSpec, error) {
	raw, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("nodeconfig %s: no spec", u.GetName())
	}
	var spec v1alpha1.NodeConfigSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &spec); err != nil {
		return nil, fmt.Errorf("nodeconfig %s: spec: %w", u.GetName(), err)
	}
	return &spec, nil
}

// Wait returns the NodeConfig, waiting up to timeout for it to be created.
func (w *Watcher) Wait(ctx context.Context, timeout time.Duration) (*v1alpha1.NodeConfigSpec, int64, error) {
	deadline := time.Now().Add(timeout)
	for {
		u, err := w.dyn.Resource(GVR).Get(ctx, w.node, metav1.GetOptions{})
		if err == nil {
			spec, err := SpecOf(u)
			return spec, u.GetGeneration(), err
		}
		if time.Now().After(deadline) {
			if apierrors.IsNotFound(err) {
				return nil, 0, fmt.Errorf("NodeConfig %q does not exist (waited %s): create one for this node (see deploy/examples/nodeconfig.yaml)", w.node, timeout)
			}
			return nil, 0, fmt.Errorf("NodeConfig %q: %w", w.node, err)
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// UpdateStatus writes status through the status subresource.
func (w *Watcher) UpdateStatus(ctx context.Context, status v1alpha1.NodeConfigStatus) error {
	u, err := w.dyn.Resource(GVR).Get(ctx, w.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("NodeConfig %q status: %w", w.node, err)
	}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	if err != nil {
		return fmt.Errorf("NodeConfig %q status: %w", w.node, err)
	}
	u.Object["status"] = st
	if _, err := w.dyn.Resource(GVR).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("NodeConfig %q status: %w", w.node, err)
	}
	return nil
}
