package install

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstallAtomicAndIdempotent(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "flock")
	if err := os.WriteFile(src, []byte("plugin-v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := Options{PluginSrc: src, CNIBinDir: filepath.Join(dir, "bin"), CNIConfDir: filepath.Join(dir, "net.d"), Socket: "/run/flock/cni.sock", Portmap: true}
	changed, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 2 {
		t.Fatalf("first install changed %v", changed)
	}
	st, err := os.Stat(filepath.Join(o.CNIBinDir, "flock"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("plugin: %v %v", st, err)
	}
	var conf struct {
		CNIVersion string           `json:"cniVersion"`
		Plugins    []map[string]any `json:"plugins"`
	}
	b, err := os.ReadFile(filepath.Join(o.CNIConfDir, ConfName))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	if conf.CNIVersion != "1.1.0" || len(conf.Plugins) != 2 || conf.Plugins[0]["socket"] != o.Socket || conf.Plugins[1]["type"] != "portmap" {
		t.Errorf("conflist: %s", b)
	}
	if changed, err := Install(o); err != nil || len(changed) != 0 {
		t.Errorf("second install changed %v (%v), want nothing", changed, err)
	}
	if err := os.WriteFile(src, []byte("plugin-v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if changed, err := Install(o); err != nil || len(changed) != 1 || !strings.HasSuffix(changed[0], "/bin/flock") {
		t.Errorf("upgrade changed %v (%v), want only the plugin", changed, err)
	}
	ents, _ := os.ReadDir(o.CNIBinDir)
	if len(ents) != 1 {
		t.Errorf("temp files left in the bin dir: %v", ents)
	}
}

func TestInstallErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Install(Options{PluginSrc: filepath.Join(dir, "missing"), CNIBinDir: dir, CNIConfDir: dir, Socket: "/s"}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing source: %v", err)
	}
	if _, err := Install(Options{PluginSrc: "/bin/true", CNIBinDir: dir, CNIConfDir: dir}); err == nil || !strings.Contains(err.Error(), "socket") {
		t.Errorf("empty socket: %v", err)
	}
}

func TestCNIVersion(t *testing.T) {
	b, err := Conflist(Options{Socket: "/s", CNIVersion: "1.0.0"})
	if err != nil || !strings.Contains(string(b), `"cniVersion": "1.0.0"`) {
		t.Errorf("1.0.0: %s %v", b, err)
	}
	dir := t.TempDir()
	_, err = Install(Options{PluginSrc: "/bin/true", CNIBinDir: dir, CNIConfDir: dir, Socket: "/s", CNIVersion: "2.0"})
	if err == nil || !strings.Contains(err.Error(), `cni-version "2.0"`) {
		t.Errorf("bad version: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a rejected install wrote %v", ents)
	}
}
