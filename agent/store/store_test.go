package store

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func sample(id string, st State) Allocation {
	return Allocation{
		ContainerID: id,
		IfName:      "eth0",
		Netns:       "/var/run/netns/cni-" + id,
		HostVeth:    "flk" + id,
		State:       st,
		Pod:         podmeta.ID{Namespace: "default", Name: "pod-" + id, UID: "uid-" + id},
		IPs:         []netip.Addr{netip.MustParseAddr("2001:db8::5"), netip.MustParseAddr("10.1.2.3")},
		Addresses:   []netip.Addr{netip.MustParseAddr("2001:db8:ffff::1")},
		Anycast:     []netip.Addr{netip.MustParseAddr("2001:db8:aaaa::53"), netip.MustParseAddr("192.0.2.53")},
		Created:     time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("x", 3600)),
	}
}

// equalAlloc compares allocations, using time.Equal for Created.
func equalAlloc(t *testing.T, got, want Allocation) {
	t.Helper()
	if !got.Created.Equal(want.Created) {
		t.Errorf("Created = %v, want %v", got.Created, want.Created)
	}
	got.Created, want.Created = time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("allocation mismatch:\n got %+v\nwant %+v", got, want)
	}
}

func writeRaw(t *testing.T, s *Store, name, content string) string {
	t.Helper()
	p := filepath.Join(s.allocDir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustLoad(t *testing.T, s *Store) []Allocation {
	t.Helper()
	as, err := s.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return as
}

func TestOpenCreatesDir(t *testing.T) {
	root := filepath.Join(t.TempDir(), "state")
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if s.Dir() != root {
		t.Errorf("Dir() = %q, want %q", s.Dir(), root)
	}
	fi, err := os.Stat(filepath.Join(root, "allocations"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("allocations dir mode = %v, want dir 0700", fi.Mode())
	}
}

func TestPutLoadRoundTrip(t *testing.T) {
	s := openTemp(t)
	a := sample("abc123", Pending)
	if err := s.Put(a); err != nil {
		t.Fatal(err)
	}
	got := mustLoad(t, s)
	if len(got) != 1 {
		t.Fatalf("Load returned %d records, want 1", len(got))
	}
	a.Version = CurrentVersion
	equalAlloc(t, got[0], a)

	// The file is where the layout says it is, and no temp files remain.
	if _, err := os.Stat(filepath.Join(s.Dir(), "allocations", "abc123.json")); err != nil {
		t.Errorf("record file: %v", err)
	}
	ents, _ := os.ReadDir(s.allocDir)
	if len(ents) != 1 {
		t.Errorf("allocations dir has %d entries, want 1", len(ents))
	}

	// A fresh Store over the same directory sees the same data.
	s2, err := Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	got2 := mustLoad(t, s2)
	if len(got2) != 1 {
		t.Fatalf("reopened Load returned %d records", len(got2))
	}
	equalAlloc(t, got2[0], a)
}

func TestPutOverwritePendingToCommitted(t *testing.T) {
	s := openTemp(t)
	a := sample("c1", Pending)
	if err := s.Put(a); err != nil {
		t.Fatal(err)
	}
	a.State = Committed
	a.HostVeth = "flkchanged"
	if err := s.Put(a); err != nil {
		t.Fatal(err)
	}
	got := mustLoad(t, s)
	if len(got) != 1 {
		t.Fatalf("got %d records, want 1", len(got))
	}
	if got[0].State != Committed || got[0].HostVeth != "flkchanged" {
		t.Errorf("got state %q veth %q, want committed/flkchanged", got[0].State, got[0].HostVeth)
	}
}

func TestDeleteIdempotent(t *testing.T) {
	s := openTemp(t)
	if err := s.Put(sample("d1", Committed)); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(sample("d2", Committed)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := s.Delete("d1"); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if err := s.Delete("never-existed"); err != nil {
		t.Fatalf("Delete of missing record: %v", err)
	}
	got := mustLoad(t, s)
	if len(got) != 1 || got[0].ContainerID != "d2" {
		t.Fatalf("after delete got %+v, want only d2", got)
	}
}

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
		{"version 2", "v2.json", `{"version":2,"containerID":"v2","state":"pending"}`, "unsupported version 2"},
		{"version missing", "v0.json", `{"containerID":"v0","state":"pending"}`, "unsupported version 0"},
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

func TestBadContainerIDs(t *testing.T) {
	s := openTemp(t)
	bad := []string{"../x", "a/b", "", ".hidden", "..", ".", "a b", "x\x00y", "/abs", `a\b`, strings.Repeat("a", maxContainerIDLen+1), strings.Repeat("a", 256)}
	for _, id := range bad {
		a := sample("ok", Pending)
		a.ContainerID = id
		if err := s.Put(a); err == nil {
			t.Errorf("Put(%q) succeeded", id)
		} else if id != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", id)) {
			t.Errorf("Put(%q) error %q does not name the ID", id, err)
		}
		if err := s.Delete(id); err == nil {
			t.Errorf("Delete(%q) succeeded", id)
		}
	}
	// Nothing escaped the allocations dir.
	ents, _ := os.ReadDir(s.Dir())
	if len(ents) != 1 {
		t.Errorf("state dir has %d entries, want only allocations/", len(ents))
	}
	if got := mustLoad(t, s); len(got) != 0 {
		t.Errorf("records written for bad IDs: %+v", got)
	}
	// Boundary: the longest allowed ID (whose temp file name must also fit
	// in NAME_MAX) and dots/dashes inside are fine.
	if maxContainerIDLen != 234 {
		t.Errorf("maxContainerIDLen = %d, want 234", maxContainerIDLen)
	}
	for _, id := range []string{strings.Repeat("a", maxContainerIDLen), "a.b-c_D9", "a..b"} {
		if err := s.Put(sample(id, Pending)); err != nil {
			t.Errorf("Put(%q): %v", id, err)
		}
	}
}

func TestPutValidatesStateAndVersion(t *testing.T) {
	s := openTemp(t)
	for _, st := range []State{"", "deleting", "Committed"} {
		if err := s.Put(sample("st", st)); err == nil {
			t.Errorf("Put with state %q succeeded", st)
		}
	}
	a := sample("ver", Pending)
	a.Version = 2
	if err := s.Put(a); err == nil {
		t.Error("Put with version 2 succeeded")
	}
	a.Version = 1
	if err := s.Put(a); err != nil {
		t.Errorf("Put with explicit version 1: %v", err)
	}
}

func TestConcurrentPuts(t *testing.T) {
	s := openTemp(t)
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("ctr%02d", i)
			if err := s.Put(sample(id, Pending)); err != nil {
				errs <- err
				return
			}
			if err := s.Put(sample(id, Committed)); err != nil {
				errs <- err
			}
		}(i)
	}
	// Loads racing with Puts must neither fail nor break an in-flight Put
	// by deleting its temp file.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 20; i++ {
			if _, err := s.Load(); err != nil {
				errs <- err
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got := mustLoad(t, s)
	if len(got) != n {
		t.Fatalf("got %d records, want %d", len(got), n)
	}
	for i, a := range got {
		if want := fmt.Sprintf("ctr%02d", i); a.ContainerID != want || a.State != Committed {
			t.Errorf("record %d = %s/%s, want %s/committed", i, a.ContainerID, a.State, want)
		}
	}
}

// An ADD's record: pending (<id>.pending, whole, state pending on Load)
// from Begin, committed (<id>.json only) after Commit.
func TestBeginCommit(t *testing.T) {
	s := openTemp(t)
	a := sample("c1", Pending)
	d, err := s.Begin(a)
	if err != nil {
		t.Fatal(err)
	}
	if d.ContainerID() != "c1" {
		t.Errorf("ContainerID() = %q", d.ContainerID())
	}
	want := a
	want.Version = CurrentVersion
	got := mustLoad(t, s)
	if len(got) != 1 {
		t.Fatalf("after Begin Load = %+v, want one pending record", got)
	}
	equalAlloc(t, got[0], want)
	if _, err := os.Stat(filepath.Join(s.allocDir, "c1.pending")); err != nil {
		t.Errorf("pending record file: %v", err)
	}
	if err := s.Commit(d); err != nil {
		t.Fatal(err)
	}
	want.State = Committed
	got = mustLoad(t, s)
	if len(got) != 1 {
		t.Fatalf("after Commit Load = %+v, want one committed record", got)
	}
	equalAlloc(t, got[0], want)
	ents, _ := os.ReadDir(s.allocDir)
	if len(ents) != 1 || ents[0].Name() != "c1.json" {
		t.Errorf("allocations dir holds %v, want only c1.json", ents)
	}
	// A draft commits once, and only into its own store.
	if err := s.Commit(d); err == nil {
		t.Error("second Commit of the same draft succeeded")
	}
	other := openTemp(t)
	d2, err := s.Begin(sample("c2", Pending))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(d2); err == nil || !strings.Contains(err.Error(), "c2") {
		t.Errorf("Commit into another store = %v, want an error naming c2", err)
	}
}

// Bad input to Begin is refused, named, and leaves no file.
func TestBeginRefusesBadRecords(t *testing.T) {
	s := openTemp(t)
	for _, c := range []struct {
		a    Allocation
		want string
	}{
		{func() Allocation { a := sample("x", Pending); a.ContainerID = "../x"; return a }(), `"../x"`},
		{func() Allocation { a := sample("v", Pending); a.Version = 3; return a }(), "version 3"},
	} {
		if _, err := s.Begin(c.a); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Begin(%q) = %v, want an error naming %s", c.a.ContainerID, err, c.want)
		}
	}
	if ents, _ := os.ReadDir(s.allocDir); len(ents) != 0 {
		t.Errorf("refused records left %v", ents)
	}
}

// Delete ends a draft: no record remains and its Commit fails, naming it.
func TestDeleteDraft(t *testing.T) {
	s := openTemp(t)
	d, err := s.Begin(sample("gone", Pending))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("gone"); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, s); len(got) != 0 {
		t.Fatalf("after Delete Load = %+v", got)
	}
	if err := s.Commit(d); err == nil || !strings.Contains(err.Error(), "gone.pending") {
		t.Errorf("Commit after Delete = %v, want an error naming gone.pending", err)
	}
	if got := mustLoad(t, s); len(got) != 0 {
		t.Fatalf("after the failed Commit Load = %+v", got)
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
		{"v9.pending", `{"version":9,"containerID":"v9","state":"committed"}`, "unsupported version 9"},
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

// A leftover pending record of the container is refused by Begin, named,
// and left as it was.
func TestBeginRefusesLeftoverPending(t *testing.T) {
	s := openTemp(t)
	old := writeRaw(t, s, "c1.pending", `{"version":1,"containerID":"c1","state":"committed"}`)
	if _, err := s.Begin(sample("c1", Pending)); err == nil || !strings.Contains(err.Error(), old) {
		t.Errorf("Begin over a leftover = %v, want an error naming %s", err, old)
	}
	if b, _ := os.ReadFile(old); !strings.Contains(string(b), `"committed"`) || strings.Contains(string(b), "eth0") {
		t.Errorf("leftover overwritten: %s", b)
	}
}

// groupSync: every caller returns only after a sync that started after its
// change finished, a failed sync fails everyone it covered, and concurrent
// callers share syncs.
func TestGroupSync(t *testing.T) {
	var written, durable, syncs atomic.Int64
	var failNext atomic.Bool
	errSync := errors.New("injected fsync failure")
	g := groupSync{sync: func() error {
		at := written.Load()
		syncs.Add(1)
		time.Sleep(time.Millisecond)
		if failNext.Swap(false) {
			return errSync
		}
		for {
			d := durable.Load()
			if at <= d || durable.CompareAndSwap(d, at) {
				return nil
			}
		}
	}}
	const callers, rounds = 16, 20
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				w := written.Add(1)
				if err := g.Sync(); err != nil {
					if !errors.Is(err, errSync) {
						t.Errorf("Sync = %v", err)
					}
					failed.Add(1)
					continue
				}
				if d := durable.Load(); d < w {
					t.Errorf("Sync returned with change %d not covered (durable up to %d)", w, d)
				}
			}
		}()
		if failed.Load() == 0 {
			failNext.Store(true)
		}
	}
	wg.Wait()
	if n := syncs.Load(); n >= callers*rounds {
		t.Errorf("%d syncs for %d calls: none shared", n, callers*rounds)
	}
	if failed.Load() == 0 {
		t.Error("the injected fsync failure reached no caller")
	}
	t.Logf("%d syncs for %d calls, %d calls failed", syncs.Load(), callers*rounds, failed.Load())
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// A deleted record's file is emptied and becomes the next pending record
// (no new inode), holding only the new record; spares stay bounded and
// are not records.
func TestDeletedRecordFilesAreReused(t *testing.T) {
	s := openTemp(t)
	d, err := s.Begin(sample("old", Pending))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(d); err != nil {
		t.Fatal(err)
	}
	ino := inode(t, s.path("old"))
	if err := s.Delete("old"); err != nil {
		t.Fatal(err)
	}
	if got := mustLoadKeep(t, s); len(got) != 0 {
		t.Fatalf("after Delete: %+v", got)
	}
	idle(s)
	short := sample("new", Pending)
	short.Anycast, short.Addresses = nil, nil // shorter than the old record
	if _, err := s.Begin(short); err != nil {
		t.Fatal(err)
	}
	if got := inode(t, s.pendingPath("new")); got != ino {
		t.Errorf("pending record in inode %d, want the deleted record's %d", got, ino)
	}
	b, err := os.ReadFile(s.pendingPath("new"))
	if err != nil || strings.Contains(string(b), "old") || !strings.HasSuffix(string(b), "}\n") {
		t.Errorf("reused file holds %q (%v): want the new record alone", b, err)
	}

	// Bounded: a node that loses many pods at once keeps maxSpares.
	for i := range maxSpares + 10 {
		id := fmt.Sprintf("m%d", i)
		if err := s.Put(sample(id, Committed)); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(id); err != nil {
			t.Fatal(err)
		}
	}
	idle(s)
	ents, _ := os.ReadDir(s.allocDir)
	spares := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".spare-") {
			spares++
			if fi, _ := e.Info(); fi.Size() != 0 {
				t.Errorf("spare %s holds %d bytes", e.Name(), fi.Size())
			}
		}
	}
	if spares != maxSpares {
		t.Errorf("%d spare files, want %d", spares, maxSpares)
	}
	// Load removes spares, unread (a crash can leave one with content).
	writeRaw(t, s, ".spare-999999.tmp", `{"version":1,"containerID":"zombie","state":"committed"}`)
	got := mustLoad(t, s)
	if len(got) != 1 || got[0].ContainerID != "new" {
		t.Errorf("Load = %+v, want only new", got)
	}
	ents, _ = os.ReadDir(s.allocDir)
	if len(ents) != 1 {
		t.Errorf("after Load the directory holds %d files, want new.pending alone", len(ents))
	}
}

// With spares at hand, Begin still refuses a leftover pending record and
// keeps the spare.
func TestBeginWithSparesRefusesLeftover(t *testing.T) {
	s := openTemp(t)
	if err := s.Put(sample("x", Committed)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("x"); err != nil {
		t.Fatal(err)
	}
	idle(s)
	old := writeRaw(t, s, "c1.pending", `{"version":1,"containerID":"c1","state":"committed"}`)
	if _, err := s.Begin(sample("c1", Pending)); err == nil || !strings.Contains(err.Error(), old) {
		t.Errorf("Begin over a leftover = %v, want an error naming %s", err, old)
	}
	if b, _ := os.ReadFile(old); strings.Contains(string(b), "eth0") {
		t.Errorf("leftover overwritten: %s", b)
	}
	if n := spareCount(s); n != 1 {
		t.Errorf("%d spares after the refusal, want the 1 kept", n)
	}
}

// mustLoadKeep is Load without disturbing the spares: it reads the
// records the way Load does.
func mustLoadKeep(t *testing.T, s *Store) []string {
	t.Helper()
	ents, err := os.ReadDir(s.allocDir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range ents {
		if n := e.Name(); !strings.HasPrefix(n, ".") {
			ids = append(ids, n)
		}
	}
	return ids
}

func spareCount(s *Store) int {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	return len(s.spares)
}

// idle waits until none of the store's background work (spare fills,
// fsyncs, spares being emptied) is running: the pool and the directory
// then say all they will until the test's next call. Each such goroutine
// is counted in s.life before the call that starts it returns (and the
// test makes no call meanwhile), so the count is zero only when all is
// done.
func idle(s *Store) { s.life.wg.Wait() }

// A deleted record's file is emptied only once its removal is on disk
// (else a power loss could leave the record under its name, empty), and
// not reused at all when that sync fails.
func TestSpareEmptiedAfterDirSync(t *testing.T) {
	s := openTemp(t)
	if err := s.Put(sample("r1", Committed)); err != nil {
		t.Fatal(err)
	}
	var atSync []string
	errSync := errors.New("injected directory fsync failure")
	fail := false
	s.dirSync.sync = func() error {
		ents, _ := os.ReadDir(s.allocDir)
		for _, e := range ents {
			if fi, _ := e.Info(); strings.HasPrefix(e.Name(), ".spare-") && fi.Size() == 0 {
				atSync = append(atSync, e.Name())
			}
		}
		if fail {
			return errSync
		}
		return syncDir(s.allocDir)
	}
	if err := s.Delete("r1"); err != nil {
		t.Fatal(err)
	}
	idle(s)
	if n := spareCount(s); n != 1 {
		t.Fatalf("%d spares after r1's removal, want 1", n)
	}
	if atSync != nil {
		t.Errorf("spares %v emptied before the directory sync", atSync)
	}

	if err := s.Put(sample("r2", Committed)); err != nil {
		t.Fatal(err)
	}
	fail = true
	if err := s.Delete("r2"); !errors.Is(err, errSync) {
		t.Fatalf("Delete with a failing sync = %v, want the sync's error", err)
	}
	idle(s)
	if n := spareCount(s); n != 1 {
		t.Errorf("%d spares, want only r1's: r2's removal is not known to be on disk", n)
	}
	ents, _ := os.ReadDir(s.allocDir)
	if len(ents) != 1 {
		t.Errorf("directory holds %v, want r1's spare alone", ents)
	}
}

// spareFiles lists the spare files on disk, checking each is empty.
func spareFiles(t *testing.T, s *Store) map[uint64]string {
	t.Helper()
	ents, err := os.ReadDir(s.allocDir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]string{}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), sparePrefix) {
			continue
		}
		p := filepath.Join(s.allocDir, e.Name())
		if fi, err := os.Stat(p); err != nil || fi.Size() != 0 {
			t.Errorf("spare %s: %v, size %v: want empty", p, err, fi)
			continue
		}
		out[inode(t, p)] = p
	}
	return out
}

// With KeepSpares, a loaded store has that many empty files ready; pending
// records take them (no new file), the pool is topped up once half is
// gone, and a Load while new spares are made (it removes every spare)
// leaves no file behind: the pool is exactly what is on disk.
func TestSparesKeptReady(t *testing.T) {
	s := openTemp(t)
	const floor = 4
	s.KeepSpares(floor)
	mustLoad(t, s)
	idle(s)
	ready := spareFiles(t, s)
	if len(ready) != floor {
		t.Fatalf("%d spare files after Load, want %d", len(ready), floor)
	}
	if _, err := s.Begin(sample("a", Pending)); err != nil {
		t.Fatal(err)
	}
	if _, ok := ready[inode(t, s.pendingPath("a"))]; !ok {
		t.Errorf("pending record in a new file, not one of the spares %v", ready)
	}
	if n := spareCount(s); n != floor-1 {
		t.Errorf("%d spares after one taken, want %d (no new ones before half is gone)", n, floor-1)
	}
	if _, err := s.Begin(sample("b", Pending)); err != nil {
		t.Fatal(err)
	}
	idle(s) // the fill is done: one gone too far would show now
	if n, files := spareCount(s), spareFiles(t, s); n != floor || len(files) != floor {
		t.Errorf("pool %d, %d spare files: want %d of each", n, len(files), floor)
	}

	// Loads racing the fills they start: no spare file leaks.
	for i := range 20 {
		if _, err := s.Begin(sample(fmt.Sprintf("c%d", i), Pending)); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			mustLoad(t, s)
		}
	}
	mustLoad(t, s)
	idle(s) // every fill done, those the Loads made stale included
	if n, files := spareCount(s), spareFiles(t, s); n != floor || len(files) != floor {
		t.Errorf("after racing Loads: pool %d, %d spare files: want %d of each", n, len(files), floor)
	}
	if got := mustLoadKeep(t, s); len(got) != 22 {
		t.Errorf("records %v, want the 22 pending ones", got)
	}
}

// Close waits for every goroutine the store started: right after it, the
// directory can be removed and nothing writes into it again. (Without it,
// the spare fills of a just-loaded store kept creating files while a
// test's temp dir was removed: "directory not empty".)
func TestCloseWaitsForBackgroundWork(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	reached, release := make(chan struct{}), make(chan struct{})
	s.fillHook = func(i int) {
		if i == 2 {
			close(reached)
			<-release
		}
	}
	s.KeepSpares(16)
	mustLoad(t, s)                          // starts the fill
	d, err := s.Begin(sample("a", Pending)) // a background fsync too
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil { // and a spare being emptied
		t.Fatal(err)
	}
	if err := s.Commit(d); err == nil {
		t.Fatal("commit of a deleted pending record succeeded")
	}
	<-reached
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a spare fill was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	if n := len(spareFiles(t, s)); n > 3 {
		t.Errorf("%d spare files: the fill went on after Close", n)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("removing the directory after Close: %v", err)
	}
	if err := s.Close(); err != nil { // twice is harmless
		t.Fatal(err)
	}
}
