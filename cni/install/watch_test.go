package install

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// confEvents watches dir as containerd and CRI-O do (fsnotify, not
// recursive). Each call of the returned func returns the events since the
// last, as "OP name", up to a barrier file it creates: inotify delivers
// in order, so once the barrier shows, everything before it has.
func confEvents(t *testing.T, dir string) func() []string {
	t.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
	n := 0
	return func() []string {
		t.Helper()
		n++
		barrier := fmt.Sprintf("zz-barrier-%d", n)
		if err := os.WriteFile(filepath.Join(dir, barrier), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var out []string
		timeout := time.After(testutil.Timeout)
		for {
			select {
			case ev := <-w.Events:
				name := filepath.Base(ev.Name)
				if name == barrier && ev.Has(fsnotify.Create) {
					return out
				}
				if !strings.HasPrefix(name, "zz-barrier-") {
					out = append(out, ev.Op.String()+" "+name)
				}
			case err := <-w.Errors:
				t.Fatalf("watch: %v", err)
			case <-timeout:
				t.Fatalf("the barrier %s never showed; events so far %v", barrier, out)
			}
		}
	}
}

// The runtime's watcher sees the conflist appear whole and nothing else:
// no temp file in the conf dir, only the temp dir's creation the first
// time; an install that changes nothing makes no event. containerd
// reloads on Write (never on Create, which is what a rename into the dir
// is): the conflist gets one.
func TestInstallShowsTheWatcherOnlyTheConflist(t *testing.T) {
	o := node(t)
	o.Portmap = true
	fakePlugin(t, o.CNIBinDir, "portmap", current...)
	if err := os.MkdirAll(o.CNIConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Another CNI's config is there: the runtime would log a reload error
	// for any unparsable file in the dir.
	if err := os.WriteFile(filepath.Join(o.CNIConfDir, "10-other.conflist"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	events := confEvents(t, o.CNIConfDir)
	install := func() {
		t.Helper()
		if _, err := Install(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		what   string
		change func()
		want   []string
	}{
		{"first install", func() {}, []string{"CREATE " + TempDir, "CREATE " + ConfName, "WRITE " + ConfName}},
		{"same again", func() {}, nil},
		{"new socket", func() { o.Socket = "/run/flock2/cni.sock" }, []string{"CREATE " + ConfName, "WRITE " + ConfName}},
		{"new plugin binary only", func() {
			if err := os.WriteFile(o.PluginSrc, []byte("plugin-v2"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, nil},
	} {
		step.change()
		install()
		if got := events(); !slices.Equal(got, step.want) {
			t.Errorf("%s: the conf dir's watcher saw %q, want %q", step.what, got, step.want)
		}
	}
	if got := readConflist(t, o); got.Plugins[0]["socket"] != "/run/flock2/cni.sock" {
		t.Errorf("conflist %+v", got)
	}
	if got := names(t, filepath.Join(o.CNIConfDir, TempDir)); len(got) != 0 {
		t.Errorf("left in %s: %v", TempDir, got)
	}
}
