package k8slab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"code.fritzlab.net/fritzlab/flock/deploy/imagetar"
)

// busyboxBin is Debian busybox-static's binary: static, so it is the whole
// busybox image.
const busyboxBin = "/bin/busybox"

// writeImages packs the pause and busybox images as docker-archive
// tarballs under Dir/images and returns their paths.
func (c *Cluster) writeImages(pauseBin string) ([]string, error) {
	dir := filepath.Join(c.Opts.Dir, "images")
	pauseRoot := filepath.Join(dir, "pause-root")
	if err := os.MkdirAll(pauseRoot, 0o755); err != nil {
		return nil, fmt.Errorf("create pause rootfs: %w", err)
	}
	if err := copyFile(pauseBin, filepath.Join(pauseRoot, "pause"), 0o755); err != nil {
		return nil, err
	}
	pauseTar := filepath.Join(dir, "pause.tar")
	if err := imagetar.WriteImage(pauseRoot, PauseImage, pauseTar, []string{"/pause"}, nil); err != nil {
		return nil, err
	}
	bbRoot := filepath.Join(dir, "busybox-root")
	if err := busyboxRootfs(bbRoot); err != nil {
		return nil, err
	}
	bbTar := filepath.Join(dir, "busybox.tar")
	if err := imagetar.WriteImage(bbRoot, BusyboxImage, bbTar, nil, []string{"sh"}); err != nil {
		return nil, err
	}
	return []string{pauseTar, bbTar}, nil
}

// busyboxRootfs lays out a minimal root: busybox with a symlink per applet,
// root in passwd/group, and the mount points runc expects.
func busyboxRootfs(root string) error {
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("busybox rootfs: %w", err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		return fmt.Errorf("busybox rootfs: %w", err)
	}
	if err := copyFile(busyboxBin, filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		return err
	}
	out, err := exec.Command(busyboxBin, "--list").Output()
	if err != nil {
		return fmt.Errorf("list busybox applets: %w", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" {
			continue
		}
		link := filepath.Join(root, "bin", a)
		if err := os.Symlink("busybox", link); err != nil && !os.IsExist(err) {
			return fmt.Errorf("busybox rootfs: %w", err)
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":  "root:x:0:\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("busybox rootfs: %w", err)
		}
	}
	return nil
}

// ImportImage imports a docker-archive tarball into containerd's k8s.io
// namespace, where kubelet looks for images.
func (c *Cluster) ImportImage(ctx context.Context, tarPath string) error {
	return importImage(ctx, c.ContainerdDir, c.ContainerdSocket, tarPath)
}

func importImage(ctx context.Context, containerdDir, socket, tarPath string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(containerdDir, "ctr"), "-a", socket, "-n", "k8s.io", "images", "import", tarPath)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("import image %s: %w: %s", tarPath, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}
