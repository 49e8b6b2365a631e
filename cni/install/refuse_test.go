package install

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/cni/install/report"
)

// debian links Debian 12's portmap and bandwidth (containernetworking-
// plugins 1.1.1: spec versions up to 1.0.0) into dir.
func debian(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"portmap", "bandwidth"} {
		src := filepath.Join("/usr/lib/cni", p)
		if _, err := os.Stat(src); err != nil {
			t.Fatalf("%v: install Debian's containernetworking-plugins (make deps)", err)
		}
		if err := os.Symlink(src, filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
}

// The real reference plugins of Debian 12 answer VERSION up to 1.0.0:
// the installer writes 1.0.0, where the old default 1.1.0 kept the node
// NotReady under containerd 2 (their STATUS fails: "missing containerID").
func TestDebianPluginsGet100(t *testing.T) {
	o := node(t)
	o.Portmap, o.Bandwidth = true, true
	debian(t, o.CNIBinDir)
	res, err := Install(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if c := readConflist(t, o); c.CNIVersion != "1.0.0" || len(c.Plugins) != 3 {
		t.Errorf("conflist %+v, want cniVersion 1.0.0 with portmap and bandwidth", c)
	}
	if len(res.Report.Plugins) != 2 {
		t.Fatalf("report plugins %+v", res.Report.Plugins)
	}
	for _, p := range res.Report.Plugins {
		if p.Error != "" || !slices.Contains(p.Versions, "1.0.0") || slices.Contains(p.Versions, "1.1.0") || p.Path != filepath.Join(o.CNIBinDir, p.Type) {
			t.Errorf("plugin %+v", p)
		}
	}
	// An explicit 1.0.0 is accepted.
	o.CNIVersion = "1.0.0"
	if _, err := Install(context.Background(), o); err != nil {
		t.Errorf("--cni-version 1.0.0: %v", err)
	}
}

// Current plugins (1.1.0) get 1.1.0: containerd asks them STATUS.
func TestCurrentPluginsGet110(t *testing.T) {
	o := node(t)
	o.Portmap, o.Bandwidth = true, true
	fakePlugin(t, o.CNIBinDir, "portmap", current...)
	fakePlugin(t, o.CNIBinDir, "bandwidth", "0.3.1", "1.1.0", "1.0.0") // any order
	if _, err := Install(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if c := readConflist(t, o); c.CNIVersion != "1.1.0" {
		t.Errorf("cniVersion %s, want 1.1.0", c.CNIVersion)
	}
	// Asked as libcni asks.
	if b, err := os.ReadFile(filepath.Join(o.CNIBinDir, "portmap.stdin")); err != nil || string(b) != `{"cniVersion":"1.1.0"}` {
		t.Errorf("VERSION stdin %q (%v)", b, err)
	}
	// Nothing chained: flock's highest.
	o = node(t)
	if _, err := Install(context.Background(), o); err != nil || readConflist(t, o).CNIVersion != "1.1.0" {
		t.Errorf("no chain: %v", err)
	}
}

// Every refusal names the plugin, its path and what it supports (or why
// it could not be asked), and flock's versions when versions are the
// problem; it writes no conflist and leaves no temp file.
func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, o *Options)
		want  []string
	}{
		{"override the chain does not support", func(t *testing.T, o *Options) {
			debian(t, o.CNIBinDir)
			o.CNIVersion = "1.1.0"
		}, []string{`--cni-version "1.1.0"`, "portmap (", "/bin/portmap) supports [0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0]", "flock supports [0.3.1, 0.4.0, 1.0.0, 1.1.0]"}},
		{"override flock does not support", func(t *testing.T, o *Options) {
			fakePlugin(t, o.CNIBinDir, "portmap", current...)
			fakePlugin(t, o.CNIBinDir, "bandwidth", current...)
			o.CNIVersion = "0.2.0"
		}, []string{`--cni-version "0.2.0"`, "flock supports [0.3.1"}},
		{"no common version", func(t *testing.T, o *Options) {
			fakePlugin(t, o.CNIBinDir, "portmap", "0.1.0", "0.2.0")
			fakePlugin(t, o.CNIBinDir, "bandwidth", current...)
		}, []string{"no CNI spec version", "portmap (", "/bin/portmap) supports [0.1.0, 0.2.0]", "flock supports"}},
		{"missing", func(t *testing.T, o *Options) {
			fakePlugin(t, o.CNIBinDir, "portmap", current...)
		}, []string{"chained plugin bandwidth (", "/bin/bandwidth): not found"}},
		{"not executable", func(t *testing.T, o *Options) {
			fakePlugin(t, o.CNIBinDir, "portmap", current...)
			if err := os.Chmod(fakePlugin(t, o.CNIBinDir, "bandwidth", current...), 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"chained plugin bandwidth (", "not executable (mode -rw-r--r--)"}},
		{"VERSION fails", func(t *testing.T, o *Options) {
			fakePlugin(t, o.CNIBinDir, "portmap", current...)
			script(t, o.CNIBinDir, "bandwidth", `echo '{"code":999,"msg":"fake: broken"}'; exit 1`)
		}, []string{"chained plugin bandwidth (", "VERSION failed: fake: broken"}},
		{"no VERSION at all (spec 0.1.0)", func(t *testing.T, o *Options) {
			fakePlugin(t, o.CNIBinDir, "portmap", current...)
			script(t, o.CNIBinDir, "bandwidth", `echo '{"code":4,"msg":"unknown CNI_COMMAND: VERSION"}'; exit 1`)
		}, []string{"no CNI spec version", "bandwidth (", "supports [0.1.0]"}},
		{"dangling symlink", func(t *testing.T, o *Options) {
			fakePlugin(t, o.CNIBinDir, "portmap", current...)
			if err := os.Symlink("/nonexistent/flock-test/bandwidth", filepath.Join(o.CNIBinDir, "bandwidth")); err != nil {
				t.Fatal(err)
			}
		}, []string{"chained plugin bandwidth (", "dangling symlink", "--host-root"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := node(t)
			o.Portmap, o.Bandwidth = true, true
			tc.setup(t, &o)
			res, err := Install(context.Background(), o)
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("err %v, want a refusal", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if res.Report.Error != err.Error() || res.Report.Conflist != report.ConflistNone || len(res.Report.Plugins) != 2 {
				t.Errorf("report %+v", res.Report)
			}
			if got := names(t, o.CNIConfDir); len(got) != 0 {
				t.Errorf("a refused install left %v in the conf dir", got)
			}
			for _, n := range names(t, o.CNIBinDir) {
				if strings.HasSuffix(n, ".tmp") {
					t.Errorf("temp file %s left in the bin dir", n)
				}
			}
		})
	}
}

// After a refusal a flock conflist in place stays if its chain runs it (a
// bad override does not take a working node down) and goes if not (the
// runtime would go on failing sandboxes or STATUS with it).
func TestRefusalSettlesTheConflistInPlace(t *testing.T) {
	o := node(t)
	o.Portmap, o.Bandwidth = true, true
	debian(t, o.CNIBinDir)
	if _, err := Install(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(o.CNIConfDir, ConfName)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	o.CNIVersion = "1.1.0"
	res, err := Install(context.Background(), o)
	if !errors.Is(err, ErrRefused) || res.Report.Conflist != report.ConflistKept || res.Report.CNIVersion != "1.0.0" {
		t.Fatalf("refused override: %v, report %+v; want the 1.0.0 conflist kept", err, res.Report)
	}
	if b, _ := os.ReadFile(path); string(b) != string(good) {
		t.Errorf("kept conflist changed:\n%s", b)
	}

	// One the chain cannot run (an older default of 1.1.0) goes.
	if err := os.WriteFile(path, []byte(strings.Replace(string(good), `"1.0.0"`, `"1.1.0"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = Install(context.Background(), o)
	if !errors.Is(err, ErrRefused) || res.Report.Conflist != report.ConflistRemoved || !slices.Contains(res.Changed, path) {
		t.Fatalf("refused with a 1.1.0 conflist in place: %v, %+v; want it removed", err, res)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("conflist the chain cannot run is still there: %v", err)
	}

	// So does one chaining a plugin that is gone, or garbage.
	for _, bad := range []string{
		`{"cniVersion":"1.0.0","name":"flock","plugins":[{"type":"flock"},{"type":"tuning"}]}`,
		`{not json`,
	} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if res, err := Install(context.Background(), o); !errors.Is(err, ErrRefused) || res.Report.Conflist != report.ConflistRemoved {
			t.Errorf("%s in place: %v, %+v; want it removed", bad, err, res.Report)
		}
	}
}

// With --host-root the chained plugins run chrooted there, as the
// runtime runs them on the host: a symlink that resolves only there (the
// e2e lab's and Debian's layout: /opt/cni/bin/portmap → /usr/lib/cni) is
// followed there, and the report gives the host's path.
func TestHostRootRunsPluginsOnTheHost(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("FLOCK_REQUIRE_ROOT") != "" {
			t.Fatal("needs root (chroot), and FLOCK_REQUIRE_ROOT is set")
		}
		t.Skip("needs root (chroot)")
	}
	root := t.TempDir()
	real := filepath.Join(root, "usr/lib/flock-test/portmap")
	build := exec.Command("go", "build", "-o", real, "-ldflags", "-X main.versions=0.3.1,0.4.0,1.0.0", "./testdata/fakeplugin")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the fake plugin: %v\n%s", err, out)
	}
	o := node(t)
	o.Portmap, o.HostRoot = true, root
	o.CNIBinDir, o.CNIConfDir = filepath.Join(root, "opt/cni/bin"), filepath.Join(root, "etc/cni/net.d")
	if err := os.MkdirAll(o.CNIBinDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/lib/flock-test/portmap", filepath.Join(o.CNIBinDir, "portmap")); err != nil {
		t.Fatal(err)
	}
	res, err := Install(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if c := readConflist(t, o); c.CNIVersion != "1.0.0" {
		t.Errorf("cniVersion %s, want the host plugin's highest, 1.0.0", c.CNIVersion)
	}
	if p := res.Report.Plugins[0]; p.Path != "/opt/cni/bin/portmap" || !slices.Equal(p.Versions, []string{"0.3.1", "0.4.0", "1.0.0"}) {
		t.Errorf("plugin %+v, want the host's path and the fake's versions", p)
	}
	if res.Report.ConflistPath != "/etc/cni/net.d/"+ConfName {
		t.Errorf("report names the conflist %s, want the host's path", res.Report.ConflistPath)
	}
	// Without it the symlink dangles here, and the refusal says what to do.
	o.HostRoot = ""
	if _, err := Install(context.Background(), o); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "--host-root") {
		t.Errorf("without --host-root: %v", err)
	}
}
