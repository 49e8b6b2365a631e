// Package store persists flock's per-attachment allocation records.
//
// Each pod attachment is one JSON file, <dir>/allocations/<containerID>.json.
// Writes are crash safe: a record is written to a temporary file in the same
// directory, fsynced, renamed over the real file and the directory is fsynced,
// so after a crash a record is either the old version or the new one, never a
// mix. One file per record means concurrent Puts for different containers never
// contend and an ADD never rewrites another pod's record.
//
// Load is deliberately unforgiving: a record that cannot be read or parsed, or
// that is not one this code knows how to interpret, makes Load fail with an
// error naming the file, and the file is left untouched. The agent refuses to
// start rather than silently forget an allocation.
package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
)

// CurrentVersion is the record format version written by Put and the only
// one Load accepts.
const CurrentVersion = 1

// DefaultDir is the agent's default state directory.
const DefaultDir = "/var/lib/flock"

// maxContainerIDLen bounds container IDs used as file names. It is the
// longest ID for which both the record name "<id>.json" and its temp file
// name ".<id>.json.<up to 10 random digits>.tmp" fit in a Linux file name
// (NAME_MAX = 255 bytes). Real container IDs are 64 hex characters.
const maxContainerIDLen = nameMax - len(".") - len(recordSuffix+".") - 10 - len(tempSuffix) // 234

const nameMax = 255

const (
	allocDirName = "allocations"
	recordSuffix = ".json"
	tempSuffix   = ".tmp"
)

// State is the lifecycle state of an allocation record.
type State string

const (
	// Pending: addresses are reserved but the attachment is not (yet) known
	// to be fully set up. Written before the dataplane is touched.
	Pending State = "pending"
	// Committed: the attachment was set up successfully.
	Committed State = "committed"
)

func (s State) valid() bool { return s == Pending || s == Committed }

// Allocation is one persisted pod attachment.
type Allocation struct {
	Version     int          `json:"version"` // record format; Put sets CurrentVersion if 0
	ContainerID string       `json:"containerID"`
	IfName      string       `json:"ifName"`
	Netns       string       `json:"netns"`
	HostVeth    string       `json:"hostVeth"`
	State       State        `json:"state"`
	Pod         podmeta.ID   `json:"pod"`
	IPs         []netip.Addr `json:"ips"`                 // pod eth0 addresses, IPv6 first
	Addresses   []netip.Addr `json:"addresses,omitempty"` // extra public addresses on eth0
	Anycast     []netip.Addr `json:"anycast,omitempty"`   // anycast IPs on pod lo
	HostMAC     string       `json:"hostMAC,omitempty"`   // host veth MAC, for the CNI result
	PodMAC      string       `json:"podMAC,omitempty"`    // pod interface MAC
	Created     time.Time    `json:"created"`
}

// Store is a directory of allocation records. It is safe for concurrent use.
type Store struct {
	dir      string // state dir as given to Open
	allocDir string // dir/allocations

	// mu lets Puts and Deletes (shared) run concurrently with each other but
	// not with Load (exclusive), which removes leftover temp files and must
	// not remove one an in-flight Put is about to rename.
	mu sync.RWMutex

	// afterTempWrite, if set, is called by Put after the temp file has been
	// written and fsynced but before it is renamed into place. A non-nil
	// return aborts the Put there, leaving the temp file behind exactly as a
	// crash would. Tests only.
	afterTempWrite func(tmpPath string) error
}

// Open returns a Store rooted at dir, creating dir/allocations (mode 0700)
// if it is missing.
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("store: empty state directory")
	}
	s := &Store{dir: dir, allocDir: filepath.Join(dir, allocDirName)}
	if err := s.ensureDir(); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir returns the state directory the Store was opened with (the records live
// in its "allocations" subdirectory).
func (s *Store) Dir() string { return s.dir }

func (s *Store) ensureDir() error {
	if err := os.MkdirAll(s.allocDir, 0o700); err != nil {
		return fmt.Errorf("store: creating %s: %w", s.allocDir, err)
	}
	return nil
}

// ValidateContainerID reports whether id is acceptable as a record file name:
// non-empty, at most 234 bytes (see maxContainerIDLen), only [A-Za-z0-9_.-] and not starting with '.'.
func ValidateContainerID(id string) error {
	if id == "" {
		return errors.New("empty container ID")
	}
	if len(id) > maxContainerIDLen {
		return fmt.Errorf("container ID %q is %d bytes, longer than %d", id, len(id), maxContainerIDLen)
	}
	if id[0] == '.' {
		return fmt.Errorf("invalid container ID %q: must not start with '.'", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
		default:
			return fmt.Errorf("invalid container ID %q: only [A-Za-z0-9_.-] allowed", id)
		}
	}
	return nil
}

func (s *Store) path(id string) string {
	return filepath.Join(s.allocDir, id+recordSuffix)
}

// Put atomically creates or replaces the record for a.ContainerID; it is
// durable when Put returns (fsync of the file and the directory). Pending
// records too: what they guard does not outlive the node, but a new file
// renamed unsynced can come back empty after a power loss, and Load
// refuses a record it cannot read.
func (s *Store) Put(a Allocation) error {
	if err := ValidateContainerID(a.ContainerID); err != nil {
		return err
	}
	if !a.State.valid() {
		return fmt.Errorf("store: container %s: invalid state %q", a.ContainerID, a.State)
	}
	if a.Version == 0 {
		a.Version = CurrentVersion
	}
	if a.Version != CurrentVersion {
		return fmt.Errorf("store: container %s: unsupported record version %d (want %d)", a.ContainerID, a.Version, CurrentVersion)
	}
	data, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return fmt.Errorf("store: encoding record for %s: %w", a.ContainerID, err)
	}
	data = append(data, '\n')

	s.mu.RLock()
	defer s.mu.RUnlock()

	// Recreate the directory if someone removed it under us; cheap when it
	// exists.
	if err := s.ensureDir(); err != nil {
		return err
	}
	tmp, err := s.writeTemp(a.ContainerID, data)
	if err != nil {
		return err
	}
	if s.afterTempWrite != nil {
		if err := s.afterTempWrite(tmp); err != nil {
			return err
		}
	}
	final := s.path(a.ContainerID)
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("store: renaming %s to %s: %w", tmp, final, err)
	}
	return syncDir(s.allocDir)
}

// writeTemp writes data to a new temp file in the allocations directory,
// fsyncs and closes it, and returns its path. On error nothing is left behind.
func (s *Store) writeTemp(id string, data []byte) (path string, err error) {
	f, err := os.CreateTemp(s.allocDir, "."+id+recordSuffix+".*"+tempSuffix)
	if err != nil {
		return "", fmt.Errorf("store: creating temp file for %s: %w", id, err)
	}
	path = f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(path)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return "", fmt.Errorf("store: writing %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return "", fmt.Errorf("store: fsync %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return "", fmt.Errorf("store: closing %s: %w", path, err)
	}
	return path, nil
}

// Delete removes the record for containerID. A missing record is not an
// error.
func (s *Store) Delete(containerID string) error {
	if err := ValidateContainerID(containerID); err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()

	p := s.path(containerID)
	if err := os.Remove(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("store: removing %s: %w", p, err)
	}
	return syncDir(s.allocDir)
}

// Load returns every record, sorted by ContainerID. Leftover temp files from
// a crash before rename are removed (the real file, if any, is authoritative).
// Any record that cannot be read, parsed or validated makes Load fail with an
// error naming the file; such files are never modified. A missing directory
// is created and yields an empty result.
func (s *Store) Load() ([]Allocation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if err := s.ensureDir(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(s.allocDir)
	if err != nil {
		return nil, fmt.Errorf("store: reading %s: %w", s.allocDir, err)
	}

	var (
		out        []Allocation
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
			slog.Warn("store: removed leftover temp file from interrupted write", "path", p)
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
		return bad("unsupported version %d (want %d)", a.Version, CurrentVersion)
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
