package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// RepoRoot finds the module root from the working directory.
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the flock module")
	}
	return filepath.Dir(mod), nil
}

// Build compiles the flock binaries into dir. The agent is built with the
// race detector when race is true, so integration tests also hunt races.
func Build(dir string, race bool) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	for _, c := range []string{"flock", "flock-agent", "flockctl", "flock-relay"} {
		args := []string{"build", "-o", filepath.Join(dir, c)}
		if race && c == "flock-agent" && runtime.GOARCH == "amd64" {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/"+c)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", c, err, out)
		}
	}
	return nil
}
