// Command mkimage builds flock's container image offline: the four static
// binaries in /usr/local/bin of an otherwise empty image, written as a
// docker-archive tarball that `ctr images import` (and `docker load`)
// accept. No registry, no Docker engine. `make image` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"code.fritzlab.net/fritzlab/flock/deploy/imagetar"
)

// Binaries is what the image holds.
var Binaries = []string{"flock", "flock-agent", "flockctl", "flock-installer", "flock-policy"}

func main() {
	tag := flag.String("tag", "", "image name and tag (default docker.io/fritzlab/flock:<the file VERSION>)")
	out := flag.String("out", "out/flock-image.tar", "output tarball")
	flag.Parse()
	version, err := Release()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	if *tag == "" {
		*tag = "docker.io/fritzlab/flock:" + version
	}
	if err := Build(*tag, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", *out, "tagged", *tag)
}

// Release is the file VERSION (run from the module root): the version the
// binaries are stamped with and the image's default tag.
func Release() (string, error) {
	b, err := os.ReadFile("VERSION")
	if err != nil {
		return "", fmt.Errorf("the release version: %w", err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("the file VERSION is empty")
	}
	return v, nil
}

// Build compiles the binaries statically into a staging rootfs and packs it.
func Build(tag, out string) error {
	stage, err := os.MkdirTemp("", "flock-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	bin := filepath.Join(stage, "usr", "local", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	version, err := Release()
	if err != nil {
		return err
	}
	commit := "unknown"
	if o, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(o))
	}
	const bi = "code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	ldflags := fmt.Sprintf("-s -w -X %s.version=%s -X %s.commit=%s", bi, version, bi, commit)
	for _, b := range Binaries {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", filepath.Join(bin, b), "./cmd/"+b)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if o, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", b, err, o)
		}
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return imagetar.WriteImage(stage, tag, out, []string{"/usr/local/bin/flock-agent"}, nil)
}
