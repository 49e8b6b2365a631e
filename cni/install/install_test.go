package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/cni/install/conffile"
	"code.fritzlab.net/fritzlab/flock/cni/install/report"
	"code.fritzlab.net/fritzlab/flock/cni/plugin"
)

// current is what containernetworking/plugins v1.9 answers to VERSION.
var current = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// fakePlugin writes a shell-script plugin that answers VERSION with
// versions and records its stdin next to itself (path + ".stdin").
func fakePlugin(t *testing.T, dir, typ string, versions ...string) string {
	t.Helper()
	vs, _ := json.Marshal(versions)
	return script(t, dir, typ, fmt.Sprintf(`cat > "$0.stdin"
if [ "$CNI_COMMAND" = VERSION ]; then echo '{"cniVersion":"1.1.0","supportedVersions":%s}'; exit 0; fi
echo '{"code":4,"msg":"fake: only VERSION"}'; exit 1`, vs))
}

func script(t *testing.T, dir, typ, body string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, typ)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// node is a CNI bin dir, a conf dir and a plugin source in a temp dir.
func node(t *testing.T) Options {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "src", "flock")
	if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, []byte("plugin-v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Options{PluginSrc: src, CNIBinDir: filepath.Join(dir, "bin"), CNIConfDir: filepath.Join(dir, "net.d"), Socket: "/run/flock/cni.sock"}
}

type conflist struct {
	CNIVersion string           `json:"cniVersion"`
	Plugins    []map[string]any `json:"plugins"`
}

func readConflist(t *testing.T, o Options) conflist {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(o.CNIConfDir, ConfName))
	if err != nil {
		t.Fatal(err)
	}
	var c conflist
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return c
}

// names lists dir's entries ("" for a missing dir).
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestInstallAtomicAndIdempotent(t *testing.T) {
	o := node(t)
	o.Portmap = true
	fakePlugin(t, o.CNIBinDir, "portmap", current...)
	res, err := Install(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changed) != 2 || res.Report.Conflist != report.ConflistWritten || res.Report.CNIVersion != "1.1.0" || res.Report.Error != "" {
		t.Fatalf("first install: %+v", res)
	}
	st, err := os.Stat(filepath.Join(o.CNIBinDir, "flock"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("plugin: %v %v", st, err)
	}
	c := readConflist(t, o)
	if c.CNIVersion != "1.1.0" || len(c.Plugins) != 2 || c.Plugins[0]["socket"] != o.Socket || c.Plugins[1]["type"] != "portmap" {
		t.Errorf("conflist: %+v", c)
	}
	if res, err := Install(context.Background(), o); err != nil || len(res.Changed) != 0 || res.Report.Conflist != report.ConflistUnchanged {
		t.Errorf("second install: %+v (%v), want nothing changed", res, err)
	}
	if err := os.WriteFile(o.PluginSrc, []byte("plugin-v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if res, err := Install(context.Background(), o); err != nil || len(res.Changed) != 1 || !strings.HasSuffix(res.Changed[0], "/bin/flock") {
		t.Errorf("upgrade changed %v (%v), want only the plugin", res.Changed, err)
	}
	if got := names(t, o.CNIBinDir); !slices.Equal(got, []string{"flock", "portmap", "portmap.stdin"}) {
		t.Errorf("bin dir holds %v: temp files left?", got)
	}
	if got := names(t, filepath.Join(o.CNIConfDir, TempDir)); len(got) != 0 {
		t.Errorf("temp files left in %s: %v", TempDir, got)
	}
}

func TestInstallErrors(t *testing.T) {
	o := node(t)
	o.PluginSrc = filepath.Join(t.TempDir(), "missing")
	if _, err := Install(context.Background(), o); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing source: %v", err)
	}
	o = node(t)
	o.Socket = ""
	if _, err := Install(context.Background(), o); err == nil || !strings.Contains(err.Error(), "socket") {
		t.Errorf("empty socket: %v", err)
	}
	o = node(t)
	o.HostRoot = "/host"
	if res, err := Install(context.Background(), o); err == nil || !strings.Contains(err.Error(), "not under --host-root") || res.Report.Error != err.Error() {
		t.Errorf("bin dir outside the host root: %v (report %+v)", err, res.Report)
	}
	if got := names(t, o.CNIBinDir); len(got) != 0 {
		t.Errorf("a failed install wrote %v", got)
	}
	o = node(t)
	o.HostRoot = filepath.Dir(o.CNIBinDir)
	o.CNIConfDir = "/etc/cni/net.d"
	if _, err := Install(context.Background(), o); err == nil || !strings.Contains(err.Error(), `--cni-conf-dir "/etc/cni/net.d" is not under --host-root`) {
		t.Errorf("conf dir outside the host root: %v", err)
	}
}

// flock's own list is the plugin's.
func TestVersionsAreThePlugins(t *testing.T) {
	if got := plugin.SupportedVersions; !slices.Equal(got, Versions) {
		t.Errorf("install.Versions %v, the plugin supports %v", Versions, got)
	}
}

func TestConflistVersion(t *testing.T) {
	b, err := Conflist(Options{Socket: "/s", CNIVersion: "1.0.0"})
	if err != nil || !strings.Contains(string(b), `"cniVersion": "1.0.0"`) {
		t.Errorf("1.0.0: %s %v", b, err)
	}
	if _, err := Conflist(Options{Socket: "/s", CNIVersion: "2.0"}); err == nil || !strings.Contains(err.Error(), `"2.0"`) {
		t.Errorf("2.0: %v", err)
	}
}

// With a stage dir the conflist waits there for the agent: the conf dir
// the runtime watches gets nothing, the report says where it is staged,
// and publishing it gives exactly what an in-place install writes.
func TestInstallStaged(t *testing.T) {
	o := node(t)
	o.StageDir = filepath.Join(t.TempDir(), "run-flock")
	res, err := Install(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(o.StageDir, ConfName)
	if res.Report.Conflist != report.ConflistStaged || res.Report.Staged != staged || res.Report.Error != "" {
		t.Fatalf("staged install: %+v", res.Report)
	}
	if got := names(t, o.CNIConfDir); len(got) != 0 {
		t.Fatalf("the runtime's conf dir holds %v before the agent serves", got)
	}
	if _, err := conffile.Publish(res.Report.Staged, o.CNIConfDir); err != nil {
		t.Fatal(err)
	}
	published, err := os.ReadFile(filepath.Join(o.CNIConfDir, ConfName))
	if err != nil {
		t.Fatal(err)
	}
	inPlace := o
	inPlace.StageDir, inPlace.CNIConfDir = "", filepath.Join(t.TempDir(), "net.d")
	if _, err := Install(context.Background(), inPlace); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(inPlace.CNIConfDir, ConfName))
	if err != nil || string(published) != string(want) {
		t.Errorf("published %s, in place %s (%v)", published, want, err)
	}
	if res, err := Install(context.Background(), o); err != nil || len(res.Changed) != 0 {
		t.Errorf("second staged install changed %v (%v)", res.Changed, err)
	}
}
