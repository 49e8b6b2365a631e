package nodeconfig

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// watch runs a FileWatcher on path until the test ends and returns its
// Changed channel.
func watch(t *testing.T, path string, hup <-chan os.Signal) <-chan struct{} {
	t.Helper()
	ready := make(chan struct{})
	w := &FileWatcher{Path: path, Hup: hup, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), ready: func() { close(ready) }}
	testutil.Run(t, w.Run)
	// The baseline must be read before the test changes anything.
	select {
	case <-ready:
	case <-time.After(testutil.Timeout):
		t.Fatal("watcher not ready")
	}
	return w.Changed()
}

// expectCall waits for the call a change makes, then checks it was the
// only one: the debounce swallows the burst of events of one change.
func expectCall(t *testing.T, calls <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-calls:
	case <-time.After(testutil.Timeout):
		t.Fatalf("%s: changed() not called", what)
	}
	expectNone(t, calls, what+" (second call)")
}

// expectNone checks that no call comes in a window several debounces
// long. A correct watcher never calls in it, however loaded the machine.
func expectNone(t *testing.T, calls <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-calls:
		t.Fatalf("%s: changed() called", what)
	case <-time.After(4 * DefaultDebounce):
	}
}

// A write in place (truncate, then write) shows the watcher an empty file
// if it reads in between, which it may do only a debounce after the
// write's first event. A quick write (done within a debounce) cannot be
// read half done; a slow one (the test descheduled on a loaded machine)
// may be, which is a change of its own: one call more.

// expectCallAfter is expectCall after a write in place.
func expectCallAfter(t *testing.T, calls <-chan struct{}, what string, quick bool) {
	t.Helper()
	if quick {
		expectCall(t, calls, what)
		return
	}
	select {
	case <-calls:
	case <-time.After(testutil.Timeout):
		t.Fatalf("%s: changed() not called", what)
	}
	drain(calls)
}

// expectNoneAfter is expectNone after a write in place of equal content.
func expectNoneAfter(t *testing.T, calls <-chan struct{}, what string, quick bool) {
	t.Helper()
	if quick {
		expectNone(t, calls, what)
		return
	}
	drain(calls)
}

// drain takes the calls a slow write in place may make: the empty file,
// then the content.
func drain(calls <-chan struct{}) {
	for range 2 {
		select {
		case <-calls:
		case <-time.After(4 * DefaultDebounce):
			return
		}
	}
}

// write writes content in place, as os.WriteFile does, and reports whether
// it was quick (see expectCallAfter).
func write(t *testing.T, path, content string) (quick bool) {
	t.Helper()
	start := time.Now()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return time.Since(start) < DefaultDebounce
}

// configMap is a ConfigMap volume as kubelet's atomic writer lays it out:
//
//	dir/..2024_01_01_00_00_00.000000001/nodeconfig.yaml
//	dir/..data -> ..2024_01_01_00_00_00.000000001
//	dir/nodeconfig.yaml -> ..data/nodeconfig.yaml
type configMap struct {
	t   *testing.T
	dir string
	gen int
	ts  string // current timestamped dir
}

func newConfigMap(t *testing.T, content string) *configMap {
	c := &configMap{t: t, dir: t.TempDir()}
	c.ts = c.payload(content)
	if err := os.Symlink(c.ts, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "nodeconfig.yaml"), c.path()); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *configMap) path() string { return filepath.Join(c.dir, "nodeconfig.yaml") }

func (c *configMap) payload(content string) string {
	c.gen++
	ts := fmt.Sprintf("..2024_01_01_00_00_00.%09d", c.gen)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		c.t.Fatal(err)
	}
	write(c.t, filepath.Join(c.dir, ts, "nodeconfig.yaml"), content)
	return ts
}

// update does what kubelet does: a new timestamped dir, a ..data_tmp
// symlink to it renamed over ..data, then the old dir removed.
func (c *configMap) update(content string) {
	old := c.ts
	c.ts = c.payload(content)
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(c.ts, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(c.dir, old)); err != nil {
		c.t.Fatal(err)
	}
}

// Defect 11: the standalone reload watched the config file's directory and
// reacted only to events naming the file, so a ConfigMap update (a ..data
// symlink swap; the file itself gets no event) was never reloaded.
func TestFileWatcherConfigMapSwap(t *testing.T) {
	c := newConfigMap(t, "v1")
	calls := watch(t, c.path(), nil)
	expectNone(t, calls, "start")

	c.update("v2")
	expectCall(t, calls, "first ..data swap")
	c.update("v3")
	expectCall(t, calls, "second ..data swap (the watched target dir is gone)")

	// kubelet re-projects unchanged content (e.g. another key changed).
	c.update("v3")
	expectNone(t, calls, "swap to equal content")
}

func TestFileWatcherPlainFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nodeconfig.yaml")
	write(t, path, "v1")
	calls := watch(t, path, nil)

	expectCallAfter(t, calls, "in-place write", write(t, path, "v2"))

	// An editor: write a temp file, rename it over the original.
	tmp := filepath.Join(dir, ".nodeconfig.yaml.swp")
	write(t, tmp, "v3")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	expectCall(t, calls, "rename into place")

	write(t, filepath.Join(dir, "unrelated.yaml"), "x")
	expectNone(t, calls, "unrelated file in the directory")

	now := time.Now().Add(time.Minute)
	if err := os.Chtimes(path, now, now); err != nil {
		t.Fatal(err)
	}
	expectNoneAfter(t, calls, "touch and rewrite with equal content", write(t, path, "v3"))

	// Deleted, then back: no call while it is missing; one when it returns
	// (the agent keeps running on the config it has meanwhile).
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	expectNone(t, calls, "file removed")
	expectCallAfter(t, calls, "file re-created", write(t, path, "v3"))
}

// A symlink to a file in another directory, written in place there: the
// event is in the target's directory, not the link's.
func TestFileWatcherSymlinkTargetElsewhere(t *testing.T) {
	etc, srv := t.TempDir(), t.TempDir()
	target := filepath.Join(srv, "node.yaml")
	write(t, target, "v1")
	path := filepath.Join(etc, "nodeconfig.yaml")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	calls := watch(t, path, nil)
	expectCallAfter(t, calls, "target written in place", write(t, target, "v2"))
}

func TestFileWatcherHup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nodeconfig.yaml")
	write(t, path, "v1")
	hup := make(chan os.Signal, 1)
	calls := watch(t, path, hup)
	hup <- syscall.SIGHUP
	expectCall(t, calls, "SIGHUP with unchanged content")
}

func TestFileWatcherMissingFileAtStart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nodeconfig.yaml")
	calls := watch(t, path, nil)
	expectNone(t, calls, "start without the file")
	expectCallAfter(t, calls, "file created", write(t, path, "v1"))
}

// An edit between the agent's load and the watcher's start is not lost:
// the baseline is what the agent applied, not what the file holds later.
func TestFileWatcherBaseline(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nodeconfig.yaml")
	write(t, path, "edited after load")
	w := &FileWatcher{Path: path, Baseline: []byte("as loaded"), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	calls := w.Changed()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	expectCall(t, calls, "content differing from the baseline at start")
	expectNone(t, calls, "nothing more")

	// The same content as the baseline: no call.
	path2 := filepath.Join(t.TempDir(), "nodeconfig.yaml")
	write(t, path2, "same")
	w2 := &FileWatcher{Path: path2, Baseline: []byte("same"), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	calls2 := w2.Changed()
	done2 := make(chan struct{})
	go func() { defer close(done2); _ = w2.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done2 })
	expectNone(t, calls2, "content equal to the baseline")
}

// A neighbour file written all the time (the agent's own log next to its
// config, as in the labs) must not starve the reload: each event used to
// push the debounce back, and the change was never read.
func TestFileWatcherBusyDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nodeconfig.yaml")
	write(t, path, "v1")
	calls := watch(t, path, nil)
	log := filepath.Join(dir, "agent.log")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.Create(log)
		if err != nil {
			return
		}
		defer f.Close()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				_, _ = f.WriteString("a log line\n")
			}
		}
	}()
	defer func() { close(stop); <-done }()
	testutil.WaitFor(t, "the neighbour being written", func() bool {
		fi, err := os.Stat(log)
		return err == nil && fi.Size() >= 3*int64(len("a log line\n"))
	})
	// Renamed into place: the watcher reads all the time here (every
	// debounce), so a write in place could show it an empty file.
	tmp := filepath.Join(dir, ".nodeconfig.yaml.new")
	write(t, tmp, "v2")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	expectCall(t, calls, "a change while a neighbour is written every 10 ms")
}
