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
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

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
	// spare fills, the directory's group sync), so Close can wait for them:
	// none may touch the directory after it.
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
	s.dirSync.start = s.life.goOrRun
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

// newPending creates the file of a pending record at p, empty, from a
// spare when there is one. A leftover pending record of the container is
// an error, not something to overwrite: a truncated rewrite torn by a
// power loss could bring the old one back.
func (s *Store) newPending(p string) (*os.File, error) {
	if spare := s.takeSpare(); spare != "" {
		err := unix.Renameat2(unix.AT_FDCWD, spare, unix.AT_FDCWD, p, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			s.putSpare(spare)
			return nil, fmt.Errorf("store: creating %s: %w", p, fs.ErrExist)
		}
		if err == nil {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				os.Remove(p)
				return nil, fmt.Errorf("store: opening %s: %w", p, err)
			}
			return f, nil
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			// No rename without replacing here: reusing files would only
			// add work.
			s.spareMu.Lock()
			s.noSpares = true
			s.spareMu.Unlock()
		}
		os.Remove(spare)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: creating %s: %w", p, err)
	}
	return f, nil
}

// maxSpares bounds the emptied files kept: about a burst of pods.
const maxSpares = 256

// sparePrefix starts a spare's name; with tempSuffix at the end, Load
// removes leftover ones with the temp files.
const sparePrefix = ".spare-"

// nextSpareLocked names a new spare. Callers hold spareMu.
func (s *Store) nextSpareLocked() string {
	s.spareSeq++
	return filepath.Join(s.allocDir, fmt.Sprintf("%s%d%s", sparePrefix, s.spareSeq, tempSuffix))
}

// takeSpare takes an empty file out of the pool ("" if there is none); the
// caller renames it into place, or gives it back with putSpare.
func (s *Store) takeSpare() string {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if len(s.spares) == 0 {
		return ""
	}
	p := s.spares[len(s.spares)-1]
	s.spares = s.spares[:len(s.spares)-1]
	s.sparesOut--
	s.fillLocked()
	return p
}

// KeepSpares has the store keep about n spares ready (at most maxSpares)
// from the next Load on: new empty files are made in the background after
// Load, which removes every spare, and whenever the pool falls to half
// that. Without them a node's first pods, and the first after every
// start, each create the file of their pending record, and its fsync,
// running while the veth is programmed, then writes the directory too.
func (s *Store) KeepSpares(n int) {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	s.floor = min(max(n, 0), maxSpares)
}

// fillLocked starts making new spares if the pool has fallen to half the
// floor and none are being made. Callers hold spareMu.
func (s *Store) fillLocked() {
	if s.floor == 0 || s.filling || s.noSpares || s.sparesOut > s.floor/2 {
		return
	}
	n, gen := s.floor-s.sparesOut, s.spareGen
	if !s.life.goIfOpen(func() { s.fill(gen, n) }) {
		return
	}
	s.filling = true
	s.sparesOut += n
}

// fill makes n new spares, one at a time (an ADD's fsync is never queued
// behind many of them). A new empty file holds no old record, so nothing
// about it has to be on disk before it is used; it is fsynced all the
// same, for that fsync is the one that writes the directory entry, which
// would otherwise fall to the first pending record's.
func (s *Store) fill(gen uint64, n int) {
	var made []string
	for i := range n {
		if s.fillHook != nil {
			s.fillHook(i)
		}
		if s.life.closing() {
			break
		}
		s.spareMu.Lock()
		p := s.nextSpareLocked()
		s.spareMu.Unlock()
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			err = syncClose(f)
		}
		if err != nil {
			slog.Warn("store: cannot make a spare record file", "err", err)
			os.Remove(p)
			break
		}
		made = append(made, p)
	}
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if gen != s.spareGen {
		// Load started over meanwhile and may not have seen these.
		for _, p := range made {
			os.Remove(p)
		}
		return
	}
	s.filling = false
	s.sparesOut -= n - len(made)
	s.spares = append(s.spares, made...)
}

func (s *Store) putSpare(p string) {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	s.spares = append(s.spares, p)
	s.sparesOut++
}

// remove takes a record file out of the directory: renamed to a spare
// (returned) while there is room for one and the filesystem can rename
// without replacing, else unlinked. Once the rename is on disk (the
// caller's directory sync) the spare is emptied, and joins the pool once
// that is on disk too (spareReady): emptied earlier, a power loss could
// leave the record under its name, empty; reused earlier, one could bring
// the old content back under a new container's name. A crash before then
// leaves a spare that Load removes unread.
func (s *Store) remove(p string) (spare string, err error) {
	s.spareMu.Lock()
	keep := s.sparesOut < maxSpares && !s.noSpares
	if keep {
		s.sparesOut++
	}
	spare = s.nextSpareLocked()
	s.spareMu.Unlock()
	if !keep {
		return "", os.Remove(p)
	}
	if err := os.Rename(p, spare); err != nil {
		s.dropSpare("")
		return "", err
	}
	return spare, nil
}

// dropSpare gives up a spare on its way to the pool (removing the file,
// if named).
func (s *Store) dropSpare(spare string) {
	if spare != "" {
		os.Remove(spare)
	}
	s.spareMu.Lock()
	s.sparesOut--
	s.spareMu.Unlock()
}

// spareReady empties a spare durably and adds it to the pool (unless Load
// started over meanwhile: it removed the file).
func (s *Store) spareReady(spare string, gen uint64) {
	f, err := os.OpenFile(spare, os.O_WRONLY|os.O_TRUNC, 0)
	if err == nil {
		err = syncClose(f)
	}
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if gen != s.spareGen {
		return
	}
	if err != nil {
		s.sparesOut--
		os.Remove(spare)
		return
	}
	s.spares = append(s.spares, spare)
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
