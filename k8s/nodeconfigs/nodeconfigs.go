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
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// GVR of NodeConfig.
var GVR = schema.GroupVersionResource{Group: "flock.fritzlab.net", Version: "v1alpha1", Resource: "nodeconfigs"}

// Watcher follows one NodeConfig.
type Watcher struct {
	dyn      dynamic.Interface
	node     string
	factory  dynamicinformer.DynamicSharedInformerFactory
	informer cache.SharedIndexInformer
	// OnChange receives every new version of the spec (after the first Get).
	OnChange func(spec *v1alpha1.NodeConfigSpec, generation int64)
}

// New watches the NodeConfig named node.
func New(dyn dynamic.Interface, node string) *Watcher {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, "", func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
	})
	w := &Watcher{dyn: dyn, node: node, factory: f, informer: f.ForResource(GVR).Informer()}
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.changed(obj) },
		UpdateFunc: func(o, n any) { w.changedIfGeneration(o, n) },
	})
	return w
}

func (w *Watcher) changedIfGeneration(o, n any) {
	ou, ok1 := o.(*unstructured.Unstructured)
	nu, ok2 := n.(*unstructured.Unstructured)
	// Status writes (ours) bump resourceVersion, not generation.
	if ok1 && ok2 && ou.GetGeneration() == nu.GetGeneration() {
		return
	}
	w.changed(n)
}

func (w *Watcher) changed(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || w.OnChange == nil {
		return
	}
	spec, err := SpecOf(u)
	if err != nil {
		return // Get and the agent's validation report bad specs
	}
	w.OnChange(spec, u.GetGeneration())
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

// Start runs the informer until ctx ends.
func (w *Watcher) Start(ctx context.Context) { w.factory.Start(ctx.Done()) }

// Wait returns the NodeConfig, waiting up to timeout for it to be created.
func (w *Watcher) Wait(ctx context.Context, timeout time.Duration) (*v1alpha1.NodeConfigSpec, int64, error) {
	deadline := time.Now().Add(timeout)
	logged := false
	for {
		u, err := w.dyn.Resource(GVR).Get(ctx, w.node, metav1.GetOptions{})
		if err == nil {
			spec, err := SpecOf(u)
			return spec, u.GetGeneration(), err
		}
		if !apierrors.IsNotFound(err) && !logged {
			logged = true
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
		return err
	}
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	if err != nil {
		return err
	}
	u.Object["status"] = st
	_, err = w.dyn.Resource(GVR).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}
