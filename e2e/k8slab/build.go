package k8slab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// kubeCommands are the Kubernetes binaries the lab runs.
var kubeCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

// kubeLDFlags stamp the release into the binaries as the Kubernetes build
// does; without them they report v0.0.0 and kubectl warns of skew.
func kubeLDFlags(r Release) string {
	flags := []string{"-s", "-w"}
	minor := strings.TrimPrefix(r.Minor, "1.")
	for _, p := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		flags = append(flags,
			"-X", p+".gitVersion="+r.Kube,
			"-X", p+".gitMajor=1", "-X", p+".gitMinor="+minor,
			"-X", p+".gitTreeState=clean",
			"-X", p+".buildDate=2026-01-01T00:00:00Z")
	}
	return strings.Join(flags, " ")
}

// buildKubernetes builds the release's Kubernetes commands into its cache
// dir and returns it: a cold build takes several minutes and about 2 GB of
// memory per link.
func buildKubernetes(ctx context.Context, o Options) (string, error) {
	var pkgs []string
	cmds := kubeCommands
	if o.Services || o.KubeProxy {
		cmds = append(cmds[:len(cmds):len(cmds)], KubeProxy)
	}
	for _, c := range cmds {
		pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+c)
	}
	return build(ctx, o.Log, o.cacheDir("k8s", o.Release.Kube), o.Release.kubeModule(), "Kubernetes "+o.Release.Kube, pkgs, kubeLDFlags(o.Release), nil)
}

// containerdCommands are containerd, its runc shim and ctr (images are
// imported with it).
var containerdCommands = []string{"containerd", "containerd-shim-runc-v2", "ctr"}

// buildContainerd builds the release's containerd into its cache dir,
// static (no cgo: overlayfs and runc need none).
func buildContainerd(ctx context.Context, o Options) (string, error) {
	imp := o.Release.containerdImport()
	var pkgs []string
	for _, c := range containerdCommands {
		pkgs = append(pkgs, imp+"/cmd/"+c)
	}
	ld := "-s -w -X " + imp + "/version.Version=" + o.Release.Containerd
	return build(ctx, o.Log, o.cacheDir("containerd", o.Release.Containerd), o.Release.containerdModule(), "containerd "+o.Release.Containerd, pkgs, ld, []string{"CGO_ENABLED=0"})
}

// pluginPaths are the reference CNI plugins the lab builds: those chained
// after flock (portmap, bandwidth) and those run beside it.
var pluginPaths = []string{"meta/portmap", "meta/bandwidth", "main/loopback", "main/ptp", "ipam/host-local"}

// buildCNIPlugins builds the release's reference CNI plugins into their
// cache dir.
func buildCNIPlugins(ctx context.Context, o Options) (string, error) {
	var pkgs []string
	for _, p := range pluginPaths {
		pkgs = append(pkgs, "github.com/containernetworking/plugins/plugins/"+p)
	}
	ld := "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=" + o.Release.CNIPlugins
	return build(ctx, o.Log, o.cacheDir("cni-plugins", o.Release.CNIPlugins), "cni-plugins", "CNI plugins "+o.Release.CNIPlugins, pkgs, ld, []string{"CGO_ENABLED=0"})
}

// CoreDNSVersion is the CoreDNS the lab builds for Services
// (build/coredns pins it).
const CoreDNSVersion = "v1.15.0"

// buildCoreDNS builds CoreDNS with the plugins the lab's Corefile uses.
func buildCoreDNS(ctx context.Context, o Options) (string, error) {
	return build(ctx, o.Log, o.cacheDir("coredns", CoreDNSVersion), "coredns", "CoreDNS "+CoreDNSVersion,
		[]string{"code.fritzlab.net/fritzlab/flock/e2e/k8slab/build/coredns"}, "-s -w", []string{"CGO_ENABLED=0"})
}

// build builds pkgs of the module build/<module> into cacheDir and returns
// it; binaries already there are kept. One go build for all commands
// shares their package graph.
func build(ctx context.Context, log func(string, ...any), cacheDir, module, what string, pkgs []string, ldflags string, env []string) (string, error) {
	names := make([]string, len(pkgs))
	for i, p := range pkgs {
		names[i] = filepath.Base(p)
	}
	return buildInto(ctx, log, cacheDir, what, names, func(src, tmp string, todo []int) error {
		args := []string{"build", "-trimpath", "-ldflags", ldflags, "-o", tmp + "/"}
		for _, i := range todo {
			args = append(args, pkgs[i])
		}
		return runGo(ctx, filepath.Join(src, "build", module), env, args...)
	})
}

// buildInto makes the binaries names in cacheDir that are not there yet:
// run gets the source dir, a temporary dir to write them into and the
// indexes of the missing names; they are moved into place only when all
// of them were made. Builds into one cache dir are serialised across
// processes.
func buildInto(ctx context.Context, log func(string, ...any), cacheDir, what string, names []string, run func(src, tmp string, todo []int) error) (string, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("create cache dir: %w", err)
	}
	unlock, err := lockDir(cacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	var todo []int
	var missing []string
	for i, n := range names {
		if !isExecutable(filepath.Join(cacheDir, n)) {
			todo, missing = append(todo, i), append(missing, n)
		}
	}
	if len(todo) == 0 {
		return cacheDir, nil
	}
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cacheDir, ".build-")
	if err != nil {
		return "", fmt.Errorf("create build dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	log("k8slab: building %s: %s (minutes on a cold Go build cache)", what, strings.Join(missing, " "))
	start := time.Now()
	if err := run(src, tmp, todo); err != nil {
		return "", fmt.Errorf("build %s: %w", what, err)
	}
	for _, n := range missing {
		if err := os.Rename(filepath.Join(tmp, n), filepath.Join(cacheDir, n)); err != nil {
			return "", fmt.Errorf("install %s into cache: %w", n, err)
		}
	}
	log("k8slab: built %s in %s", what, time.Since(start).Round(time.Second))
	return cacheDir, nil
}

// buildPause builds the sandbox binary into cacheDir, static (CGO off) so
// that its image needs nothing else.
func buildPause(ctx context.Context, cacheDir string) (string, error) {
	out := filepath.Join(cacheDir, "pause")
	if isExecutable(out) {
		return out, nil
	}
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	if err := runGo(ctx, src, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-ldflags", "-s -w", "-o", tmp, "./pause"); err != nil {
		return "", fmt.Errorf("build pause: %w", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("install pause into cache: %w", err)
	}
	return out, nil
}

func runGo(ctx context.Context, dir string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = dir
	// GOWORK=off: the build module belongs to no workspace.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args[:1], " "), err, tail(out.String(), 30))
	}
	return nil
}

// lockDir serialises builds into one cache dir across processes.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open cache lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock cache dir: %w", err)
	}
	return func() { f.Close() }, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
