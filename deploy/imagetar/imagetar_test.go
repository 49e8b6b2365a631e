package imagetar

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestWriteImage(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "app"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("app", filepath.Join(root, "bin", "alias")); err != nil {
		t.Fatal(err)
	}
	const tag = "example.test/app:1"
	out := filepath.Join(t.TempDir(), "a.tar")
	if err := WriteImage(root, tag, out, []string{"/bin/app"}, []string{"serve"}); err != nil {
		t.Fatal(err)
	}
	ref, _ := name.NewTag(tag)
	img, err := tarball.ImageFromPath(out, &ref)
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/bin/app"}) || !slices.Equal(cf.Config.Cmd, []string{"serve"}) || cf.OS != "linux" {
		t.Errorf("config: os %q entrypoint %q cmd %q", cf.OS, cf.Config.Entrypoint, cf.Config.Cmd)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		names = append(names, h.Name)
	}
	if want := []string{"bin/", "bin/alias", "bin/app"}; !slices.Equal(names, want) {
		t.Errorf("layer entries %q, want %q", names, want)
	}

	// The same rootfs gives the same image: re-imports are no-ops.
	out2 := filepath.Join(t.TempDir(), "b.tar")
	if err := WriteImage(root, tag, out2, []string{"/bin/app"}, []string{"serve"}); err != nil {
		t.Fatal(err)
	}
	img2, err := tarball.ImageFromPath(out2, &ref)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := img2.Digest()
	if d1 != d2 {
		t.Errorf("digests differ: %s vs %s", d1, d2)
	}
}
