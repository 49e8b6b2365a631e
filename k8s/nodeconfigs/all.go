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

// NewAll watches every NodeConfig with the informer of f that New uses
// for node's (this node's: the others are cut to what All reads).
func NewAll(f *kubeclient.Factory, dyn dynamic.Interface, node string) *All {
	a := &All{changed: make(chan struct{}, 1)}
	a.informer = everyNode(f, dyn, node)
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

// HasSynced tells whether every NodeConfig has been listed: before, a
// node missing from Summaries, Exists or Names may only be unlisted yet.
func (a *All) HasSynced() bool { return a.informer.HasSynced() }

// Names are the nodes with a NodeConfig (as far as the cache knows).
func (a *All) Names() []string {
	return a.informer.GetStore().ListKeys()
}

// everyNode is the informer of every NodeConfig that New and NewAll share
// on f: node's whole, every other one cut to what All reads (othersCut).
func everyNode(f *kubeclient.Factory, dyn dynamic.Interface, node string) cache.SharedIndexInformer {
	return f.Informer(GVR.String(), func() cache.SharedIndexInformer {
		inf := kubeclient.NewDynamicInformer(dyn, GVR, nil)
		_ = inf.SetTransform(othersCut(node)) // before it starts: cannot fail
		return inf
	})
}

// othersCut is the transform that keeps of another node's NodeConfig only
// its identity, generation (specChanges) and its pools' CIDRs and whether
// they are shared (Summaries): a NodeConfig's status (its peers, its
// conditions) and the rest of its spec are most of it, and an agent
// holds every node's, 5,000 at Kubernetes' envelope. node's own is kept
// whole (Watcher reads its spec and status), and so is one whose spec
// does not parse (SpecOf: Summaries leaves it out, which a cut spec could
// not tell).
func othersCut(node string) cache.TransformFunc {
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GetName() == node {
			return obj, nil
		}
		if _, err := SpecOf(u); err != nil {
			return obj, nil
		}
		meta := map[string]any{}
		if m, ok := u.Object["metadata"].(map[string]any); ok {
			for _, k := range []string{"name", "uid", "resourceVersion", "generation"} {
				if v, ok := m[k]; ok {
					meta[k] = v
				}
			}
		}
		out := &unstructured.Unstructured{Object: map[string]any{"apiVersion": u.Object["apiVersion"], "kind": u.Object["kind"], "metadata": meta}}
		spec := u.Object["spec"].(map[string]any) // SpecOf found it
		cut := map[string]any{}
		if pools, ok := spec["pools"].([]any); ok {
			kept := make([]any, 0, len(pools))
			for _, p := range pools {
				pm, ok := p.(map[string]any)
				if !ok {
					continue // (SpecOf parsed it: not there)
				}
				one := map[string]any{}
				for _, k := range []string{"cidr", "shared"} {
					if v, ok := pm[k]; ok {
						one[k] = v
					}
				}
				kept = append(kept, one)
			}
			cut["pools"] = kept
		}
		out.Object["spec"] = cut
		return out, nil
	}
}
