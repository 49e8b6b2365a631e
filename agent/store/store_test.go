package store

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
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
