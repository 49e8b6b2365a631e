package imagetar

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteImage packs rootfsDir as the only layer of a linux image tagged tag
// (e.g. "registry.k8s.io/pause:3.10") and writes it to out as a
// docker-archive tarball. entrypoint and cmd become the image config's
// Entrypoint and Cmd; either may be nil. The architecture is the one this
// program runs on.
func WriteImage(rootfsDir, tag, out string, entrypoint, cmd []string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("parse image tag %q: %w", tag, err)
	}
	// The layer is staged in a file next to out, not in memory: a rootfs
	// can be large.
	staged, err := os.CreateTemp(filepath.Dir(out), ".layer-*.tar")
	if err != nil {
		return fmt.Errorf("stage layer for %s: %w", tag, err)
	}
	defer os.Remove(staged.Name())
	werr := writeLayerTar(rootfsDir, staged)
	if cerr := staged.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("layer for %s: %w", tag, werr)
	}
	img, err := build(staged.Name(), entrypoint, cmd)
	if err != nil {
		return fmt.Errorf("image %s: %w", tag, err)
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return fmt.Errorf("write %s to %s: %w", tag, out, err)
	}
	return nil
}

func build(layerPath string, entrypoint, cmd []string) (v1.Image, error) {
	// Caching the compressed bytes avoids gzipping the layer once for the
	// digest and again for the tarball.
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("load layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Entrypoint: entrypoint,
		Cmd:        cmd,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}
