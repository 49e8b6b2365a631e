package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// groupSync: every caller returns only after a sync that started after its
// change finished, a failed sync fails everyone it covered, and concurrent
// callers share syncs.
func TestGroupSync(t *testing.T) {
	var written, durable, syncs atomic.Int64
	var failNext atomic.Bool
	errSync := errors.New("injected fsync failure")
	g := groupSync{sync: func() error {
		at := written.Load()
		syncs.Add(1)
		time.Sleep(time.Millisecond)
		if failNext.Swap(false) {
			return errSync
		}
		for {
			d := durable.Load()
			if at <= d || durable.CompareAndSwap(d, at) {
				return nil
			}
		}
	}}
	const callers, rounds = 16, 20
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				w := written.Add(1)
				if err := g.Sync(); err != nil {
					if !errors.Is(err, errSync) {
						t.Errorf("Sync = %v", err)
					}
					failed.Add(1)
					continue
				}
				if d := durable.Load(); d < w {
					t.Errorf("Sync returned with change %d not covered (durable up to %d)", w, d)
				}
			}
		}()
		if failed.Load() == 0 {
			failNext.Store(true)
		}
	}
	wg.Wait()
	if n := syncs.Load(); n >= callers*rounds {
		t.Errorf("%d syncs for %d calls: none shared", n, callers*rounds)
	}
	if failed.Load() == 0 {
		t.Error("the injected fsync failure reached no caller")
	}
	t.Logf("%d syncs for %d calls, %d calls failed", syncs.Load(), callers*rounds, failed.Load())
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// A deleted record's file is emptied and becomes the next pending record
// (no new inode), holding only the new record; spares stay bounded and
// are not records.
func TestDeletedRecordFilesAreReused(t *testing.T) {
	s := openTemp(t)
	d, err := s.Begin(sample("old", Pending))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(d); err != nil {
		t.Fatal(err)
	}
	ino := inode(t, s.path("old"))
	if err := s.Delete("old"); err != nil {
		t.Fatal(err)
	}
	if got := mustLoadKeep(t, s); len(got) != 0 {
		t.Fatalf("after Delete: %+v", got)
	}
	idle(s)
	short := sample("new", Pending)
	short.Anycast, short.Addresses = nil, nil // shorter than the old record
	if _, err := s.Begin(short); err != nil {
		t.Fatal(err)
	}
	if got := inode(t, s.pendingPath("new")); got != ino {
		t.Errorf("pending record in inode %d, want the deleted record's %d", got, ino)
	}
	b, err := os.ReadFile(s.pendingPath("new"))
	if err != nil || strings.Contains(string(b), "old") || !strings.HasSuffix(string(b), "}\n") {
		t.Errorf("reused file holds %q (%v): want the new record alone", b, err)
	}

	// Bounded: a node that loses many pods at once keeps maxSpares.
	for i := range maxSpares + 10 {
		id := fmt.Sprintf("m%d", i)
		if err := s.Put(sample(id, Committed)); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(id); err != nil {
			t.Fatal(err)
		}
	}
	idle(s)
	ents, _ := os.ReadDir(s.allocDir)
	spares := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".spare-") {
			spares++
			if fi, _ := e.Info(); fi.Size() != 0 {
				t.Errorf("spare %s holds %d bytes", e.Name(), fi.Size())
			}
		}
	}
	if spares != maxSpares {
		t.Errorf("%d spare files, want %d", spares, maxSpares)
	}
	// Load removes spares, unread (a crash can leave one with content).
	writeRaw(t, s, ".spare-999999.tmp", `{"version":1,"containerID":"zombie","state":"committed"}`)
	got := mustLoad(t, s)
	if len(got) != 1 || got[0].ContainerID != "new" {
		t.Errorf("Load = %+v, want only new", got)
	}
	ents, _ = os.ReadDir(s.allocDir)
	if len(ents) != 1 {
		t.Errorf("after Load the directory holds %d files, want new.pending alone", len(ents))
	}
}

// With spares at hand, Begin still refuses a leftover pending record and
// keeps the spare.
func TestBeginWithSparesRefusesLeftover(t *testing.T) {
	s := openTemp(t)
	if err := s.Put(sample("x", Committed)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("x"); err != nil {
		t.Fatal(err)
	}
	idle(s)
	old := writeRaw(t, s, "c1.pending", `{"version":1,"containerID":"c1","state":"committed"}`)
	if _, err := s.Begin(sample("c1", Pending)); err == nil || !strings.Contains(err.Error(), old) {
		t.Errorf("Begin over a leftover = %v, want an error naming %s", err, old)
	}
	if b, _ := os.ReadFile(old); strings.Contains(string(b), "eth0") {
		t.Errorf("leftover overwritten: %s", b)
	}
	if n := spareCount(s); n != 1 {
		t.Errorf("%d spares after the refusal, want the 1 kept", n)
	}
}

// mustLoadKeep is Load without disturbing the spares: it reads the
// records the way Load does.
func mustLoadKeep(t *testing.T, s *Store) []string {
	t.Helper()
	ents, err := os.ReadDir(s.allocDir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range ents {
		if n := e.Name(); !strings.HasPrefix(n, ".") {
			ids = append(ids, n)
		}
	}
	return ids
}

func spareCount(s *Store) int {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	return len(s.spares)
}

// idle waits until none of the store's background work (spare fills,
// fsyncs, spares being emptied) is running: the pool and the directory
// then say all they will until the test's next call. Each such goroutine
// is counted in s.life before the call that starts it returns (and the
// test makes no call meanwhile), so the count is zero only when all is
// done.
func idle(s *Store) { s.life.wg.Wait() }

// A deleted record's file is emptied only once its removal is on disk
// (else a power loss could leave the record under its name, empty), and
// not reused at all when that sync fails.
func TestSpareEmptiedAfterDirSync(t *testing.T) {
	s := openTemp(t)
	if err := s.Put(sample("r1", Committed)); err != nil {
		t.Fatal(err)
	}
	var atSync []string
	errSync := errors.New("injected directory fsync failure")
	fail := false
	s.dirSync.sync = func() error {
		ents, _ := os.ReadDir(s.allocDir)
		for _, e := range ents {
			if fi, _ := e.Info(); strings.HasPrefix(e.Name(), ".spare-") && fi.Size() == 0 {
				atSync = append(atSync, e.Name())
			}
		}
		if fail {
			return errSync
		}
		return syncDir(s.allocDir)
	}
	if err := s.Delete("r1"); err != nil {
		t.Fatal(err)
	}
	idle(s)
	if n := spareCount(s); n != 1 {
		t.Fatalf("%d spares after r1's removal, want 1", n)
	}
	if atSync != nil {
		t.Errorf("spares %v emptied before the directory sync", atSync)
	}

	if err := s.Put(sample("r2", Committed)); err != nil {
		t.Fatal(err)
	}
	fail = true
	if err := s.Delete("r2"); !errors.Is(err, errSync) {
		t.Fatalf("Delete with a failing sync = %v, want the sync's error", err)
	}
	idle(s)
	if n := spareCount(s); n != 1 {
		t.Errorf("%d spares, want only r1's: r2's removal is not known to be on disk", n)
	}
	ents, _ := os.ReadDir(s.allocDir)
	if len(ents) != 1 {
		t.Errorf("directory holds %v, want r1's spare alone", ents)
	}
}

// spareFiles lists the spare files on disk, checking each is empty.
func spareFiles(t *testing.T, s *Store) map[uint64]string {
	t.Helper()
	ents, err := os.ReadDir(s.allocDir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]string{}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), sparePrefix) {
			continue
		}
		p := filepath.Join(s.allocDir, e.Name())
		if fi, err := os.Stat(p); err != nil || fi.Size() != 0 {
			t.Errorf("spare %s: %v, size %v: want empty", p, err, fi)
			continue
		}
		out[inode(t, p)] = p
	}
	return out
}

// With KeepSpares, a loaded store has that many empty files ready; pending
// records take them (no new file), the pool is topped up once half is
// gone, and a Load while new spares are made (it removes every spare)
// leaves no file behind: the pool is exactly what is on disk.
func TestSparesKeptReady(t *testing.T) {
	s := openTemp(t)
	const floor = 4
	s.KeepSpares(floor)
	mustLoad(t, s)
	idle(s)
	ready := spareFiles(t, s)
	if len(ready) != floor {
		t.Fatalf("%d spare files after Load, want %d", len(ready), floor)
	}
	if _, err := s.Begin(sample("a", Pending)); err != nil {
		t.Fatal(err)
	}
	if _, ok := ready[inode(t, s.pendingPath("a"))]; !ok {
		t.Errorf("pending record in a new file, not one of the spares %v", ready)
	}
	if n := spareCount(s); n != floor-1 {
		t.Errorf("%d spares after one taken, want %d (no new ones before half is gone)", n, floor-1)
	}
	if _, err := s.Begin(sample("b", Pending)); err != nil {
		t.Fatal(err)
	}
	idle(s) // the fill is done: one gone too far would show now
	if n, files := spareCount(s), spareFiles(t, s); n != floor || len(files) != floor {
		t.Errorf("pool %d, %d spare files: want %d of each", n, len(files), floor)
	}

	// Loads racing the fills they start: no spare file leaks.
	for i := range 20 {
		if _, err := s.Begin(sample(fmt.Sprintf("c%d", i), Pending)); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			mustLoad(t, s)
		}
	}
	mustLoad(t, s)
	idle(s) // every fill done, those the Loads made stale included
	if n, files := spareCount(s), spareFiles(t, s); n != floor || len(files) != floor {
		t.Errorf("after racing Loads: pool %d, %d spare files: want %d of each", n, len(files), floor)
	}
	if got := mustLoadKeep(t, s); len(got) != 22 {
		t.Errorf("records %v, want the 22 pending ones", got)
	}
}

// Close waits for every goroutine the store started: right after it, the
// directory can be removed and nothing writes into it again. (Without it,
// the spare fills of a just-loaded store kept creating files while a
// test's temp dir was removed: "directory not empty".)
func TestCloseWaitsForBackgroundWork(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	reached, release := make(chan struct{}), make(chan struct{})
	s.fillHook = func(i int) {
		if i == 2 {
			close(reached)
			<-release
		}
	}
	s.KeepSpares(16)
	mustLoad(t, s)                          // starts the fill
	d, err := s.Begin(sample("a", Pending)) // a background fsync too
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil { // and a spare being emptied
		t.Fatal(err)
	}
	if err := s.Commit(d); err == nil {
		t.Fatal("commit of a deleted pending record succeeded")
	}
	<-reached
	closed := closeBlocked(t, s, "a spare fill")
	close(release)
	<-closed
	if n := len(spareFiles(t, s)); n > 3 {
		t.Errorf("%d spare files: the fill went on after Close", n)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("removing the directory after Close: %v", err)
	}
	if err := s.Close(); err != nil { // twice is harmless
		t.Fatal(err)
	}
}

// A directory sync runs on its caller's goroutine when none is running,
// and Close waits for it like for the store's own goroutines: after
// Close nothing syncs the directory any more.
func TestCloseWaitsForDirectorySync(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustLoad(t, s)
	started, release := make(chan struct{}), make(chan struct{})
	var syncing atomic.Bool
	real := s.dirSync.sync
	s.dirSync.sync = func() error {
		syncing.Store(true)
		defer syncing.Store(false)
		close(started)
		<-release
		return real()
	}
	put := make(chan error, 1)
	go func() { put <- s.Put(sample("a", Committed)) }()
	<-started
	closed := closeBlocked(t, s, "a directory sync")
	close(release)
	<-closed
	if syncing.Load() {
		t.Error("a directory sync still running after Close")
	}
	if err := <-put; err != nil {
		t.Fatal(err)
	}
}

// closeBlocked closes s on another goroutine and fails the test if Close
// returns within 50 ms, while what is still running; the channel closes
// once Close has returned.
func closeBlocked(t *testing.T, s *Store, what string) <-chan struct{} {
	t.Helper()
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatalf("Close returned while %s was running", what)
	case <-time.After(50 * time.Millisecond):
	}
	return closed
}
