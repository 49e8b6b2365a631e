package store

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestLoadSortedAndIgnoresOtherFiles(t *testing.T) {
	s := openTemp(t)
	ids := []string{"zeta", "alpha", "Mike", "0001", "bravo-2", "bravo_1"}
	for _, id := range ids {
		if err := s.Put(sample(id, Committed)); err != nil {
			t.Fatal(err)
		}
	}
	writeRaw(t, s, "README", "not a record")
	writeRaw(t, s, "notes.txt", "{")
	if err := os.Mkdir(filepath.Join(s.allocDir, "subdir"), 0o700); err != nil {
		t.Fatal(err)
	}
	got := mustLoad(t, s)
	var gotIDs []string
	for _, a := range got {
		gotIDs = append(gotIDs, a.ContainerID)
	}
	want := []string{"0001", "Mike", "alpha", "bravo-2", "bravo_1", "zeta"}
	if !reflect.DeepEqual(gotIDs, want) {
		t.Errorf("Load order = %v, want %v", gotIDs, want)
	}
}

func TestLoadMissingDirCreated(t *testing.T) {
	s := openTemp(t)
	if err := os.RemoveAll(s.allocDir); err != nil {
		t.Fatal(err)
	}
	got := mustLoad(t, s)
	if len(got) != 0 {
		t.Fatalf("got %d records from missing dir", len(got))
	}
	if fi, err := os.Stat(s.allocDir); err != nil || !fi.IsDir() {
		t.Fatalf("allocations dir not recreated: %v", err)
	}
}

// assertLoadFailsUntouched checks that Load fails with an error naming path
// and containing wantSubstr, and that the file is byte-for-byte unchanged.
func assertLoadFailsUntouched(t *testing.T, s *Store, path, wantSubstr string) {
	t.Helper()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Load()
	if err == nil {
		t.Fatalf("Load succeeded, want error for %s", path)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name file %s", err, path)
	}
	if !strings.Contains(err.Error(), wantSubstr) {
		t.Errorf("error %q does not mention %q", err, wantSubstr)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("file gone after Load: %v", err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("file modified by Load:\nbefore %q\nafter  %q", before, after)
	}
}

func TestLoadCorruptJSON(t *testing.T) {
	s := openTemp(t)
	if err := s.Put(sample("good", Committed)); err != nil {
		t.Fatal(err)
	}
	p := writeRaw(t, s, "broken.json", `{"version":1,"containerID":"broken","state":"comm`)
	assertLoadFailsUntouched(t, s, p, "invalid JSON")

	// Trailing garbage and empty files are corrupt too.
	os.Remove(p)
	p = writeRaw(t, s, "trail.json", `{"version":1,"containerID":"trail","state":"pending"} xx`)
	assertLoadFailsUntouched(t, s, p, "invalid JSON")
	os.Remove(p)
	p = writeRaw(t, s, "empty.json", "")
	assertLoadFailsUntouched(t, s, p, "empty")
}

func TestLoadRejectsInvalidRecords(t *testing.T) {
	cases := []struct {
		name, file, content, want string
	}{
		{"unknown state", "s1.json", `{"version":1,"containerID":"s1","state":"deleting"}`, "unknown state"},
		{"empty state", "s2.json", `{"version":1,"containerID":"s2"}`, "unknown state"},
		{"version 2", "v2.json", `{"version":2,"containerID":"v2","state":"pending"}`, "record format 2; this flock reads record format 1"},
		{"version missing", "v0.json", `{"containerID":"v0","state":"pending"}`, "record format 0; this flock reads record format 1"},
		{"id mismatch", "m1.json", `{"version":1,"containerID":"other","state":"committed"}`, "does not match file name"},
		{"dot file", ".hidden.json", `{"version":1,"containerID":".hidden","state":"committed"}`, "must not start with"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := openTemp(t)
			if err := s.Put(sample("fine", Pending)); err != nil {
				t.Fatal(err)
			}
			p := writeRaw(t, s, tc.file, tc.content)
			assertLoadFailsUntouched(t, s, p, tc.want)
		})
	}
}

func TestLoadUnreadableRecord(t *testing.T) {
	s := openTemp(t)
	// A directory named like a record cannot be read as a file, even as root.
	p := filepath.Join(s.allocDir, "x.json")
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := s.Load()
	if err == nil {
		t.Fatal("Load succeeded with unreadable record")
	}
	if !strings.Contains(err.Error(), p) {
		t.Errorf("error %q does not name %s", err, p)
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		t.Errorf("unreadable record was touched: %v", err)
	}
}

func TestLoadReportsAllBadFiles(t *testing.T) {
	s := openTemp(t)
	p1 := writeRaw(t, s, "a.json", "{")
	p2 := writeRaw(t, s, "b.json", `{"version":7,"containerID":"b","state":"pending"}`)
	_, err := s.Load()
	if err == nil {
		t.Fatal("Load succeeded")
	}
	for _, p := range []string{p1, p2} {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not name %s", err, p)
		}
	}
}

func TestLeftoverTempFileRemovedRealFileWins(t *testing.T) {
	s := openTemp(t)
	old := sample("t1", Pending)
	if err := s.Put(old); err != nil {
		t.Fatal(err)
	}
	newer := old
	newer.State = Committed
	tmp := writeRaw(t, s, ".t1.json.123456.tmp", `{"version":1,"containerID":"t1","state":"committed"}`)
	// A temp file for a container with no real record at all, and a
	// truncated one: both just crash debris.
	orphan := writeRaw(t, s, ".t2.json.999.tmp", `{"vers`)

	var logBuf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logBuf, nil)))
	got, err := s.Load()
	slog.SetDefault(prev)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].State != Pending {
		t.Fatalf("Load = %+v, want only t1 pending", got)
	}
	for _, p := range []string{tmp, orphan} {
		if !strings.Contains(logBuf.String(), p) {
			t.Errorf("removal of %s not logged; log: %s", p, logBuf.String())
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("temp file %s not removed (stat err %v)", p, err)
		}
	}
}

func TestCrashBetweenWriteAndRename(t *testing.T) {
	s := openTemp(t)
	v1 := sample("crash", Pending)
	if err := s.Put(v1); err != nil {
		t.Fatal(err)
	}

	var tmpPath string
	errCrash := errors.New("simulated crash")
	s.afterTempWrite = func(p string) error {
		tmpPath = p
		return errCrash
	}
	v2 := v1
	v2.State = Committed
	v2.HostVeth = "flknew"
	if err := s.Put(v2); !errors.Is(err, errCrash) {
		t.Fatalf("Put = %v, want simulated crash", err)
	}
	s.afterTempWrite = nil

	// The new version is fully on disk, in a temp file.
	base := filepath.Base(tmpPath)
	if !strings.HasPrefix(base, ".crash.json.") || !strings.HasSuffix(base, ".tmp") {
		t.Errorf("temp file name %q does not follow .<id>.json.<random>.tmp", base)
	}
	data, err := os.ReadFile(tmpPath)
	if err != nil {
		t.Fatalf("temp file missing after crash: %v", err)
	}
	if !strings.Contains(string(data), `"committed"`) {
		t.Errorf("temp file does not hold the new version: %s", data)
	}

	// "Restart": a new Store over the same dir sees the previous version.
	s2, err := Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	got := mustLoad(t, s2)
	if len(got) != 1 {
		t.Fatalf("got %d records, want 1", len(got))
	}
	v1.Version = CurrentVersion
	equalAlloc(t, got[0], v1)
	if _, err := os.Stat(tmpPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp file not cleaned up by Load: %v", err)
	}

	// And a normal Put afterwards works.
	if err := s2.Put(v2); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, s2); got[0].State != Committed {
		t.Errorf("state after retry = %q", got[0].State)
	}
}

func TestCrashOnFirstPutLeavesNoRecord(t *testing.T) {
	s := openTemp(t)
	s.afterTempWrite = func(string) error { return errors.New("crash") }
	if err := s.Put(sample("first", Pending)); err == nil {
		t.Fatal("Put succeeded despite crash hook")
	}
	s.afterTempWrite = nil
	if got := mustLoad(t, s); len(got) != 0 {
		t.Fatalf("got %+v, want no records", got)
	}
}

// A pending record torn by a power loss does not stop the start: it comes
// back as its container ID (the agent drops it); a pending record beside
// a committed one of the same container is superseded and removed; a
// pending name that is no container ID is refused like a bad record.
func TestLoadPendingRecords(t *testing.T) {
	s := openTemp(t)
	writeRaw(t, s, "torn.pending", `{"version":1,"containerID":"to`)
	writeRaw(t, s, "empty.pending", "")
	if err := s.Put(sample("both", Committed)); err != nil {
		t.Fatal(err)
	}
	stale := writeRaw(t, s, "both.pending", `{"version":1,"containerID":"both","state":"committed"}`)
	got := mustLoad(t, s)
	var summary []string
	for _, a := range got {
		summary = append(summary, fmt.Sprintf("%s %s %d", a.ContainerID, a.State, len(a.IPs)))
	}
	want := []string{"both committed 2", "empty pending 0", "torn pending 0"}
	if !reflect.DeepEqual(summary, want) {
		t.Errorf("Load = %v, want %v", summary, want)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("superseded pending record not removed: %v", err)
	}
	// The agent drops them with Delete.
	for _, id := range []string{"torn", "empty"} {
		if err := s.Delete(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := mustLoad(t, s); len(got) != 1 {
		t.Errorf("after Delete Load = %+v, want only both", got)
	}

	// Not torn but wrong: it may guard a veth and claims that are still
	// there, so the start stops, naming the file (which stays).
	for _, c := range []struct{ name, content, want string }{
		{"a b.pending", "{}", "a b"},
		{"v9.pending", `{"version":9,"containerID":"v9","state":"committed"}`, "record format 9; this flock reads record format 1"},
		{"mine.pending", `{"version":1,"containerID":"theirs","state":"committed"}`, "does not match file name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := openTemp(t)
			bad := writeRaw(t, s, c.name, c.content)
			_, err := s.Load()
			if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Load with %s = %v, want an error naming it and %q", bad, err, c.want)
			}
			if b, err := os.ReadFile(bad); err != nil || string(b) != c.content {
				t.Errorf("%s changed: %q, %v", bad, b, err)
			}
		})
	}
}
