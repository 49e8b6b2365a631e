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

	"code.fritzlab.net/fritzlab/flock/deploy/imagetar"
)

// Binaries is what the image holds.
var Binaries = []string{"flock", "flock-agent", "flockctl", "flock-installer", "flock-policy"}

func main() {
	tag := flag.String("tag", "docker.io/fritzlab/flock:dev", "image name and tag")
	out := flag.String("out", "out/flock-image.tar", "output tarball")
	flag.Parse()
	if err := Build(*tag, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", *out, "tagged", *tag)
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
	for _, b := range Binaries {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(bin, b), "./cmd/"+b)
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
