package store

// The state directory's format. Every file the agent keeps under the
// state directory (the allocation records, bgp-state.json) is read by the
// release that comes after the one that wrote it, and by the one before
// it (a downgrade), as long as StateFormat is the same: a release that
// writes what the previous one cannot read bumps it, says so in the
// CHANGELOG, and reads the previous format itself. An agent refuses a
// directory stamped with a newer format, naming both releases, rather
// than misread (and then forget) the allocations of running pods.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// StateFormat is the format this release writes and the newest it reads.
const StateFormat = 1

// FormatFile is the stamp's name in the state directory.
const FormatFile = "format.json"

// Stamp says who last took the state directory.
type Stamp struct {
	// Format of every file in the directory (StateFormat of the writer).
	Format int `json:"format"`
	// Release of flock that wrote it (its VERSION), for people and errors.
	Release string `json:"release"`
}

// ErrNewerFormat is wrapped by Adopt's refusal of a directory a newer
// release wrote.
var ErrNewerFormat = errors.New("state written in a newer format")

// Adopt checks that this release (named release) can read the state
// directory, then stamps it as this release's: a directory a newer
// format stamped is refused (ErrNewerFormat), with both releases named
// and nothing changed. No stamp: a new directory, or one written before
// stamps (format 1). The stamp it finds is returned (zero: none).
func (s *Store) Adopt(release string) (Stamp, error) {
	path := filepath.Join(s.dir, FormatFile)
	var found Stamp
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return found, fmt.Errorf("store: reading the state format %s: %w", path, err)
	default:
		if err := json.Unmarshal(b, &found); err != nil || found.Format < 1 {
			return found, fmt.Errorf("store: state format %s is unreadable (%q): remove it only if every file under %s is flock's format 1", path, b, s.dir)
		}
	}
	if found.Format > StateFormat {
		return found, fmt.Errorf("store: the state in %s was written by flock %s in state format %d; this is flock %s, which reads state format %d at most: "+
			"run %s again, or downgrade only as far as its CHANGELOG says (the allocations of running pods are in that state): %w",
			s.dir, found.Release, found.Format, release, StateFormat, found.Release, ErrNewerFormat)
	}
	// A release that reads an older format would migrate it here, before
	// the stamp says the directory is in this one.
	if found.Format == StateFormat && found.Release == release {
		return found, nil
	}
	out, err := json.Marshal(Stamp{Format: StateFormat, Release: release})
	if err != nil {
		return found, err
	}
	if err := writeAtomic(path, append(out, '\n')); err != nil {
		return found, fmt.Errorf("store: stamping the state format %s: %w", path, err)
	}
	return found, nil
}

// writeAtomic puts b at path: a temporary file, fsynced, renamed over it,
// the directory fsynced.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*"+tempSuffix)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	return err
}
