package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/cni/install/report"
)

// ErrRefused is wrapped by Install when it will not write a conflist: a
// chained plugin is missing, cannot be run, or shares no spec version
// with flock (or not the one asked for). The runtime would fail every
// sandbox (ADD) or keep the node NotReady (STATUS) with such a config.
var ErrRefused = errors.New("refused to write the CNI config")

// probeTimeout bounds one plugin's VERSION.
const probeTimeout = 10 * time.Second

// chain lists the chained plugin types, in conflist order.
func (o Options) chain() []string {
	var out []string
	if o.Portmap {
		out = append(out, "portmap")
	}
	if o.Bandwidth {
		out = append(out, "bandwidth")
	}
	return out
}

// onHost is path as the runtime sees it: under HostRoot the installer's
// path minus that prefix.
func (o Options) onHost(flag, path string) (string, error) {
	if o.HostRoot == "" {
		return path, nil
	}
	rel, err := filepath.Rel(o.HostRoot, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("installer: %s %q is not under --host-root %q", flag, path, o.HostRoot)
	}
	return filepath.Join("/", rel), nil
}

// probe asks the plugin typ in the CNI bin dir which spec versions it
// supports, the way libcni does (CNI_COMMAND=VERSION). Under HostRoot it
// runs chrooted there: the runtime execs plugins on the host, where a
// symlink into /usr/lib/cni or a dynamically linked binary (Debian's
// plugins are both) resolves, and the installer's image has neither.
func (o Options) probe(ctx context.Context, typ string) report.Plugin {
	hostDir, err := o.onHost("--cni-bin-dir", o.CNIBinDir)
	if err != nil {
		return report.Plugin{Type: typ, Error: err.Error()}
	}
	p := report.Plugin{Type: typ, Path: filepath.Join(hostDir, typ)}
	local := filepath.Join(o.CNIBinDir, typ)
	fi, err := os.Lstat(local)
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 && o.HostRoot == "" {
		if fi, err = os.Stat(local); errors.Is(err, fs.ErrNotExist) {
			p.Error = "a dangling symlink (if it points into the host's filesystem, run the installer with --host-root)"
			return p
		}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		p.Error = "not found (install the CNI reference plugins there, or drop it from the chain)"
		return p
	case err != nil:
		p.Error = err.Error()
		return p
	case fi.IsDir():
		p.Error = "a directory, not a plugin"
		return p
	case fi.Mode()&fs.ModeSymlink == 0 && fi.Mode().Perm()&0o111 == 0:
		p.Error = fmt.Sprintf("not executable (mode %v)", fi.Mode().Perm())
		return p
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	info, err := invoke.GetVersionInfo(ctx, p.Path, &hostExec{root: o.HostRoot})
	if err != nil {
		p.Error = "VERSION failed: " + err.Error()
		return p
	}
	p.Versions = info.SupportedVersions()
	if len(p.Versions) == 0 {
		p.Error = "VERSION answered no supported versions"
	}
	return p
}

// hostExec runs a plugin for libcni's invoke, chrooted into root if set.
type hostExec struct {
	root string
	version.PluginDecoder
}

func (e hostExec) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	c := exec.CommandContext(ctx, path)
	c.Env, c.Stdin, c.Stdout, c.Stderr = environ, bytes.NewReader(stdin), &stdout, &stderr
	if e.root != "" {
		c.SysProcAttr = &syscall.SysProcAttr{Chroot: e.root}
		c.Dir = "/"
	}
	if err := c.Run(); err != nil {
		// A plugin's own error is JSON on stdout; libcni compares its
		// message ("unknown CNI_COMMAND: VERSION" means spec 0.1.0).
		var te types.Error
		if json.Unmarshal(stdout.Bytes(), &te) == nil && te.Msg != "" {
			return nil, &te
		}
		if errors.Is(err, fs.ErrNotExist) && e.root != "" {
			return nil, fmt.Errorf("%w (on the host under %s: a dangling symlink or a missing dynamic loader)", err, e.root)
		}
		if s := strings.TrimSpace(stderr.String()); s != "" {
			return nil, fmt.Errorf("%w: %s", err, s)
		}
		return nil, err
	}
	return stdout.Bytes(), nil
}

func (hostExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

// choose returns the conflist's cniVersion: want if flock and every
// plugin support it, else (want empty) the highest version they all
// support. Any other outcome wraps ErrRefused and names each plugin, its
// path and its versions.
func choose(want string, plugins []report.Plugin) (string, error) {
	var broken []string
	common := slices.Clone(Versions)
	for _, p := range plugins {
		if p.Error != "" {
			broken = append(broken, fmt.Sprintf("chained plugin %s (%s): %s", p.Type, p.Path, p.Error))
			continue
		}
		common = slices.DeleteFunc(common, func(v string) bool { return !slices.Contains(p.Versions, v) })
	}
	if len(broken) > 0 {
		return "", fmt.Errorf("installer: %w: %s", ErrRefused, strings.Join(broken, "; "))
	}
	supports := func() string {
		parts := []string{"flock supports " + list(Versions)}
		for _, p := range plugins {
			if p.Type == "runtime" {
				parts = append(parts, fmt.Sprintf("the runtime %s (its libcni) runs %s", p.Path, list(p.Versions)))
				continue
			}
			parts = append(parts, fmt.Sprintf("%s (%s) supports %s", p.Type, p.Path, list(p.Versions)))
		}
		return strings.Join(parts, "; ")
	}
	if want != "" {
		if !slices.Contains(common, want) {
			return "", fmt.Errorf("installer: %w: --cni-version %q: not supported by all of the chain: %s", ErrRefused, want, supports())
		}
		return want, nil
	}
	if len(common) == 0 {
		return "", fmt.Errorf("installer: %w: no CNI spec version that flock and every chained plugin support: %s", ErrRefused, supports())
	}
	best := common[0]
	for _, v := range common[1:] {
		if gt, err := version.GreaterThan(v, best); err == nil && gt {
			best = v
		}
	}
	return best, nil
}

func list(vs []string) string { return "[" + strings.Join(vs, ", ") + "]" }
