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

// versionLDFlags stamps the release into the binaries as the Kubernetes
// build does; without it they report v0.0.0 and kubectl warns of skew.
func versionLDFlags() string {
	flags := []string{"-s", "-w"}
	for _, p := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		flags = append(flags,
			"-X", p+".gitVersion="+KubeVersion,
			"-X", p+".gitMajor=1", "-X", p+".gitMinor=34",
			"-X", p+".gitTreeState=clean",
			"-X", p+".buildDate=2026-01-01T00:00:00Z")
	}
	return strings.Join(flags, " ")
}

// BuildBinaries builds kube-apiserver, kube-controller-manager,
// kube-scheduler, kubelet and kubectl (KubeVersion) into cacheDir and
// returns it. Binaries already there are kept: a cold build takes several
// minutes and about 2 GB of memory per link.
func BuildBinaries(ctx context.Context, cacheDir string, log func(format string, args ...any)) (string, error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("create cache dir: %w", err)
	}
	unlock, err := lockDir(cacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	var pkgs, names []string
	for _, c := range kubeCommands {
		if isExecutable(filepath.Join(cacheDir, c)) {
			continue
		}
		names = append(names, c)
		pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+c)
	}
	if len(pkgs) == 0 {
		return cacheDir, nil
	}
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	// One go build for all commands shares their package graph; the outputs
	// are moved into place only when all of them linked.
	tmp, err := os.MkdirTemp(cacheDir, ".build-")
	if err != nil {
		return "", fmt.Errorf("create build dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	log("k8slab: building %s %s (minutes on a cold Go build cache)", strings.Join(names, " "), KubeVersion)
	start := time.Now()
	args := append([]string{"build", "-trimpath", "-ldflags", versionLDFlags(), "-o", tmp + "/"}, pkgs...)
	// CGO stays at its default so that this build shares the Go build cache
	// with any other build of the same module.
	if err := runGo(ctx, filepath.Join(src, "build"), nil, args...); err != nil {
		return "", fmt.Errorf("build kubernetes %s: %w", strings.Join(names, " "), err)
	}
	for _, n := range names {
		if err := os.Rename(filepath.Join(tmp, n), filepath.Join(cacheDir, n)); err != nil {
			return "", fmt.Errorf("install %s into cache: %w", n, err)
		}
	}
	log("k8slab: built %s in %s", strings.Join(names, " "), time.Since(start).Round(time.Second))
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
