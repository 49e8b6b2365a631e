package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Load returns every record, sorted by ContainerID. Leftover temp files from
// a crash before rename are removed (the real file, if any, is authoritative).
// Any record that cannot be read, parsed or validated makes Load fail with an
// error naming the file; such files are never modified. A pending record
// (<id>.pending) comes back with state Pending; one that cannot be read
// (torn by a power loss: empty or cut short) comes back as its container
// ID alone, and one beside a committed record of its container (which
// this package's writes never leave; the committed one is authoritative)
// is removed.
// A missing directory is created and yields an empty result.
func (s *Store) Load() ([]Allocation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if err := s.ensureDir(); err != nil {
		return nil, err
	}
	s.spareMu.Lock()
	s.spares, s.sparesOut, s.filling = nil, 0, false // removed below with the temp files
	s.spareGen++
	s.spareMu.Unlock()
	defer func() {
		s.spareMu.Lock()
		s.fillLocked()
		s.spareMu.Unlock()
	}()
	entries, err := os.ReadDir(s.allocDir)
	if err != nil {
		return nil, fmt.Errorf("store: reading %s: %w", s.allocDir, err)
	}

	var (
		out        []Allocation
		pending    []string // container IDs
		errs       []error
		removedTmp bool
	)
	for _, e := range entries {
		name := e.Name()
		p := filepath.Join(s.allocDir, name)
		if isTempName(name) {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("store: removing leftover temp file %s: %w", p, err))
				continue
			}
			removedTmp = true
			if !strings.HasPrefix(name, sparePrefix) {
				slog.Warn("store: removed leftover temp file from interrupted write", "path", p)
			}
			continue
		}
		if id, ok := strings.CutSuffix(name, pendingSuffix); ok {
			pending = append(pending, id)
			continue
		}
		if !strings.HasSuffix(name, recordSuffix) {
			continue
		}
		a, err := readRecord(p, strings.TrimSuffix(name, recordSuffix))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, a)
	}
	for _, id := range pending {
		p := s.pendingPath(id)
		if slices.ContainsFunc(out, func(a Allocation) bool { return a.ContainerID == id }) {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("store: removing superseded pending record %s: %w", p, err))
				continue
			}
			removedTmp = true
			slog.Warn("store: removed a pending record its committed one supersedes", "path", p)
			continue
		}
		a, err := readPending(p, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, a)
	}
	if removedTmp {
		if err := syncDir(s.allocDir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(out, func(a, b Allocation) int { return strings.Compare(a.ContainerID, b.ContainerID) })
	return out, nil
}

func isTempName(name string) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, tempSuffix)
}

// readRecord reads and validates one record file. It never modifies the file.
func readRecord(path, idFromName string) (Allocation, error) {
	var a Allocation
	bad := func(format string, args ...any) (Allocation, error) {
		return Allocation{}, fmt.Errorf("store: bad allocation record %s: %s", path, fmt.Sprintf(format, args...))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Allocation{}, fmt.Errorf("store: reading allocation record %s: %w", path, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return bad("empty file")
	}
	if err := json.Unmarshal(data, &a); err != nil {
		return bad("invalid JSON: %v", err)
	}
	if a.Version != CurrentVersion {
		return bad("record format %d; this flock reads record format %d (state format %d; %s names the release that wrote the directory)", a.Version, CurrentVersion, StateFormat, FormatFile)
	}
	if !a.State.valid() {
		return bad("unknown state %q", a.State)
	}
	if a.ContainerID != idFromName {
		return bad("containerID %q does not match file name", a.ContainerID)
	}
	if err := ValidateContainerID(a.ContainerID); err != nil {
		return bad("%v", err)
	}
	return a, nil
}

// readPending reads a pending record. One that is empty or cut short
// (written but not yet on disk when the power went) is the container ID
// alone: what it guarded did not survive the reboot either (the orphan
// veth and claim sweeps remove what would be left). Anything else wrong
// with it (unreadable, another version, another container) is refused
// like a bad committed record: it may guard a veth and claims that are
// still there.
func readPending(path, id string) (Allocation, error) {
	if err := ValidateContainerID(id); err != nil {
		return Allocation{}, fmt.Errorf("store: bad pending record %s: %w", path, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Allocation{}, fmt.Errorf("store: reading pending record %s: %w", path, err)
	}
	var syntax *json.SyntaxError
	if err := json.Unmarshal(data, new(json.RawMessage)); len(bytes.TrimSpace(data)) == 0 || errors.As(err, &syntax) || errors.Is(err, io.ErrUnexpectedEOF) {
		slog.Warn("store: pending record torn (a power loss mid-ADD?): dropping it", "path", path, "bytes", len(data))
		return Allocation{Version: CurrentVersion, ContainerID: id, State: Pending}, nil
	}
	a, err := readRecord(path, id)
	if err != nil {
		return Allocation{}, err
	}
	a.State = Pending
	return a, nil
}
