package nodeconfigs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// All watches every node's NodeConfig, for their summaries: a node must
// not advertise a summary that overlaps another node's.
type All struct {
	informer cache.SharedIndexInformer
	running  atomic.Bool
}

// NewAll watches every NodeConfig.
func NewAll(dyn dynamic.Interface) *All {
	return &All{informer: kubeclient.NewDynamicInformer(dyn, GVR, nil)}
}

// Run runs the informer until ctx ends; onChange is called when a node's
// spec is added, changed or deleted.
func (a *All) Run(ctx context.Context, onChange func()) error {
	if onChange == nil {
		return errors.New("nodeconfigs: Run needs an onChange callback")
	}
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("nodeconfigs: Run called twice")
	}
	reg, err := a.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { onChange() },
		UpdateFunc: func(o, n any) {
			ou, ok1 := o.(*unstructured.Unstructured)
			nu, ok2 := n.(*unstructured.Unstructured)
			if ok1 && ok2 && ou.GetGeneration() == nu.GetGeneration() {
				return // a status write
			}
			onChange()
		},
		DeleteFunc: func(any) { onChange() },
	})
	if err != nil {
		return fmt.Errorf("nodeconfigs: %w", err)
	}
	a.informer.RunWithContext(ctx) // returns once its goroutines are done
	_ = a.informer.RemoveEventHandler(reg)
	return nil
}

// WaitSynced returns once the informer has synced.
func (a *All) WaitSynced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), a.informer.HasSynced) {
		return fmt.Errorf("nodeconfigs: informer did not sync: %w", ctx.Err())
	}
	return nil
}

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
