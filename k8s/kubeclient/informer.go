package kubeclient

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// ListerWatcher is what an informer needs of a client. Resource, the
// dynamic client's resources and client-go's typed clients (and fakes)
// all have these methods.
type ListerWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Tweak edits the options of every list and watch (selectors).
type Tweak func(*metav1.ListOptions)

// NewInformer builds an informer of example's type (say &corev1.Pod{}) as
// client-go's informer factories do: no resync, indexed by namespace.
// tweak may be nil. Run it with RunWithContext.
func NewInformer[L runtime.Object](lw ListerWatcher[L], example runtime.Object, tweak Tweak) cache.SharedIndexInformer {
	return newInformer(lw, lw, example, "", tweak)
}

// NewDynamicInformer builds an informer of gvr's objects (cluster wide,
// as *unstructured.Unstructured) as dynamicinformer's factory does.
func NewDynamicInformer(dyn dynamic.Interface, gvr schema.GroupVersionResource, tweak Tweak) cache.SharedIndexInformer {
	return newInformer(dyn.Resource(gvr), dyn, &unstructured.Unstructured{}, gvr.String(), tweak)
}

// newInformer builds the informer; client is what tells the reflector
// whether it can stream the first list through a watch (WatchList):
// client-go's fakes cannot, and say so (IsWatchListSemanticsUnSupported).
func newInformer[L runtime.Object](lw ListerWatcher[L], client any, example runtime.Object, description string, tweak Tweak) cache.SharedIndexInformer {
	apply := func(o *metav1.ListOptions) {
		if tweak != nil {
			tweak(o)
		}
	}
	wrapped := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			apply(&o)
			return lw.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			apply(&o)
			return lw.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(wrapped, client), example, cache.SharedIndexInformerOptions{
		Indexers:          cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		ObjectDescription: description,
	})
}
