package report

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run", "installer.json")
	if _, err := Read(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v, want ErrNotExist", err)
	}
	want := Report{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), CNIVersion: "1.0.0", Flock: []string{"1.0.0", "1.1.0"},
		Plugins:      []Plugin{{Type: "portmap", Path: "/opt/cni/bin/portmap", Versions: []string{"1.0.0"}}},
		ConflistPath: "/etc/cni/net.d/01-flock.conflist", Conflist: ConflistWritten}
	if err := Write(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	want.Format = Format // Write stamps it
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("read %+v (%v), want %+v", got, err, want)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
	if err := os.WriteFile(path, []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("garbage: %v", err)
	}
}

// Across releases: v0.20.0's report (no format) is read; one of a newer
// format is an error naming both formats.
func TestReadFormats(t *testing.T) {
	path := filepath.Join(t.TempDir(), "installer.json")
	for _, tc := range []struct {
		file string
		ok   bool
	}{
		{`{"time":"2026-11-20T10:00:00Z","cniVersion":"1.1.0","flockVersions":["1.1.0"],"conflist":"written"}`, true},
		{`{"format":1,"time":"2026-11-20T10:00:00Z","cniVersion":"1.1.0","flockVersions":["1.1.0"]}`, true},
		{`{"format":2,"time":"2026-11-20T10:00:00Z","cniVersion":"1.1.0","flockVersions":["1.1.0"]}`, false},
	} {
		if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := Read(path)
		if tc.ok && (err != nil || r.CNIVersion != "1.1.0") {
			t.Errorf("%s: %+v, %v", tc.file, r, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "format 2; this agent reads format 1")) {
			t.Errorf("%s: %v, want the formats named", tc.file, err)
		}
	}
}
