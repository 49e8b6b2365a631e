// Package store persists flock's per-attachment allocation records.
//
// Each pod attachment is one JSON file, <dir>/allocations/<containerID>.json.
// Writes are crash safe: a record is written to a temporary file in the same
// directory, fsynced, renamed over the real file and the directory is fsynced,
// so after a crash a record is either the old version or the new one, never a
// mix. One file per record means concurrent Puts for different containers never
// contend and an ADD never rewrites another pod's record.
//
// An ADD in progress is <containerID>.pending (Begin): the record as it
// will be committed, written before the kernel is touched and made
// durable in the background while the veth is programmed; Commit renames
// it to <containerID>.json once that is done. What a pending record
// guards (a veth, routes on it, cluster-wide claims) needs it to outlive
// the agent, not the machine: a reboot takes the network namespaces with
// it. So Load drops a pending record it cannot read (a power loss mid-write)
// instead of refusing to start, and no ADD waits for a pending record's
// fsync before its netlink work. Directory fsyncs of concurrent commits and
// deletes are shared (group commit): one flush covers every rename and
// removal done before it started.
//
// Load is deliberately unforgiving: a record that cannot be read or parsed, or
// that is not one this code knows how to interpret, makes Load fail with an
// error naming the file, and the file is left untouched. The agent refuses to
// start rather than silently forget an allocation.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
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
	allocDirName  = "allocations"
	recordSuffix  = ".json"
	pendingSuffix = ".pending"
	tempSuffix    = ".tmp"
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
	Anycast     []netip.Addr `json:"anycast,omitempty"`   // anycast IPs on pod eth0
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

	dirSync   groupSync     // the allocations directory's fsyncs, shared
	syncSlots chan struct{} // see background

	// spares are emptied record files kept for reuse: a DEL renames its
	// record to one, an ADD renames one to its pending record. Creating a
	// file costs the filesystem an inode (ext4 without a journal scans past
	// every inode freed in the last minute for one: as much CPU as creating
	// the veth, under a burst of ADDs); a rename costs none.
	spareMu   sync.Mutex
	spares    []string // paths, empty on disk, ready for reuse
	sparesOut int      // spares on disk: in the pool or being emptied
	spareSeq  uint64   // names them
	spareGen  uint64   // bumped by Load, which removes every spare
	noSpares  bool     // the filesystem cannot rename without replacing
	floor     int      // KeepSpares: new spares are made when the pool falls to half this
	filling   bool     // new spares are being made

	// life tracks every goroutine the store starts (background fsyncs,
	// spare fills) and the directory's group syncs (run on their callers'
	// goroutines), so Close can wait for them: none may touch the
	// directory after it.
	life lifecycle

	// fillHook, if set, runs before each spare a fill makes. Tests only.
	fillHook func(i int)

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
	s := &Store{dir: dir, allocDir: filepath.Join(dir, allocDirName), syncSlots: make(chan struct{}, syncers)}
	s.dirSync.sync = func() error { return syncDir(s.allocDir) }
	s.dirSync.run = s.life.run
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

func (s *Store) pendingPath(id string) string {
	return filepath.Join(s.allocDir, id+pendingSuffix)
}

// validate checks a record before it is written and encodes it.
func validate(a Allocation) ([]byte, error) {
	if err := ValidateContainerID(a.ContainerID); err != nil {
		return nil, err
	}
	if !a.State.valid() {
		return nil, fmt.Errorf("store: container %s: invalid state %q", a.ContainerID, a.State)
	}
	if a.Version != CurrentVersion {
		return nil, fmt.Errorf("store: container %s: unsupported record version %d (want %d)", a.ContainerID, a.Version, CurrentVersion)
	}
	data, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("store: encoding record for %s: %w", a.ContainerID, err)
	}
	return append(data, '\n'), nil
}

// Draft is an ADD's record between Begin and Commit: on disk as pending.
type Draft struct {
	s       *Store
	id      string
	synced  chan struct{} // closed when the background fsync is done
	syncErr error
}

// Begin writes a as the pending record <id>.pending, content as it will
// be committed (state committed), and starts its fsync in the background;
// it returns once the file is written (it outlives the agent from here
// on). Commit, or Delete of the container, ends it.
func (s *Store) Begin(a Allocation) (*Draft, error) {
	if a.Version == 0 {
		a.Version = CurrentVersion
	}
	a.State = Committed
	data, err := validate(a)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.ensureDir(); err != nil {
		return nil, err
	}
	p := s.pendingPath(a.ContainerID)
	f, err := s.newPending(p)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(p)
		return nil, fmt.Errorf("store: writing %s: %w", p, err)
	}
	pend := &Draft{s: s, id: a.ContainerID, synced: make(chan struct{})}
	s.background(func() {
		if err := syncClose(f); err != nil {
			pend.syncErr = fmt.Errorf("store: fsync %s: %w", p, err)
		}
		close(pend.synced)
	})
	return pend, nil
}

// ContainerID is the container the draft is for.
func (p *Draft) ContainerID() string { return p.id }

// Commit makes a pending record the committed one: once its content is on
// disk, it is renamed to <id>.json and the directory is fsynced (shared
// with concurrent commits). The record is durable when Commit returns; on
// error the pending record stays (Delete removes it).
func (s *Store) Commit(p *Draft) error {
	if p.s != s {
		return fmt.Errorf("store: commit of %s: draft of another store", p.id)
	}
	<-p.synced
	if p.syncErr != nil {
		return p.syncErr
	}
	s.mu.RLock()
	from, to := s.pendingPath(p.id), s.path(p.id)
	err := os.Rename(from, to)
	s.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("store: renaming %s to %s: %w", from, to, err)
	}
	return s.dirSync.Sync()
}

// Put atomically creates or replaces the record <id>.json for
// a.ContainerID in one step, in the state a says; it is durable when Put
// returns (fsync of the file and the directory). ADDs use Begin and
// Commit; agents before those wrote pending records with Put, and Load
// still reads them as pending.
func (s *Store) Put(a Allocation) error {
	if a.Version == 0 {
		a.Version = CurrentVersion
	}
	data, err := validate(a)
	if err != nil {
		return err
	}

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
	return s.dirSync.Sync()
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

// Delete removes the record for containerID, committed or pending. A
// missing record is not an error.
func (s *Store) Delete(containerID string) error {
	if err := ValidateContainerID(containerID); err != nil {
		return err
	}
	s.mu.RLock()
	removed := false
	var spares []string
	var errs []error
	for _, p := range []string{s.path(containerID), s.pendingPath(containerID)} {
		spare, err := s.remove(p)
		switch {
		case err == nil:
			removed = true
			if spare != "" {
				spares = append(spares, spare)
			}
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("store: removing %s: %w", p, err))
		}
	}
	s.spareMu.Lock()
	gen := s.spareGen
	s.spareMu.Unlock()
	s.mu.RUnlock()
	if !removed {
		return errors.Join(errs...)
	}
	// What was removed is made durable even if the other removal failed;
	// only then are the removed files emptied for reuse.
	err := s.dirSync.Sync()
	for _, spare := range spares {
		if err != nil {
			s.dropSpare(spare)
		} else {
			s.background(func() { s.spareReady(spare, gen) })
		}
	}
	return errors.Join(append(errs, err)...)
}
