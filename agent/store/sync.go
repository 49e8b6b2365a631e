package store

import (
	"fmt"
	"os"
	"sync"
)

// syncClose fsyncs and closes f; the first error counts.
func syncClose(f *os.File) error {
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncers bounds the fsyncs the store runs in the background at once: each
// blocks an OS thread, and the Go runtime keeps every thread it ever
// started (a burst of ADDs grew the agent by dozens).
const syncers = 4

// background runs f on its own goroutine, at most syncers at a time (on
// the caller's once the store is closed).
func (s *Store) background(f func()) {
	s.life.goOrRun(func() {
		s.syncSlots <- struct{}{}
		defer func() { <-s.syncSlots }()
		f()
	})
}

// Close stops the store's background work and waits for every goroutine
// it started; a spare fill stops after the file it is making. What a
// caller still has in flight (a Commit waiting for its fsync) completes.
// Use the store no more after it: the directory may go (a test's temp
// dir, an uninstall).
func (s *Store) Close() error {
	s.life.close()
	return nil
}

// groupSync shares fsyncs among concurrent callers: a caller's changes are
// durable after the first sync that starts after it asked, so everyone who
// asks while one runs shares the next. A caller that finds no sync running
// runs one itself, on its own goroutine (an ADD on an idle node waits for
// no other goroutine to be started and scheduled); one of those that asked
// meanwhile is handed the next, which covers them all.
type groupSync struct {
	sync func() error
	// run runs a sync on the caller's goroutine (the store counts it, so
	// Close waits for it); nil: just run it.
	run     func(func())
	mu      sync.Mutex
	next    *syncBatch // callers waiting for a sync not yet started
	running bool       // a sync is running; the next batch waits for it
}

type syncBatch struct {
	done chan struct{}
	lead chan struct{} // one of the batch's callers runs its sync (cap 1)
	err  error
}

// Sync returns once a sync that started after the call has finished.
func (g *groupSync) Sync() error {
	g.mu.Lock()
	if !g.running {
		// g.next is nil: a batch is only left waiting while a sync runs.
		g.running = true
		g.mu.Unlock()
		b := &syncBatch{done: make(chan struct{})}
		g.syncBatch(b)
		return b.err
	}
	if g.next == nil {
		g.next = &syncBatch{done: make(chan struct{}), lead: make(chan struct{}, 1)}
	}
	b := g.next
	g.mu.Unlock()
	select {
	case <-b.done:
	case <-b.lead:
		g.syncBatch(b)
	}
	return b.err
}

// syncBatch syncs for batch b, whose callers' changes all came before,
// then hands the batch that gathered meanwhile, if any, to one of its
// callers.
func (g *groupSync) syncBatch(b *syncBatch) {
	if g.run != nil {
		g.run(func() { b.err = g.sync() })
	} else {
		b.err = g.sync()
	}
	g.mu.Lock()
	next := g.next
	g.next = nil // later callers gather in a new batch
	g.running = next != nil
	g.mu.Unlock()
	close(b.done)
	if next != nil {
		next.lead <- struct{}{}
	}
}

// syncDir fsyncs a directory so that renames and removals in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: opening %s for fsync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: fsync %s: %w", dir, err)
	}
	return nil
}

// lifecycle counts the goroutines a component starts so that closing it
// can wait for them all.
type lifecycle struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// goIfOpen starts f on a goroutine unless closed; it tells which.
func (l *lifecycle) goIfOpen(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
	return true
}

// run runs f on the caller's goroutine, counted like the goroutines
// started (close waits for it), or uncounted once closed: work a caller
// waits for, like an fsync, still happens.
func (l *lifecycle) run(f func()) {
	l.mu.Lock()
	counted := !l.closed
	if counted {
		l.wg.Add(1)
	}
	l.mu.Unlock()
	if counted {
		defer l.wg.Done()
	}
	f()
}

// goOrRun starts f on a goroutine, or runs it on the caller's once closed
// (work a caller waits for, like an fsync, still happens).
func (l *lifecycle) goOrRun(f func()) {
	if !l.goIfOpen(f) {
		f()
	}
}

func (l *lifecycle) closing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// close marks the end and waits for the goroutines started before it.
func (l *lifecycle) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.wg.Wait()
}
