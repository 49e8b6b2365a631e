package netpol

import (
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// enginePods is the factory's pod informer as the engine takes it: a
// coreinformers.PodInformer of *corev1.Pod. The cache holds *trim.Pod
// (a third of a corev1.Pod's size, one for each pod of the cluster);
// what the engine is given of it (its handlers' objects, its lister's
// and its indexer's answers) is made as it asks, from the cached pod
// (trim.Pod.Core), and is garbage once it is done. The engine reads only
// what trim keeps.
//
// Its handlers are handed only node's pods (all, if node is ""): the
// engine's one pod handler (third_party/.../controller.go) returns at
// once for a pod on another node, which is nearly every pod event of the
// cluster, and a pod made for it was most of what flock-policy allocated
// under churn (TestEngineHandlerReadsOnlyItsNodesPods holds the engine's
// source to this).
type enginePods struct {
	inf  cache.SharedIndexInformer
	node string
}

var _ coreinformers.PodInformer = enginePods{}

func (e enginePods) Informer() cache.SharedIndexInformer { return engineInformer{e.inf, e.node} }

func (e enginePods) Lister() corelisters.PodLister {
	return engineLister{trim.NewPodLister(e.inf.GetIndexer())}
}

// errEngineIndex: an index of the engine's would read *corev1.Pod, which
// the cache does not hold (the engine adds one only without
// Config.PodsByIP, which flock always sets).
var errEngineIndex = errors.New("netpol: the pod cache holds trimmed pods: the engine cannot index it")

// engineInformer is the pod informer the engine sees.
type engineInformer struct {
	cache.SharedIndexInformer
	node string
}

func (i engineInformer) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	return i.SharedIndexInformer.AddEventHandler(coreHandler{h, i.node})
}

func (i engineInformer) AddEventHandlerWithResyncPeriod(h cache.ResourceEventHandler, resync time.Duration) (cache.ResourceEventHandlerRegistration, error) {
	return i.SharedIndexInformer.AddEventHandlerWithResyncPeriod(coreHandler{h, i.node}, resync)
}

func (i engineInformer) AddEventHandlerWithOptions(h cache.ResourceEventHandler, o cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	return i.SharedIndexInformer.AddEventHandlerWithOptions(coreHandler{h, i.node}, o)
}

// SetTransform keeps trim's: the engine's drops managed fields, which
// trim drops too, and a transform of its would be handed *trim.Pod.
func (i engineInformer) SetTransform(cache.TransformFunc) error { return nil }

func (i engineInformer) AddIndexers(cache.Indexers) error { return errEngineIndex }

func (i engineInformer) GetIndexer() cache.Indexer {
	return coreIndexer{i.SharedIndexInformer.GetIndexer()}
}

func (i engineInformer) GetStore() cache.Store {
	return coreIndexer{i.SharedIndexInformer.GetIndexer()}
}

// core is obj as the engine reads it: a cached pod as a *corev1.Pod (in
// a tombstone too); anything else as it is.
func core(obj any) any {
	switch o := obj.(type) {
	case *trim.Pod:
		return o.Core()
	case cache.DeletedFinalStateUnknown:
		if p, ok := o.Obj.(*trim.Pod); ok {
			o.Obj = p.Core()
		}
		return o
	}
	return obj
}

func coreAll(objs []any) []any {
	out := make([]any, len(objs))
	for i, o := range objs {
		out[i] = core(o)
	}
	return out
}

// coreHandler hands h the engine's form of each object, of node's pods
// (every pod if node is "").
type coreHandler struct {
	h    cache.ResourceEventHandler
	node string
}

// elsewhere: obj is a pod on another node than c's.
func (c coreHandler) elsewhere(obj any) bool {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*trim.Pod)
	return ok && c.node != "" && p.Spec.NodeName != c.node
}

func (c coreHandler) OnAdd(obj any, initial bool) {
	if !c.elsewhere(obj) {
		c.h.OnAdd(core(obj), initial)
	}
}

// OnUpdate: the engine reads the pod as it is now (a pod's node never
// changes once set).
func (c coreHandler) OnUpdate(old, cur any) {
	if !c.elsewhere(cur) {
		c.h.OnUpdate(core(old), core(cur))
	}
}

func (c coreHandler) OnDelete(obj any) {
	if !c.elsewhere(obj) {
		c.h.OnDelete(core(obj))
	}
}

// coreIndexer answers the engine's reads of the cache in its form; it
// refuses writes (the cache is the informer's).
type coreIndexer struct{ cache.Indexer }

var errEngineWrite = errors.New("netpol: the engine may not write the pod cache")

func (c coreIndexer) Add(any) error                    { return errEngineWrite }
func (c coreIndexer) Update(any) error                 { return errEngineWrite }
func (c coreIndexer) Delete(any) error                 { return errEngineWrite }
func (c coreIndexer) Replace([]any, string) error      { return errEngineWrite }
func (c coreIndexer) AddIndexers(cache.Indexers) error { return errEngineIndex }

func (c coreIndexer) List() []any { return coreAll(c.Indexer.List()) }

func (c coreIndexer) Get(obj any) (any, bool, error) {
	o, ok, err := c.Indexer.Get(obj)
	return core(o), ok, err
}

func (c coreIndexer) GetByKey(key string) (any, bool, error) {
	o, ok, err := c.Indexer.GetByKey(key)
	return core(o), ok, err
}

func (c coreIndexer) Index(name string, obj any) ([]any, error) {
	objs, err := c.Indexer.Index(name, obj)
	return coreAll(objs), err
}

func (c coreIndexer) ByIndex(name, value string) ([]any, error) {
	objs, err := c.Indexer.ByIndex(name, value)
	return coreAll(objs), err
}

// engineLister is the engine's pod lister over the cache.
type engineLister struct{ l trim.PodLister }

func (e engineLister) List(sel labels.Selector) ([]*corev1.Pod, error) {
	ps, err := e.l.List(sel)
	return corePods(ps), err
}

func (e engineLister) Pods(namespace string) corelisters.PodNamespaceLister {
	return engineNSLister{e.l, namespace}
}

type engineNSLister struct {
	l  trim.PodLister
	ns string
}

func (e engineNSLister) List(sel labels.Selector) ([]*corev1.Pod, error) {
	ps, err := e.l.Pods(e.ns).List(sel)
	return corePods(ps), err
}

func (e engineNSLister) Get(name string) (*corev1.Pod, error) {
	p, err := e.l.Pods(e.ns).Get(name)
	if err != nil {
		return nil, err
	}
	return p.Core(), nil
}

func corePods(ps []*trim.Pod) []*corev1.Pod {
	if ps == nil {
		return nil
	}
	out := make([]*corev1.Pod, len(ps))
	for i, p := range ps {
		out[i] = p.Core()
	}
	return out
}

// enginePodsByIP is lookup in the engine's form (Config.PodsByIP).
func enginePodsByIP(lookup func(ip string) []*trim.Pod) func(ip string) []*corev1.Pod {
	return func(ip string) []*corev1.Pod { return corePods(lookup(ip)) }
}

// engineExtraPodIPs is f in the engine's form (Config.ExtraPodIPs): f
// reads a pod's namespace and name.
func engineExtraPodIPs(f func(*trim.Pod) []string) func(*corev1.Pod) []string {
	if f == nil {
		return nil
	}
	return func(p *corev1.Pod) []string {
		return f(&trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
	}
}
