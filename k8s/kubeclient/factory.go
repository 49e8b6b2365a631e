package kubeclient

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"k8s.io/client-go/tools/cache"
)

// Factory holds the agent's informers: each is made once, whoever asks
// for it, and all are started together (Run) and waited for together
// (WaitForSync). Packages take their informer from it and register their
// event handlers before Run; nobody runs an informer of their own.
type Factory struct {
	mu        sync.Mutex
	informers map[string]cache.SharedIndexInformer
	order     []string
	ctx       context.Context // set by Run: informers asked for later start at once
	wg        sync.WaitGroup
}

// NewFactory returns an empty factory.
func NewFactory() *Factory {
	return &Factory{informers: map[string]cache.SharedIndexInformer{}}
}

// Informer returns the informer known as key, made by build the first
// time it is asked for. Once Run has started, a new one starts at once.
func (f *Factory) Informer(key string, build func() cache.SharedIndexInformer) cache.SharedIndexInformer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if inf, ok := f.informers[key]; ok {
		return inf
	}
	inf := build()
	f.informers[key] = inf
	f.order = append(f.order, key)
	if f.ctx != nil {
		f.startLocked(inf)
	}
	return inf
}

func (f *Factory) startLocked(inf cache.SharedIndexInformer) {
	ctx := f.ctx
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		inf.RunWithContext(ctx)
	}()
}

// Run runs every informer until ctx ends and returns once they all have
// stopped.
func (f *Factory) Run(ctx context.Context) error {
	f.mu.Lock()
	if f.ctx != nil {
		f.mu.Unlock()
		return fmt.Errorf("informer factory: Run called twice")
	}
	f.ctx = ctx
	for _, k := range f.order {
		f.startLocked(f.informers[k])
	}
	f.mu.Unlock()
	<-ctx.Done()
	f.wg.Wait()
	return nil
}

// WaitForSync returns once every informer asked for so far has listed its
// objects, or an error naming those that had not when ctx ended.
func (f *Factory) WaitForSync(ctx context.Context) error {
	f.mu.Lock()
	keys := slices.Clone(f.order)
	infs := make([]cache.SharedIndexInformer, len(keys))
	for i, k := range keys {
		infs[i] = f.informers[k]
	}
	f.mu.Unlock()
	var missing []string
	for i, inf := range infs {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			missing = append(missing, keys[i])
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("informers %v did not sync: %w", missing, ctx.Err())
	}
	return nil
}
