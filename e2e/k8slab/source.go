package k8slab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// sourceDir is this package's directory. The build modules (./build/*)
// and the pause command (./pause) are built from it; they cannot be
// embedded because each build module is a module of its own.
func sourceDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Dir(file)
		if _, err := os.Stat(filepath.Join(dir, "build", "cni-plugins", "go.mod")); err == nil {
			return dir, nil
		}
	}
	// Built with -trimpath: go test runs in the package directory.
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find k8slab sources: %w", err)
	}
	for _, dir := range []string{wd, filepath.Join(wd, "e2e", "k8slab")} {
		if _, err := os.Stat(filepath.Join(dir, "build", "cni-plugins", "go.mod")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("find k8slab sources: build/cni-plugins/go.mod not found next to the package or under the working directory")
}

// goTool is the go command that builds the lab's binaries: a test run as
// root through sudo may not have Go's bin dir on PATH.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go" // where the Go tarball installs it

}
