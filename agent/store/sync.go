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
// asks while one runs shares the next.
type groupSync struct {
	sync    func() error
	start   func(func()) // runs the syncer (the store tracks it)
	mu      sync.Mutex
	next    *syncBatch // callers waiting for a sync not yet started
	running bool
}

type syncBatch struct {
	done chan struct{}
	err  error
}

// Sync returns once a sync that started after the call has finished.
func (g *groupSync) Sync() error {
	g.mu.Lock()
	if g.next == nil {
		g.next = &syncBatch{done: make(chan struct{})}
	}
	b := g.next
	start := !g.running
	g.running = true
	g.mu.Unlock()
	if start && g.start != nil {
		g.start(g.run)
	} else if start {
		go g.run()
	}
	<-b.done
	return b.err
}

func (g *groupSync) run() {
	for {
		g.mu.Lock()
		b := g.next
		g.next = nil
		if b == nil {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		b.err = g.sync()
		close(b.done)
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
