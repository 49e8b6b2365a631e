package report

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
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
