package conffile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPublish(t *testing.T) {
	dir := t.TempDir()
	staged := filepath.Join(dir, "stage", ConfName)
	conf := filepath.Join(dir, "net.d")
	if err := os.MkdirAll(filepath.Dir(staged), 0o755); err != nil {
		t.Fatal(err)
	}
	// Nothing staged: an error naming the file, nothing in the conf dir.
	if _, err := Publish(staged, conf); err == nil || !strings.Contains(err.Error(), staged) {
		t.Fatalf("publish with nothing staged: %v, want an error naming %s", err, staged)
	}
	if _, err := os.Stat(filepath.Join(conf, ConfName)); err == nil {
		t.Fatal("a conflist appeared though nothing was staged")
	}
	want := []byte(`{"cniVersion":"1.1.0","name":"flock","plugins":[{"type":"flock"}]}`)
	if err := os.WriteFile(staged, want, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, wantWrote := range []bool{true, false} {
		wrote, err := Publish(staged, conf)
		if err != nil || wrote != wantWrote {
			t.Fatalf("publish %d: wrote %v, %v; want %v", i, wrote, err, wantWrote)
		}
	}
	got, err := os.ReadFile(filepath.Join(conf, ConfName))
	if err != nil || string(got) != string(want) {
		t.Fatalf("published %q, %v; want %q", got, err, want)
	}
	if st, err := os.Stat(filepath.Join(conf, ConfName)); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("published mode %v, %v; want 0644", st.Mode(), err)
	}
	// The temp dir holds nothing afterwards; the conf dir only the conflist.
	if es, _ := os.ReadDir(filepath.Join(conf, TempDir)); len(es) != 0 {
		t.Errorf("left in %s: %v", TempDir, es)
	}
	es, _ := os.ReadDir(conf)
	for _, e := range es {
		if e.Name() != ConfName && e.Name() != TempDir {
			t.Errorf("unexpected %s in the conf dir", e.Name())
		}
	}
}
