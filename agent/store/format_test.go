package store

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// copyDir copies the testdata state directory src into a new temp dir.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// The previous release's state (v0.20.0 wrote testdata/state-v0.20.0,
// before the directory had a stamp) is this release's: adopted, stamped,
// every allocation read back.
func TestAdoptPreviousRelease(t *testing.T) {
	dir := copyDir(t, "testdata/state-v0.20.0")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	found, err := s.Adopt("v0.21.0")
	if err != nil || found != (Stamp{}) {
		t.Fatalf("Adopt = %+v, %v; want no stamp found, no error", found, err)
	}
	recs, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ContainerID+":"+string(r.State))
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"c0ffee01:committed", "c0ffee02:pending"}) {
		t.Fatalf("records %v", ids)
	}
	if got := readStamp(t, dir); got != (Stamp{Format: StateFormat, Release: "v0.21.0"}) {
		t.Fatalf("stamp %+v", got)
	}
	// The previous release again (a downgrade within one format): it
	// reads it and stamps it as its own.
	if _, err := s.Adopt("v0.20.1"); err != nil {
		t.Fatal(err)
	}
	if got := readStamp(t, dir); got.Release != "v0.20.1" {
		t.Fatalf("stamp after the downgrade %+v", got)
	}
}

func readStamp(t *testing.T, dir string) Stamp {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, FormatFile))
	if err != nil {
		t.Fatal(err)
	}
	var st Stamp
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	// Adopt by the release that wrote it returns it and rewrites nothing.
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Adopt(st.Release); err != nil || got != st {
		t.Fatalf("the writer's own Adopt = %+v, %v; want %+v", got, err, st)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, FormatFile)); string(after) != string(b) {
		t.Fatalf("the writer's own Adopt rewrote the stamp: %s → %s", b, after)
	}
	return st
}

// Bad input: a newer format is refused naming both releases and both
// formats, an unreadable stamp naming the file; either way the stamp and
// the allocations stay as they were.
func TestAdoptRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, stamp string
		want        []string
		newer       bool
	}{
		{"newer format", `{"format":2,"release":"v0.23.0"}`, []string{"flock v0.23.0", "state format 2", "this is flock v0.21.0", "state format 1 at most"}, true},
		{"not JSON", `{"format":`, []string{FormatFile, "unreadable"}, false},
		{"format 0", `{"format":0,"release":"v0.1.0"}`, []string{FormatFile, "unreadable"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t, "testdata/state-v0.20.0")
			path := filepath.Join(dir, FormatFile)
			if err := os.WriteFile(path, []byte(tc.stamp), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Adopt("v0.21.0")
			if err == nil {
				t.Fatal("adopted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if errors.Is(err, ErrNewerFormat) != tc.newer {
				t.Errorf("errors.Is(ErrNewerFormat) = %v", !tc.newer)
			}
			if b, _ := os.ReadFile(path); string(b) != tc.stamp {
				t.Errorf("stamp changed to %s", b)
			}
			if n, _ := filepath.Glob(filepath.Join(dir, "allocations", "*.json")); len(n) != 2 {
				t.Errorf("allocations %v", n)
			}
			if tmp, _ := filepath.Glob(filepath.Join(dir, ".*")); len(tmp) != 0 {
				t.Errorf("left behind %v", tmp)
			}
		})
	}
}
