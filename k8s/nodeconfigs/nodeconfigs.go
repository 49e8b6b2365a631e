// Package nodeconfigs watches this node's NodeConfig object (cluster
// scoped, named after the node) and writes its status.
package nodeconfigs

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
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
	running  atomic.Bool
}

// New watches the NodeConfig named node; Run delivers its versions.
func New(dyn dynamic.Interface, node string) *Watcher {
	inf := kubeclient.NewDynamicInformer(dyn, GVR, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
	})
	return &Watcher{dyn: dyn, node: node, informer: inf}
}

// Run runs the informer until ctx ends, calling onChange (from the
// informer's goroutine, one call at a time) with the spec as first listed
// and with every new generation after that. Status writes (ours) bump
// resourceVersion, not generation, and are not reported. A spec that does
// not convert is skipped: Wait and the agent's validation report it.
func (w *Watcher) Run(ctx context.Context, onChange func(spec *v1alpha1.NodeConfigSpec, generation int64)) error {
	if onChange == nil {
		return errors.New("nodeconfigs: Run needs an onChange callback")
	}
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("nodeconfigs: Run called twice")
	}
	changed := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GetName() != w.node {
			return
		}
		if spec, err := SpecOf(u); err == nil {
			onChange(spec, u.GetGeneration())
		}
	}
	// Registered before Start, so the first list is delivered too.
	reg, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed,
		UpdateFunc: func(o, n any) {
			ou, ok1 := o.(*unstructured.Unstructured)
			nu, ok2 := n.(*unstructured.Unstructured)
			if ok1 && ok2 && ou.GetGeneration() == nu.GetGeneration() {
				return
			}
			changed(n)
		},
	})
	if err != nil {
		return fmt.Errorf("nodeconfigs: %w", err)
	}
	w.informer.RunWithContext(ctx) // returns once its goroutines are done
	_ = w.informer.RemoveEventHandler(reg)
	return nil
}

// WaitSynced returns once the informer has listed the NodeConfig, or
// ctx.Err().
func (w *Watcher) WaitSynced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		return fmt.Errorf("nodeconfigs: informer did not sync: %w", ctx.Err())
	}
	return nil
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
