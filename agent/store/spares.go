package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

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
