package release

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// root is the module's root, seen from this package.
const root = "../.."

func treeVersion(t *testing.T) string {
	t.Helper()
	v, err := ReadVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var (
	made    sync.Once
	madeDir string
	madeErr error
)

// release is `make release RELEASE_ALLOW_DEV=1` of this tree, made once
// for the tests that read it (building the binaries is most of the cost).
func release(t *testing.T) string {
	t.Helper()
	made.Do(func() {
		out, err := os.MkdirTemp("", "flock-release-test-")
		if err != nil {
			madeErr = err
			return
		}
		madeDir, madeErr = Make(Options{Root: root, Out: out, AllowDev: true})
	})
	if madeErr != nil {
		t.Fatal(madeErr)
	}
	return madeDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if madeDir != "" {
		os.RemoveAll(filepath.Dir(madeDir))
	}
	os.Exit(code)
}

// The tree's VERSION is semver and CHANGELOG.md has its section: a bump
// of VERSION without its entry fails here, not only at release time.
func TestTreeVersionHasChangelog(t *testing.T) {
	v := treeVersion(t)
	if err := CheckVersion(v, true); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Section(b, v); err != nil {
		t.Fatal(err)
	}
	// Every release named in the CHANGELOG has both subsections.
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(strings.TrimPrefix(l, "## ")); strings.HasPrefix(l, "## ") && len(f) > 0 && IsRelease(f[0]) {
			if _, err := Section(b, f[0]); err != nil {
				t.Error(err)
			}
		}
	}
}

// The image the release's manifests install is the image the release
// holds, and both are the file VERSION.
func TestReleaseImageReferences(t *testing.T) {
	v := treeVersion(t)
	want := Image + ":" + v
	dir := release(t)
	deploy := filepath.Join(dir, DeployDir)

	// The DaemonSet, decoded as Kubernetes does: its containers and init
	// containers.
	raw, err := os.ReadFile(filepath.Join(deploy, "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(raw, &ds); err != nil {
		t.Fatal(err)
	}
	p := ds.Spec.Template.Spec
	cs := slices.Concat(p.InitContainers, p.Containers)
	if len(cs) < 3 {
		t.Fatalf("DaemonSet has %d containers, want install-cni, agent, policy", len(cs))
	}
	for _, c := range cs {
		if c.Image != want {
			t.Errorf("daemonset.yaml: container %s: image %q, want %s", c.Name, c.Image, want)
		}
	}
	// The kustomization's images: what `kubectl apply -k` sets.
	var k Kustomization
	raw, err = os.ReadFile(filepath.Join(deploy, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Images) == 0 {
		t.Error("kustomization.yaml: no images: entry pins the tag")
	}
	for _, im := range k.Images {
		if im.Name != Image || im.NewName != Image || im.NewTag != v {
			t.Errorf("kustomization.yaml: images entry %+v, want %s → %s", im, Image, want)
		}
	}
	// And any other image field anywhere in what was shipped.
	files := walk(t, deploy)
	refs, err := Images(deploy, files)
	if err != nil {
		t.Fatal(err)
	}
	for at, ref := range refs {
		if ref != want {
			t.Errorf("%s: image %q, want %s", at, ref, want)
		}
	}

	// The tarball's tag, from its manifest.json (docker-archive).
	tags := imageTags(t, filepath.Join(dir, ImageFile(v)))
	if !slices.Equal(tags, []string{want}) {
		t.Errorf("%s: RepoTags %q, want [%s]", ImageFile(v), tags, want)
	}
}

func imageTags(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("%s: no manifest.json", file)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []struct{ RepoTags []string }
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			t.Fatal(err)
		}
		var tags []string
		for _, e := range m {
			tags = append(tags, e.RepoTags...)
		}
		return tags
	}
}

// What deploy/ ships: everything `kubectl apply -k` reads, the
// components, the examples and the ToR configs; no Go.
func TestReleaseDeployFiles(t *testing.T) {
	dir := release(t)
	deploy := filepath.Join(dir, DeployDir)
	files := walk(t, deploy)
	for _, f := range []string{
		"kustomization.yaml", "namespace.yaml", "rbac.yaml", "daemonset.yaml",
		"crd/flock.fritzlab.net_nodeconfigs.yaml", "crd/flock.fritzlab.net_addressclaims.yaml",
		"monitoring/kustomization.yaml", "monitoring/podmonitor.yaml",
		"nodeconfig-policy/kustomization.yaml",
		"admin-network-policy/kustomization.yaml",
		"examples/nodeconfig.yaml", "tor/bird.conf", "tor/frr.conf",
	} {
		if !slices.Contains(files, f) {
			t.Errorf("deploy/%s not in the release (%q)", f, files)
		}
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".go") || strings.Contains(f, "testdata") {
			t.Errorf("deploy/%s: not a manifest", f)
		}
	}
	// Every file a kustomization names is there.
	for _, f := range files {
		if filepath.Base(f) != "kustomization.yaml" {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(deploy, f))
		if err != nil {
			t.Fatal(err)
		}
		var k Kustomization
		if err := yaml.Unmarshal(raw, &k); err != nil {
			t.Fatal(err)
		}
		for _, r := range slices.Concat(k.Resources, k.Components) {
			if _, err := os.Stat(filepath.Join(deploy, filepath.Dir(f), r)); err != nil {
				t.Errorf("deploy/%s names %s: %v", f, r, err)
			}
		}
	}
	// The same bytes as the tree's.
	for _, f := range files {
		a, _ := os.ReadFile(filepath.Join(deploy, f))
		b, _ := os.ReadFile(filepath.Join(root, DeployDir, f))
		if string(a) != string(b) {
			t.Errorf("deploy/%s differs from the tree's", f)
		}
	}
}

// Every binary says the version, and the image holds the same ones.
func TestReleaseBinaries(t *testing.T) {
	v := treeVersion(t)
	dir := release(t)
	for _, b := range Binaries {
		p := filepath.Join(dir, filepath.FromSlash(BinDir()), b)
		out, err := exec.Command(p, "--version").CombinedOutput()
		if err != nil {
			t.Errorf("%s --version: %v\n%s", b, err, out)
			continue
		}
		if !strings.HasPrefix(string(out), b+" "+v+" (commit ") {
			t.Errorf("%s --version: %q, want %s %s (commit …)", b, out, b, v)
		}
	}
}

// SHA256SUMS covers every file, and each sum matches.
func TestReleaseSums(t *testing.T) {
	dir := release(t)
	f, err := os.Open(filepath.Join(dir, SumsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("%s: bad line %q", SumsFile, sc.Text())
		}
		listed[name] = sum
	}
	all := walk(t, dir)
	for _, name := range all {
		if name == SumsFile {
			continue
		}
		want, ok := listed[name]
		if !ok {
			t.Errorf("%s not in %s", name, SumsFile)
			continue
		}
		delete(listed, name)
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		if got := hex.EncodeToString(h[:]); got != want {
			t.Errorf("%s: sha256 %s, %s says %s", name, got, SumsFile, want)
		}
	}
	for name := range listed {
		t.Errorf("%s lists %s, which is not in the release", SumsFile, name)
	}
	if len(all) < len(Binaries)+4 {
		t.Errorf("release holds only %q", all)
	}
}

// RELEASE-NOTES.md is the CHANGELOG's section for the version.
func TestReleaseNotes(t *testing.T) {
	v := treeVersion(t)
	dir := release(t)
	notes, err := os.ReadFile(filepath.Join(dir, NotesFile))
	if err != nil {
		t.Fatal(err)
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	section, err := Section(changelog, v)
	if err != nil {
		t.Fatal(err)
	}
	heading, body, _ := strings.Cut(section, "\n")
	if !strings.Contains(string(notes), "\n"+heading+"\n") || !strings.Contains(string(notes), body) {
		t.Errorf("%s lacks CHANGELOG.md's section %q:\n%s", NotesFile, heading, notes)
	}
	if !strings.HasPrefix(string(notes), "# flock "+v+"\n") {
		t.Errorf("%s starts %q, want the title # flock %s", NotesFile, strings.SplitN(string(notes), "\n", 2)[0], v)
	}
}

// fakeRoot is a module root with only what Make reads before building:
// VERSION, CHANGELOG.md (the tree's) and the tree's deploy manifests.
func fakeRoot(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte(version+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := DeployFiles(filepath.Join(root, DeployDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		dst := filepath.Join(dir, DeployDir, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, DeployDir, f))
		if err != nil {
			t.Fatal(err)
		}
		// Pinned to this version, as a release's tree would be.
		b = []byte(strings.ReplaceAll(string(b), treeVersion(t), version))
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Make refuses, before building anything, what is not a release: each
// error names the value.
func TestMakeRefuses(t *testing.T) {
	for _, c := range []struct {
		name     string
		version  string
		allowDev bool
		edit     func(t *testing.T, root string)
		want     []string
	}{
		{name: "dev version", version: "v0.21.0-dev", want: []string{`"v0.21.0-dev"`, "not a release", "RELEASE_ALLOW_DEV=1"}},
		{name: "release candidate", version: "v0.21.0-rc.1", want: []string{`"v0.21.0-rc.1"`, "not a release"}},
		{name: "not semver", version: "v0.21", allowDev: true, want: []string{`"v0.21"`, "vMAJOR.MINOR.PATCH"}},
		{name: "no v", version: "0.21.0", allowDev: true, want: []string{`"0.21.0"`}},
		{name: "no CHANGELOG section", version: "v9.9.9", want: []string{"CHANGELOG.md", "v9.9.9"}},
		{name: "no CHANGELOG section for a pre-release", version: "v9.9.9-rc.1", allowDev: true, want: []string{"CHANGELOG.md", "v9.9.9-rc.1"}},
		{name: "section without By hand", version: "v0.20.0", edit: func(t *testing.T, root string) {
			p := filepath.Join(root, "CHANGELOG.md")
			b, _ := os.ReadFile(p)
			head, tail, _ := strings.Cut(string(b), "## v0.20.0")
			tail = strings.Replace(tail, "### By hand", "### Manual", 1)
			os.WriteFile(p, []byte(head+"## v0.20.0"+tail), 0o644)
		}, want: []string{"v0.20.0", `"### By hand"`}},
		{name: "manifests pinned elsewhere", version: "v0.20.0", edit: func(t *testing.T, root string) {
			p := filepath.Join(root, DeployDir, "daemonset.yaml")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, []byte(strings.Replace(string(b), Image+":v0.20.0", Image+":v0.19.0", 1)), 0o644)
		}, want: []string{"daemonset.yaml", Image + ":v0.19.0", "not pinned to " + Image + ":v0.20.0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := fakeRoot(t, c.version)
			if c.edit != nil {
				c.edit(t, r)
			}
			out := t.TempDir()
			dir, err := Make(Options{Root: r, Out: out, AllowDev: c.allowDev})
			if err == nil {
				t.Fatalf("made %s", dir)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if left, _ := os.ReadDir(out); len(left) != 0 {
				t.Errorf("a refused release left %v", left)
			}
		})
	}
}

func TestSection(t *testing.T) {
	const cl = `# Changelog

## Unreleased

### Added
- b

### Upgrade notes
nothing

### By hand
nothing

## [v1.2.3] - 2026-01-02

### Upgrade notes
u

### By hand
nothing

## v1.2.2

text
`
	s, err := Section([]byte(cl), "v1.3.0-dev")
	if err != nil || !strings.HasPrefix(s, "## Unreleased\n") || strings.Contains(s, "v1.2.3") {
		t.Errorf("v1.3.0-dev: %q, %v", s, err)
	}
	s, err = Section([]byte(cl), "v1.2.3")
	if err != nil || !strings.HasPrefix(s, "## [v1.2.3] - 2026-01-02\n") || !strings.HasSuffix(s, "### By hand\nnothing\n") {
		t.Errorf("v1.2.3: %q, %v", s, err)
	}
	if _, err := Section([]byte(cl), "v1.2.2"); err == nil || !strings.Contains(err.Error(), "Upgrade notes") {
		t.Errorf("v1.2.2 without its subsections: %v", err)
	}
	if _, err := Section([]byte(cl), "v1.2"); err == nil || !strings.Contains(err.Error(), "v1.2") {
		t.Errorf("v1.2: %v", err)
	}
}

// walk lists the files under dir, relative, with slashes.
func walk(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		out = append(out, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
