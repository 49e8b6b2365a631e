package nodeconfigs

import (
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// All watches every node's NodeConfig, for their summaries: a node must
// not advertise a summary that overlaps another node's.
type All struct {
	informer cache.SharedIndexInformer
	handler  cache.ResourceEventHandlerRegistration
	changed  chan struct{}
}

// NewAll watches every NodeConfig with an informer of f.
func NewAll(f *kubeclient.Factory, dyn dynamic.Interface) *All {
	a := &All{changed: make(chan struct{}, 1)}
	a.informer = f.Informer(GVR.String(), func() cache.SharedIndexInformer {
		return kubeclient.NewDynamicInformer(dyn, GVR, nil)
	})
	a.handler, _ = a.informer.AddEventHandler(specChanges(func(*unstructured.Unstructured) { notify(a.changed) }))
	return a
}

// Changed receives a value (coalesced) after a node's spec was added,
// changed or deleted.
func (a *All) Changed() <-chan struct{} { return a.changed }

// Summaries returns every node's summary pools (its non-shared pools), by
// node name. A spec that does not parse contributes nothing.
func (a *All) Summaries() map[string][]netip.Prefix {
	out := map[string][]netip.Prefix{}
	for _, obj := range a.informer.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		spec, err := SpecOf(u)
		if err != nil {
			continue
		}
		for _, p := range spec.Pools {
			if pfx, err := netip.ParsePrefix(p.CIDR); err == nil && !p.Shared {
				out[u.GetName()] = append(out[u.GetName()], pfx.Masked())
			}
		}
		slices.SortFunc(out[u.GetName()], func(x, y netip.Prefix) int { return x.Addr().Compare(y.Addr()) })
	}
	return out
}

// Exists tells whether node has a NodeConfig (as far as the cache knows).
func (a *All) Exists(node string) bool {
	_, ok, err := a.informer.GetStore().GetByKey(node)
	return ok && err == nil
}

// Names are the nodes with a NodeConfig (as far as the cache knows).
func (a *All) Names() []string {
	return a.informer.GetStore().ListKeys()
}
