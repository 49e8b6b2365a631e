// Package install puts the flock CNI plugin and its network config in
// place on a node. Both writes are atomic (temp file + rename in the target
// directory), so a runtime exec'ing the plugin mid-upgrade never runs a
// half-written binary, and repeating an install changes nothing.
package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// ConfName is lexically first so runtimes pick it over other CNIs' files.
const ConfName = "01-flock.conflist"

// Options for Install.
type Options struct {
	PluginSrc  string // the flock plugin binary to install
	CNIBinDir  string // e.g. /opt/cni/bin
	CNIConfDir string // e.g. /etc/cni/net.d
	Socket     string // agent CNI socket written into the config
	Portmap    bool   // chain the portmap plugin (hostPort)
	Bandwidth  bool   // chain the bandwidth plugin
	// CNIVersion of the conflist, default 1.1.0. Runtimes built on an older
	// libcni (containerd 1.6: up to 1.0.0) need an older one.
	CNIVersion string
}

// Versions the plugin supports, oldest first.
var Versions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Conflist renders the network config list.
func Conflist(o Options) ([]byte, error) {
	plugins := []map[string]any{{"type": "flock", "socket": o.Socket}}
	if o.Portmap {
		plugins = append(plugins, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}})
	}
	if o.Bandwidth {
		plugins = append(plugins, map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}})
	}
	v := o.CNIVersion
	if v == "" {
		v = "1.1.0"
	}
	if !slices.Contains(Versions, v) {
		return nil, fmt.Errorf("installer: cni-version %q: want one of %v", v, Versions)
	}
	b, err := json.MarshalIndent(map[string]any{"cniVersion": v, "name": "flock", "plugins": plugins}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Install copies the plugin and writes the config. It reports what changed.
func Install(o Options) (changed []string, err error) {
	if o.Socket == "" {
		return nil, fmt.Errorf("installer: socket path is empty")
	}
	conf, err := Conflist(o)
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(o.PluginSrc)
	if err != nil {
		return nil, fmt.Errorf("installer: plugin source: %w", err)
	}
	dst := filepath.Join(o.CNIBinDir, "flock")
	ok, err := writeIfChanged(dst, bin, 0o755)
	if err != nil {
		return nil, err
	}
	if ok {
		changed = append(changed, dst)
	}
	cdst := filepath.Join(o.CNIConfDir, ConfName)
	ok, err = writeIfChanged(cdst, conf, 0o644)
	if err != nil {
		return nil, err
	}
	if ok {
		changed = append(changed, cdst)
	}
	return changed, nil
}

func writeIfChanged(dst string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("installer: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".*.tmp")
	if err != nil {
		return false, fmt.Errorf("installer: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := io.Copy(tmp, bytes.NewReader(data)); err != nil {
		tmp.Close()
		return false, fmt.Errorf("installer: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return false, fmt.Errorf("installer: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, fmt.Errorf("installer: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("installer: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return false, fmt.Errorf("installer: install %s: %w", dst, err)
	}
	return true, nil
}
