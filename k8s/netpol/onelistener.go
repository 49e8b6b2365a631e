package netpol

import (
	"slices"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/tools/cache"
)

// oneListener is an informer whose handlers share one registration of
// the informer's. Every pod event of the cluster reaches flock-policy's
// three pod handlers (the engine's, the kernel verdicts', the extra IPs
// tracker's); each registration is a listener of its own with two
// goroutines, each woken for each event: six goroutine switches an event,
// nearly all for a pod of another node that each handler drops at once.
// Shared, the informer wakes one listener, which calls the handlers in
// turn (none of them blocks: each records and kicks a worker).
//
// A handler added once the events flow would miss the objects already
// delivered: it gets a registration of its own, which client-go hands
// the store's objects. So does one with a resync period or options.
type oneListener struct {
	cache.SharedIndexInformer
	f *fanout
}

func newOneListener(inf cache.SharedIndexInformer) oneListener {
	f := &fanout{}
	f.hs.Store(&[]*member{})
	return oneListener{inf, f}
}

func (o oneListener) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	return o.f.add(o.SharedIndexInformer, h)
}

func (o oneListener) RemoveEventHandler(reg cache.ResourceEventHandlerRegistration) error {
	if m, ok := reg.(*member); ok && m.f == o.f {
		o.f.remove(m)
		return nil
	}
	return o.SharedIndexInformer.RemoveEventHandler(reg)
}

// fanout is the shared registration's handler.
type fanout struct {
	mu  sync.Mutex // serialises adds with the first event
	reg cache.ResourceEventHandlerRegistration
	// hs is replaced, never changed, so an event reads it without a lock.
	hs atomic.Pointer[[]*member]
	// delivering is set (under mu) before the first event is handed on:
	// a handler added after it would miss what came before.
	delivering atomic.Bool
}

// member is a handler's registration: the shared one's HasSynced (every
// object was delivered to the listener, so to each of its handlers,
// which were all added before the first).
type member struct {
	cache.ResourceEventHandlerRegistration
	h cache.ResourceEventHandler
	f *fanout
}

func (f *fanout) add(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.delivering.Load() || inf.IsStopped() {
		return inf.AddEventHandler(h) // client-go refuses it if stopped
	}
	if f.reg == nil {
		reg, err := inf.AddEventHandler(f)
		if err != nil {
			return nil, err
		}
		f.reg = reg
	}
	m := &member{f.reg, h, f}
	hs := append(slices.Clone(*f.hs.Load()), m)
	f.hs.Store(&hs)
	return m, nil
}

func (f *fanout) remove(m *member) {
	f.mu.Lock()
	defer f.mu.Unlock()
	hs := slices.DeleteFunc(slices.Clone(*f.hs.Load()), func(x *member) bool { return x == m })
	f.hs.Store(&hs)
}

// handlers are the members to hand an event to.
func (f *fanout) handlers() []*member {
	if !f.delivering.Load() {
		f.mu.Lock()
		f.delivering.Store(true)
		f.mu.Unlock()
	}
	return *f.hs.Load()
}

func (f *fanout) OnAdd(obj any, initial bool) {
	for _, m := range f.handlers() {
		m.h.OnAdd(obj, initial)
	}
}

func (f *fanout) OnUpdate(old, cur any) {
	for _, m := range f.handlers() {
		m.h.OnUpdate(old, cur)
	}
}

func (f *fanout) OnDelete(obj any) {
	for _, m := range f.handlers() {
		m.h.OnDelete(obj)
	}
}
