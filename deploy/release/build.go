package release

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"code.fritzlab.net/fritzlab/flock/deploy/imagetar"
)

// Binaries are flock's commands (./cmd/<name>): what a release ships and
// the image holds in /usr/local/bin.
var Binaries = []string{"flock", "flock-agent", "flockctl", "flock-installer", "flock-policy", "flock-relay"}

// Stamp is what --version of every binary says (cmd/internal/buildinfo).
type Stamp struct {
	Version string
	Commit  string
}

const buildinfo = "code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"

// LDFlags are the Makefile's LDFLAGS: stripped, version and commit set.
func (s Stamp) LDFlags() string {
	return fmt.Sprintf("-s -w -X %s.version=%s -X %s.commit=%s", buildinfo, s.Version, buildinfo, s.Commit)
}

// Arch is the architecture the binaries and the image are built for: the
// one this program runs on (imagetar packs images for it).
var Arch = runtime.GOARCH

// BuildBinaries compiles every binary of the module at root, static
// (CGO_ENABLED=0, -trimpath), for linux/Arch into dir.
func BuildBinaries(root, dir string, s Stamp) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-ldflags", s.LDFlags(), "-o", dir + string(filepath.Separator)}
	for _, b := range Binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+Arch)
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, o)
	}
	return nil
}

// PackImage writes the binaries in binDir into an otherwise empty image's
// /usr/local/bin (entrypoint flock-agent), tagged tag, as a docker-archive
// tarball at out.
func PackImage(binDir, tag, out string) error {
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
		if err := copyFile(filepath.Join(binDir, b), filepath.Join(bin, b)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return imagetar.WriteImage(stage, tag, out, []string{"/usr/local/bin/flock-agent"}, nil)
}

// BuildImage is `make image`: the binaries of the module at root built
// with s and packed into an image tagged tag at out.
func BuildImage(root, tag, out string, s Stamp) error {
	bin, err := os.MkdirTemp("", "flock-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	if err := BuildBinaries(root, bin, s); err != nil {
		return err
	}
	return PackImage(bin, tag, out)
}

// copyFile copies src to dst with src's permission bits.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
