package store

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzReadRecord feeds arbitrary file content, under an arbitrary record
// name, to the record decoder. A record it accepts has the current
// version, a valid state and a valid container ID equal to the file's
// name; Put of it followed by Load returns it unchanged. A refused record
// is named in the error and left untouched, and Load of a directory
// holding it fails the same way.
func FuzzReadRecord(f *testing.F) {
	f.Fuzz(func(t *testing.T, id string, content []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "record.json")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		a, err := readRecord(path, id)
		if after, rerr := os.ReadFile(path); rerr != nil || !bytes.Equal(after, content) {
			t.Fatalf("readRecord modified the file: %q, %v", after, rerr)
		}

		// Through Load, when id can name a file at all.
		var loaded []Allocation
		var loadErr error
		viaLoad := ValidateContainerID(id) == nil
		if viaLoad {
			s, oerr := Open(filepath.Join(dir, "state"))
			if oerr != nil {
				t.Fatal(oerr)
			}
			rec := s.path(id)
			if err := os.WriteFile(rec, content, 0o600); err != nil {
				t.Fatal(err)
			}
			loaded, loadErr = s.Load()
			if after, rerr := os.ReadFile(rec); rerr != nil || !bytes.Equal(after, content) {
				t.Fatalf("Load modified the record: %q, %v", after, rerr)
			}
			if (loadErr == nil) != (err == nil) {
				t.Fatalf("readRecord says %v, Load of the same file says %v", err, loadErr)
			}
			if loadErr != nil && !strings.Contains(loadErr.Error(), rec) {
				t.Fatalf("Load error %q does not name %s", loadErr, rec)
			}
		}

		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("readRecord error %q does not name %s", err, path)
			}
			if !reflect.DeepEqual(a, Allocation{}) {
				t.Fatalf("readRecord returned %+v with error %v", a, err)
			}
			return
		}
		if a.Version != CurrentVersion || !a.State.valid() || a.ContainerID != id {
			t.Fatalf("readRecord(%q, %q) accepted %+v", content, id, a)
		}
		if err := ValidateContainerID(a.ContainerID); err != nil {
			t.Fatalf("readRecord(%q) accepted container ID %q: %v", content, a.ContainerID, err)
		}
		if !viaLoad {
			t.Fatalf("readRecord accepted id %q, which ValidateContainerID refuses", id)
		}
		if len(loaded) != 1 || !sameAllocation(loaded[0], a) {
			t.Fatalf("Load of %q = %+v, want [%+v]", content, loaded, a)
		}

		// Put → Load returns it unchanged.
		s, err := Open(filepath.Join(dir, "put"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Put(a); err != nil {
			t.Fatalf("Put of accepted record %+v (from %q): %v", a, content, err)
		}
		got, err := s.Load()
		if err != nil || len(got) != 1 || !sameAllocation(got[0], a) {
			t.Fatalf("Put then Load of %+v (from %q) = %+v, %v", a, content, got, err)
		}
	})
}

// sameAllocation compares records as the agent reads them: Created as an
// instant (and its zone offset), an empty list of addresses or anycast
// IPs (omitted when written) as none.
func sameAllocation(x, y Allocation) bool {
	if !x.Created.Equal(y.Created) {
		return false
	}
	_, ox := x.Created.Zone()
	_, oy := y.Created.Zone()
	if ox != oy {
		return false
	}
	x.Created, y.Created = time.Time{}, time.Time{}
	if len(x.Addresses) == 0 && len(y.Addresses) == 0 {
		x.Addresses, y.Addresses = nil, nil
	}
	if len(x.Anycast) == 0 && len(y.Anycast) == 0 {
		x.Anycast, y.Anycast = nil, nil
	}
	return reflect.DeepEqual(x, y)
}
