package release

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Options of Make.
type Options struct {
	// Root is the module's root: VERSION, CHANGELOG.md, cmd/, deploy/.
	Root string
	// Out is where the release goes: Out/<VERSION>/, replaced whole.
	Out string
	// AllowDev builds a pre-release VERSION (vX.Y.Z-dev) too
	// (RELEASE_ALLOW_DEV=1); without it only vMAJOR.MINOR.PATCH.
	AllowDev bool
	// Commit stamps the binaries; empty: Commit(Root).
	Commit string
}

// Files of a release, under Out/<VERSION>/.
const (
	NotesFile = "RELEASE-NOTES.md"
	SumsFile  = "SHA256SUMS"
	DeployDir = "deploy"
)

// BinDir is where the binaries go: bin/linux-<arch>.
func BinDir() string { return path.Join("bin", "linux-"+Arch) }

// ImageFile is the image tarball's name for version v.
func ImageFile(v string) string { return "flock-image-" + v + ".tar" }

// Make writes the release of the tree at o.Root into o.Out/<VERSION>/:
//
//	bin/linux-<arch>/<binary>   every binary, --version saying VERSION
//	flock-image-<VERSION>.tar   the image, docker.io/fritzlab/flock:<VERSION>
//	deploy/                     what `kubectl apply -k deploy/` applies, its
//	                            components, examples/ and tor/ (no Go files)
//	RELEASE-NOTES.md            CHANGELOG.md's section for VERSION
//	SHA256SUMS                  of every other file (sha256sum -c)
//
// It refuses, before building anything, a VERSION that is not a release
// (unless o.AllowDev), a CHANGELOG.md without its section, and deploy
// manifests pinned to another tag. It returns the release's directory.
func Make(o Options) (string, error) {
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return "", err
	}
	v, err := ReadVersion(root)
	if err != nil {
		return "", err
	}
	if err := CheckVersion(v, o.AllowDev); err != nil {
		return "", err
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return "", err
	}
	section, err := Section(changelog, v)
	if err != nil {
		return "", err
	}
	files, err := DeployFiles(filepath.Join(root, DeployDir))
	if err != nil {
		return "", err
	}
	if err := CheckPinned(filepath.Join(root, DeployDir), files, Image+":"+v); err != nil {
		return "", err
	}
	stamp := Stamp{Version: v, Commit: o.Commit}
	if stamp.Commit == "" {
		stamp.Commit = Commit(root)
	}

	// Built beside the final directory, which it replaces only once whole.
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return "", err
	}
	final := filepath.Join(o.Out, v)
	tmp, err := os.MkdirTemp(o.Out, "."+v+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)

	bin := filepath.Join(tmp, filepath.FromSlash(BinDir()))
	if err := BuildBinaries(root, bin, stamp); err != nil {
		return "", err
	}
	if err := PackImage(bin, Image+":"+v, filepath.Join(tmp, ImageFile(v))); err != nil {
		return "", err
	}
	for _, f := range files {
		dst := filepath.Join(tmp, DeployDir, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", err
		}
		if err := copyFile(filepath.Join(root, DeployDir, filepath.FromSlash(f)), dst); err != nil {
			return "", err
		}
	}
	notes := notes(root, v, stamp.Commit, section)
	if err := os.WriteFile(filepath.Join(tmp, NotesFile), []byte(notes), 0o644); err != nil {
		return "", err
	}
	sums, err := Sums(tmp)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, SumsFile), sums, 0o644); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.RemoveAll(final); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", err
	}
	return final, nil
}

// notes is RELEASE-NOTES.md: what was built, from what, the release an
// upgrade starts from, and the CHANGELOG's section.
func notes(root, v, commit, section string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# flock %s\n\n", v)
	fmt.Fprintf(&b, "Built from commit %s. Image `%s:%s` (linux/%s): `ctr -n k8s.io images import %s`.\n",
		commit, Image, v, Arch, ImageFile(v))
	fmt.Fprintf(&b, "Install: `kubectl apply -k deploy/`; binaries in `%s/`; `sha256sum -c %s`.\n", BinDir(), SumsFile)
	if p, c := PreviousRelease(root, v); p != "" {
		fmt.Fprintf(&b, "Upgrade from, or downgrade to, %s (VERSION set by commit %s) only.\n", p, c)
	}
	b.WriteString("\n" + section)
	return b.String()
}

// DeployFiles are the files of deployDir a release ships, relative and
// with slashes, sorted: every manifest, ToR config and example
// (.yaml, .yml, .conf, .cfg), none of the Go code or tests beside them.
// Every file a kustomization there names must be among them.
func DeployFiles(deployDir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(deployDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".yaml", ".yml", ".conf", ".cfg":
			rel, err := filepath.Rel(deployDir, p)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(out)
	for _, f := range out {
		if path.Base(f) != "kustomization.yaml" {
			continue
		}
		k, err := readKustomization(filepath.Join(deployDir, filepath.FromSlash(f)))
		if err != nil {
			return nil, err
		}
		for _, r := range slices.Concat(k.Resources, k.Components) {
			p := path.Join(path.Dir(f), r)
			if slices.Contains(out, p) || slices.Contains(out, path.Join(p, "kustomization.yaml")) {
				continue
			}
			return nil, fmt.Errorf("%s names %s, which a release would not ship", f, r)
		}
	}
	return out, nil
}

// Kustomization is the part of a kustomization.yaml a release reads.
type Kustomization struct {
	Resources  []string `json:"resources"`
	Components []string `json:"components"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

func readKustomization(file string) (*Kustomization, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var k Kustomization
	if err := yaml.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &k, nil
}

// Images are the image references in deployDir's files (relative paths):
// every string "image" field of every YAML document (the containers and
// init containers), and every kustomization's images: entry as the
// reference it sets (newName or name, ":" newTag). Each is named by where
// it is.
func Images(deployDir string, files []string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range files {
		if ext := path.Ext(f); ext != ".yaml" && ext != ".yml" {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(deployDir, filepath.FromSlash(f)))
		if err != nil {
			return nil, err
		}
		if path.Base(f) == "kustomization.yaml" {
			k, err := readKustomization(filepath.Join(deployDir, filepath.FromSlash(f)))
			if err != nil {
				return nil, err
			}
			for i, im := range k.Images {
				n := im.NewName
				if n == "" {
					n = im.Name
				}
				out[fmt.Sprintf("%s: images[%d]", f, i)] = n + ":" + im.NewTag
			}
			continue
		}
		docs, err := splitDocs(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for i, d := range docs {
			var obj any
			if err := yaml.Unmarshal(d, &obj); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", f, i, err)
			}
			walkImages(obj, fmt.Sprintf("%s[%d]", f, i), out)
		}
	}
	return out, nil
}

func walkImages(v any, at string, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && k == "image" {
				if n, ok := v["name"].(string); ok {
					out[at+" "+n] = s
				} else {
					out[at] = s
				}
				continue
			}
			walkImages(e, at+"."+k, out)
		}
	case []any:
		for i, e := range v {
			walkImages(e, fmt.Sprintf("%s[%d]", at, i), out)
		}
	}
}

// splitDocs splits a multi-document YAML file into its documents.
func splitDocs(raw []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out [][]byte
	for {
		d, err := r.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
}

// CheckPinned refuses deploy manifests with an image reference other than
// want (docker.io/fritzlab/flock:<VERSION>), or with none.
func CheckPinned(deployDir string, files []string, want string) error {
	im, err := Images(deployDir, files)
	if err != nil {
		return err
	}
	if len(im) == 0 {
		return fmt.Errorf("%s: no image reference", deployDir)
	}
	var bad []string
	for at, ref := range im {
		if ref != want {
			bad = append(bad, fmt.Sprintf("%s: %s", at, ref))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("deploy manifests not pinned to %s (the file VERSION): %s", want, strings.Join(bad, "; "))
	}
	return nil
}

// Sums is SHA256SUMS of every file under dir but itself, in sha256sum's
// format ("<hex>  <path>"), sorted by path.
func Sums(dir string) ([]byte, error) {
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == SumsFile {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", rel)
		}
		h, err := hashFile(p)
		if err != nil {
			return err
		}
		lines = append(lines, h+"  "+rel)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i][66:] < lines[j][66:] })
	return []byte(strings.Join(lines, "\n") + "\n"), nil
}

func hashFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
