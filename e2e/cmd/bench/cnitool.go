package main

import (
	"bytes"
	"context"
	"crypto/sha512"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// cniModule is the module libcni and cnitool come from.
const cniModule = "github.com/containernetworking/cni"

// cnitool execs the CNI project's cnitool once per ADD and once per DEL,
// the way a container runtime that execs a CNI client per pod would: a
// process start, a config read from NETCONFPATH, libcni's result cache
// (cnitool's default, /var/lib/cni), then the plugin's own exec.
type cnitool struct {
	bin     string // the cnitool binary
	cniPath string // CNI_PATH: where the plugins are
	confDir string // NETCONFPATH: holds <network>.conflist
	network string
	version string // the network's cniVersion (to decode ADD results)
}

// buildCnitool installs cnitool, at the version of the CNI module this
// program is built with (go.mod's), into dir.
func buildCnitool(dir string) (string, error) {
	v, err := moduleVersion(cniModule)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command("go", "install", cniModule+"/cnitool@"+v)
	cmd.Dir = dir // outside the module: `go install pkg@version` builds it with its own go.mod
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install cnitool@%s: %w\n%s", v, err, out)
	}
	return v, nil
}

// moduleVersion is the version of module path this program was built
// with (runtime/debug's build info: go.mod's requirement, or its
// replacement), else what `go list -m` says in the repository.
func moduleVersion(path string) (string, error) {
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v, ok := depVersion(bi.Deps, path); ok {
			return v, nil
		}
	}
	root, err := lab.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("version of %s: %w", path, err)
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", path)
	cmd.Dir = root
	out, err := cmd.Output()
	v := strings.TrimSpace(string(out))
	if err != nil || v == "" {
		return "", fmt.Errorf("version of %s: go list -m: %v %q", path, err, v)
	}
	return v, nil
}

// depVersion finds path among a build's dependencies; a replacement by
// a local directory has no version.
func depVersion(deps []*debug.Module, path string) (string, bool) {
	for _, d := range deps {
		if d.Path != path {
			continue
		}
		if d.Replace != nil {
			return d.Replace.Version, d.Replace.Version != ""
		}
		return d.Version, d.Version != ""
	}
	return "", false
}

// cnitoolPlugin is p driven through cnitool instead of libcni in this
// process: the same network configuration, plugins and namespaces.
func cnitoolPlugin(p plugin, bin, dir, cniPath string, list *libcni.NetworkConfigList) (plugin, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return plugin{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, list.Name+".conflist"), list.Bytes, 0o644); err != nil {
		return plugin{}, err
	}
	p.name += " (cnitool)"
	p.tool = &cnitool{bin: bin, cniPath: cniPath, confDir: dir, network: list.Name, version: list.CNIVersion}
	p.cni = nil
	return p, nil
}

// cnitoolContainerID is the container ID cnitool gives a pod: it has no
// flag for one, and names it after its network namespace's path
// (cnitool/cmd/root.go, setupRuntimeConfig).
func cnitoolContainerID(netnsPath string) string {
	s := sha512.Sum512([]byte(netnsPath))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// cniArgs is CNI_ARGS as cnitool reads it: KEY=VALUE pairs joined by ';'
// (neither may be empty, nor hold '=' or ';').
func cniArgs(args [][2]string) (string, error) {
	var pairs []string
	for _, a := range args {
		if a[0] == "" || a[1] == "" || strings.ContainsAny(a[0]+a[1], "=;") {
			return "", fmt.Errorf("CNI_ARGS pair %q=%q: cnitool cannot pass it", a[0], a[1])
		}
		pairs = append(pairs, a[0]+"="+a[1])
	}
	return strings.Join(pairs, ";"), nil
}

// env is the whole environment cnitool runs with: what it reads, and
// PATH.
func (t *cnitool) env(pod lab.Pod) ([]string, error) {
	args, err := cniArgs(pod.Args)
	if err != nil {
		return nil, err
	}
	env := []string{"CNI_PATH=" + t.cniPath, "NETCONFPATH=" + t.confDir, "PATH=" + os.Getenv("PATH")}
	if args != "" {
		env = append(env, "CNI_ARGS="+args)
	}
	if pod.IfName != "" {
		env = append(env, "CNI_IFNAME="+pod.IfName)
	}
	return env, nil
}

// run execs `cnitool verb <network> <netns>` and returns its stdout.
func (t *cnitool) run(ctx context.Context, verb string, pod lab.Pod) ([]byte, error) {
	env, err := t.env(pod)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, t.bin, verb, t.network, pod.NS.Path)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("cnitool %s: %w: %s", verb, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func (t *cnitool) add(ctx context.Context, pod lab.Pod) (types.Result, error) {
	out, err := t.run(ctx, "add", pod)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return nil, errors.New("cnitool add: no result printed")
	}
	return version.NewResult(t.version, out)
}

func (t *cnitool) del(ctx context.Context, pod lab.Pod) error {
	_, err := t.run(ctx, "del", pod)
	return err
}
