// Package conffile writes the flock network config where container
// runtimes read it: atomically (temp file + rename, fsync) and so that
// their watchers reload it. The installer and the agent share it: the
// installer stages the conflist, the agent publishes it once it serves.
package conffile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// ConfName is lexically first so runtimes pick it over other CNIs' files.
const ConfName = "01-flock.conflist"

// TempDir is the conf dir's subdirectory the conflist is written in before
// it is renamed into place: runtimes watch the conf dir (not recursively)
// and try to load whatever appears there, a half-written temp file too.
const TempDir = ".flock-install"

// Publish puts the staged conflist into confDir (as ConfName) unless the
// same is there already, and makes the runtime load it. It reports
// whether it wrote.
func Publish(staged, confDir string) (bool, error) {
	data, err := os.ReadFile(staged)
	if err != nil {
		return false, fmt.Errorf("publish the conflist: %w", err)
	}
	dst := filepath.Join(confDir, ConfName)
	ok, err := Write(dst, filepath.Join(confDir, TempDir), data, 0o644)
	if err == nil && ok {
		err = Nudge(dst)
	}
	return ok, err
}

// Write puts data at dst unless it is there already: a temp file in
// tmpDir (on dst's filesystem), fsync, rename, fsync of dst's directory.
// It reports whether it wrote.
func Write(dst, tmpDir string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	dir := filepath.Dir(dst)
	for _, d := range []string{dir, tmpDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return false, fmt.Errorf("installer: %w", err)
		}
	}
	pattern := "." + filepath.Base(dst) + ".*.tmp"
	// Left by an installer that died mid-write: only one runs per node.
	if stale, err := filepath.Glob(filepath.Join(tmpDir, pattern)); err == nil {
		for _, s := range stale {
			_ = os.Remove(s)
		}
	}
	tmp, err := os.CreateTemp(tmpDir, pattern)
	if err != nil {
		return false, fmt.Errorf("installer: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("installer: write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return false, fmt.Errorf("installer: install %s: %w", dst, err)
	}
	return true, SyncDir(dir)
}

// Nudge makes the runtime load the conflist that was just renamed into
// place. A rename into the watched dir reaches the watcher as a Create,
// and containerd's conf syncer (1.7 and 2.x) reloads only on Write,
// Rename or Remove, ignoring Create and Chmod: the conflist would wait for
// the next unrelated change. Writing the file's first byte over itself
// raises a Write without ever changing what a reader sees.
func Nudge(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("installer: %w", err)
	}
	first := make([]byte, 1)
	r, err := os.Open(path)
	if err == nil {
		_, err = r.ReadAt(first, 0)
		r.Close()
	}
	if err == nil {
		_, err = f.WriteAt(first, 0)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("installer: make the runtime load %s: %w", path, err)
	}
	return nil
}

// SyncDir makes a rename or remove in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("installer: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("installer: fsync %s: %w", dir, err)
	}
	return nil
}
