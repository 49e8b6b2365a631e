// Package release is what a flock release is made of and how it is made:
// the version (the file VERSION at the module root), the binaries stamped
// with it, the image tagged with it, the deploy manifests pinned to that
// tag, and the CHANGELOG's entry for it. `make image` (deploy/imagetar/mkimage)
// builds the image from here; `make release` (deploy/release/mkrelease)
// writes the whole release with Make.
package release

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Image is the image's name; its tag is the version.
const Image = "docker.io/fritzlab/flock"

// Unreleased is the CHANGELOG section a development version (vX.Y.Z-dev)
// stands for.
const Unreleased = "Unreleased"

var (
	// plain is a release: vMAJOR.MINOR.PATCH, no pre-release, no build.
	plain = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
	// pre is a semver pre-release (vX.Y.Z-dev, vX.Y.Z-rc.1): fine for `make
	// image` and the labs, and for `make release` only when allowed.
	// No build metadata: "+" is not allowed in an image tag.
	pre = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*$`)
)

// ReadVersion is the file VERSION under root: the version the binaries
// are stamped with, the image's tag and the tag deploy/ pins.
func ReadVersion(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return "", fmt.Errorf("the release version: %w", err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("the file VERSION is empty")
	}
	return v, nil
}

// IsRelease says whether v is a plain release, vMAJOR.MINOR.PATCH.
func IsRelease(v string) bool { return plain.MatchString(v) }

// CheckVersion refuses a version that is not semver, and one that is a
// pre-release (vX.Y.Z-dev) unless allowDev.
func CheckVersion(v string, allowDev bool) error {
	switch {
	case plain.MatchString(v):
		return nil
	case pre.MatchString(v):
		if allowDev {
			return nil
		}
		return fmt.Errorf("VERSION %q is not a release (vMAJOR.MINOR.PATCH); RELEASE_ALLOW_DEV=1 builds it anyway", v)
	default:
		return fmt.Errorf("VERSION %q: want vMAJOR.MINOR.PATCH (or vMAJOR.MINOR.PATCH-PRERELEASE such as -dev)", v)
	}
}

// Section is CHANGELOG's entry for version v: its "## " heading line and
// everything up to the next one. A heading names its version first
// ("## v0.20.0 — 2026-11-26", "## [v0.20.0]"); a -dev version's entry is
// the Unreleased section. An entry must say what to do: it needs its
// "### Upgrade notes" and "### By hand".
func Section(changelog []byte, v string) (string, error) {
	want := v
	if strings.HasSuffix(v, "-dev") {
		want = Unreleased
	}
	var out []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(changelog))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "## ") {
			if in {
				break
			}
			f := strings.Fields(strings.TrimPrefix(l, "## "))
			in = len(f) > 0 && strings.Trim(f[0], "[]") == want
		}
		if in {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if len(out) == 0 {
		return "", fmt.Errorf("CHANGELOG.md has no section for %s (a heading \"## %s\")", v, want)
	}
	s := strings.TrimRight(strings.Join(out, "\n"), "\n \t") + "\n"
	for _, h := range []string{"### Upgrade notes", "### By hand"} {
		if !strings.Contains(s, "\n"+h+"\n") {
			return "", fmt.Errorf("CHANGELOG.md's section for %s has no %q", v, h)
		}
	}
	return s, nil
}

// Commit is the short VCS revision of the tree at root ("unknown" without
// git), as the Makefile's COMMIT.
func Commit(root string) string {
	cmd := exec.Command("git", "rev-parse", "--short", "HEAD")
	cmd.Dir = root
	if o, err := cmd.Output(); err == nil {
		return strings.TrimSpace(string(o))
	}
	return "unknown"
}

// PreviousRelease is the release an upgrade to v starts from: the newest
// plain release, other than v, that the file VERSION was set to in the
// history of root, and the commit that set it. Empty without git or
// without one.
func PreviousRelease(root, v string) (version, commit string) {
	cmd := exec.Command("git", "log", "--format=%h", "--", "VERSION")
	cmd.Dir = root
	o, err := cmd.Output()
	if err != nil {
		return "", ""
	}
	for _, c := range strings.Fields(string(o)) {
		show := exec.Command("git", "show", c+":VERSION")
		show.Dir = root
		b, err := show.Output()
		if err != nil {
			continue
		}
		if p := strings.TrimSpace(string(b)); IsRelease(p) && p != v {
			return p, c
		}
	}
	return "", ""
}
