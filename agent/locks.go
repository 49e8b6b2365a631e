package agent

import (
	"context"
	"sync"
)

// removals tracks goroutines that unregister veths after their DEL
// returned; waiting takes a snapshot, so churn cannot starve a waiter.
type removals struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]chan struct{}
}

func (r *removals) start() (done func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[uint64]chan struct{}{}
	}
	id, ch := r.next, make(chan struct{})
	r.next++
	r.m[id] = ch
	return func() {
		r.mu.Lock()
		delete(r.m, id)
		r.mu.Unlock()
		close(ch)
	}
}

// wait waits for the removals running now and tells whether there were any.
func (r *removals) wait() bool {
	r.mu.Lock()
	chs := make([]chan struct{}, 0, len(r.m))
	for _, ch := range r.m {
		chs = append(chs, ch)
	}
	r.mu.Unlock()
	for _, ch := range chs {
		<-ch
	}
	return len(chs) > 0
}

type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	ch   chan struct{}
	refs int
}

// Lock waits for the container's lock.
func (k *keyedMutex) Lock(key string) func() {
	unlock, _ := k.LockCtx(context.Background(), key)
	return unlock
}

// LockCtx waits for the container's lock until ctx ends.
func (k *keyedMutex) LockCtx(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{ch: make(chan struct{}, 1)}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	drop := func() {
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
	return func() {
		<-e.ch
		drop()
	}, nil
}
