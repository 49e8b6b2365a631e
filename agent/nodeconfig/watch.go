package nodeconfig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long FileWatcher waits for a burst of file system
// events to end (an editor writes in several steps) before reading.
const DefaultDebounce = 100 * time.Millisecond

// FileWatcher reports changes of a file's content, however they are made:
// written in place, renamed into place by an editor, or swapped by kubelet
// in a ConfigMap volume, where the file is a symlink through "..data" to a
// timestamped directory and an update renames a new "..data" symlink over
// the old one (the file itself never gets an event). It therefore watches
// directories and compares content, resolved through symlinks.
type FileWatcher struct {
	Path string
	Log  *slog.Logger // nil: slog.Default()
	// Hup forces a change (SIGHUP), whatever the content; nil: none.
	Hup <-chan os.Signal
	// Baseline is the content the caller already applied (what it loaded
	// before Run started), so an edit made in between is not taken as the
	// baseline and lost; nil: the content at Run's start.
	Baseline []byte

	ready func() // tests: called once the baseline is read and watches are set

	once    sync.Once
	changed chan struct{}
}

// Changed receives a value (coalesced) whenever the file's content differs
// from what it was at the previous change (or at Run's start), and
// whenever a value arrives on Hup.
func (w *FileWatcher) Changed() <-chan struct{} {
	w.once.Do(func() { w.changed = make(chan struct{}, 1) })
	return w.changed
}

// Run watches the file until ctx ends (then it returns nil) and signals
// Changed. A file that cannot be read (gone for a moment during an
// update) is no change. If the file system cannot be watched, Run logs it
// and serves Hup only.
func (w *FileWatcher) Run(ctx context.Context) error {
	if w.Path == "" {
		return errors.New("config watch: Path is required")
	}
	w.Changed() // makes the channel
	changed := func() {
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}

	log := w.Log
	if log == nil {
		log = slog.Default()
	}
	path, err := filepath.Abs(w.Path)
	if err != nil {
		return fmt.Errorf("config watch: %w", err)
	}
	last, lastErr := w.Baseline, error(nil)
	if last == nil {
		last, lastErr = os.ReadFile(path)
	}

	fsw, err := fsnotify.NewWatcher()
	var events <-chan fsnotify.Event
	var errs <-chan error
	watched := map[string]bool{}
	if err != nil {
		log.Warn("config watch: cannot watch the file system; SIGHUP still reloads", "file", path, "err", err)
	} else {
		defer fsw.Close()
		events, errs = fsw.Events, fsw.Errors
		if err := fsw.Add(filepath.Dir(path)); err != nil {
			log.Warn("config watch: cannot watch the file's directory; SIGHUP still reloads", "file", path, "err", err)
			events = nil
		} else {
			watched[filepath.Dir(path)] = true
		}
	}
	// rewatch follows the symlink chain as it is now: the target directory
	// changes with every ConfigMap update, and a symlink to a file
	// elsewhere can be written in place there.
	rewatch := func() {
		if events == nil {
			return
		}
		want := watchDirs(path)
		for d := range want {
			if !watched[d] {
				if err := fsw.Add(d); err != nil {
					log.Debug("config watch: add", "dir", d, "err", err)
					continue
				}
				watched[d] = true
			}
		}
		for d := range watched {
			if !want[d] {
				_ = fsw.Remove(d) // kubelet may have removed it already
				delete(watched, d)
			}
		}
	}
	rewatch()

	// read reports whether the content differs from the last seen.
	read := func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			if lastErr == nil || !errors.Is(err, fs.ErrNotExist) {
				log.Warn("config watch: cannot read the file; waiting for the next change", "file", path, "err", err)
			}
			lastErr = err
			return false
		}
		differs := lastErr != nil || !bytes.Equal(b, last)
		last, lastErr = b, nil
		return differs
	}

	if w.ready != nil {
		w.ready()
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop() // armed by the first event (no stale fire: Go ≥ 1.23 timers)
	defer timer.Stop()
	// armed: a read is due. A new event does not push it back: a busy
	// neighbour in the directory (the agent's own log, say) must not
	// starve the reload.
	armed := false
	arm := func() {
		if !armed {
			armed = true
			timer.Reset(DefaultDebounce)
		}
	}
	if w.Baseline != nil {
		// Changed between the caller's load and now: no event will tell.
		arm()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.Hup:
			read() // the new baseline: a pending debounce must not call again
			changed()
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Op == fsnotify.Chmod {
				continue // a touch; content compare would drop it anyway
			}
			arm()
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			log.Warn("config watch", "file", path, "err", err)
			// Events may have been lost (queue overflow): look again.
			arm()
		case <-timer.C:
			armed = false
			rewatch()
			if read() {
				changed()
			}
		}
	}
}

// watchDirs are the directories whose entries decide what path resolves
// to: its own, that of each symlink hop of its last element, and that of
// the final target.
func watchDirs(path string) map[string]bool {
	dirs := map[string]bool{filepath.Dir(path): true}
	p := path
	for range 40 { // the kernel's own symlink limit
		target, err := os.Readlink(p)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		p = target
		dirs[filepath.Dir(p)] = true
	}
	if r, err := filepath.EvalSymlinks(path); err == nil {
		dirs[filepath.Dir(r)] = true
	}
	return dirs
}
