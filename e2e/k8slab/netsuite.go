package k8slab

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"code.fritzlab.net/fritzlab/flock/deploy/imagetar"
)

// Upstream's e2e suite, network tests only (build/kubernetes-v<minor>/
// netsuite), and agnhost, the server most of its tests run: built from
// the same release as the lab's binaries, cached beside them.
const (
	NetsuiteBin = "e2e.test"
	agnhostPkg  = "k8s.io/kubernetes/test/images/agnhost"
)

// BuildNetsuite builds e2e.test and agnhost for o.Release into the
// release's cache dir (k8s-<version>) and returns that dir. Only releases
// whose build module has netsuite/ (the newest) can.
func BuildNetsuite(ctx context.Context, o Options) (string, error) {
	if err := o.setDefaults(); err != nil {
		return "", err
	}
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	mod := filepath.Join(src, "build", o.Release.kubeModule())
	if _, err := os.Stat(filepath.Join(mod, "netsuite")); err != nil {
		return "", fmt.Errorf("the upstream e2e suite is built for Kubernetes %s only (build/%s has no netsuite/): %w", Newest().Kube, o.Release.kubeModule(), err)
	}
	dir := o.cacheDir("k8s", o.Release.Kube)
	// agnhost links glibc (its default cgo build): the image carries it.
	if _, err := build(ctx, o.Log, dir, o.Release.kubeModule(), "agnhost "+o.Release.Kube, []string{agnhostPkg}, kubeLDFlags(o.Release), nil); err != nil {
		return "", err
	}
	// -vet=off: vet of the whole Kubernetes test tree costs minutes and
	// checks upstream's code, not ours. The version stamp is what the
	// suite compares with the cluster's.
	return buildInto(ctx, o.Log, dir, "the upstream e2e suite (network tests) "+o.Release.Kube, []string{NetsuiteBin},
		func(_, tmp string, _ []int) error {
			return runGo(ctx, mod, nil, "test", "-c", "-vet=off", "-trimpath", "-ldflags", kubeLDFlags(o.Release),
				"-o", filepath.Join(tmp, NetsuiteBin), "./netsuite")
		})
}

// SuiteImages asks e2e.test which images its network tests run, as
// "<role> <image>" pairs.
func SuiteImages(ctx context.Context, suite string) (map[string][]string, error) {
	out, err := exec.CommandContext(ctx, suite, "-network-images").Output()
	if err != nil {
		return nil, fmt.Errorf("%s -network-images: %w", suite, err)
	}
	images := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			images[f[0]] = append(images[f[0]], f[1])
		}
	}
	if len(images["agnhost"]) == 0 {
		return nil, fmt.Errorf("%s -network-images named no agnhost image:\n%s", suite, out)
	}
	return images, nil
}

// toolBinaries go into the test image with the shared libraries they
// load: what the tests run besides agnhost (curl, nc, dig, nslookup, ip,
// ss, getent) and bash as /bin/sh. busybox supplies every other command;
// its shell is not /bin/sh because Debian's runs its own nc and ip applets
// ahead of PATH.
var toolBinaries = map[string]string{
	"/usr/bin/bash":       "bin/bash",
	"/usr/bin/curl":       "usr/bin/curl",
	"/usr/bin/nc.openbsd": "usr/bin/nc",
	"/usr/bin/dig":        "usr/bin/dig",
	"/usr/bin/nslookup":   "usr/bin/nslookup",
	"/usr/bin/host":       "usr/bin/host",
	"/usr/sbin/ip":        "usr/sbin/ip",
	"/usr/bin/ss":         "usr/bin/ss",
	"/usr/bin/getent":     "usr/bin/getent",
}

// ImportSuiteImages packs one root filesystem (agnhost, the tools, busybox)
// and imports it under every image name the suite asks for, with the
// entrypoint each image has upstream; the pause images get the lab's
// pause. agnhostBin is the agnhost BuildNetsuite built.
func (c *Cluster) ImportSuiteImages(ctx context.Context, images map[string][]string, agnhostBin string) error {
	dir := filepath.Join(c.Opts.Dir, "images")
	root := filepath.Join(dir, "suite-root")
	if err := busyboxRootfs(root); err != nil {
		return err
	}
	bins := map[string]string{agnhostBin: "agnhost"}
	for from, to := range toolBinaries {
		bins[from] = to
	}
	// Real tools win over busybox's applets of the same name.
	for _, to := range bins {
		if err := os.Remove(filepath.Join(root, "bin", filepath.Base(to))); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("test image: %w", err)
		}
	}
	for from, to := range bins {
		if err := copyWithLibs(from, root, to); err != nil {
			return err
		}
	}
	for _, l := range []struct{ name, target string }{{"bin/sh", "bash"}, {"bin/nc", "/usr/bin/nc"}, {"bin/ip", "/usr/sbin/ip"}} {
		p := filepath.Join(root, l.name)
		_ = os.Remove(p)
		if err := os.Symlink(l.target, p); err != nil {
			return fmt.Errorf("test image: %w", err)
		}
	}
	// What upstream's agnhost image has besides the binary: the porter's
	// TLS pair at / (the proxy tests serve HTTPS with it), /uploads, the
	// agnhost-2 alias and the user and group some tests run as.
	kube, err := c.moduleDir(ctx, "k8s.io/kubernetes")
	if err != nil {
		return err
	}
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		if err := copyFile(filepath.Join(kube, "test/images/agnhost/porter", f), filepath.Join(root, f), 0o644); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "uploads"), 0o777); err != nil {
		return fmt.Errorf("test image: %w", err)
	}
	_ = os.Remove(filepath.Join(root, "agnhost-2"))
	if err := os.Symlink("agnhost", filepath.Join(root, "agnhost-2")); err != nil {
		return fmt.Errorf("test image: %w", err)
	}
	files := map[string]string{
		"etc/nsswitch.conf": "hosts: files dns\npasswd: files\ngroup: files\n",
		"etc/passwd":        "root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
		"etc/group":         "root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("test image: %w", err)
		}
	}
	pauseRoot := filepath.Join(dir, "pause-root")
	for role, names := range images {
		for i, name := range names {
			src, entry, cmd := root, []string(nil), []string{"/bin/sh"}
			switch role {
			case "agnhost":
				// As upstream's: with no arguments it pauses.
				entry, cmd = []string{"/agnhost"}, []string{"pause"}
			case "nginx":
				// Serves HTTP on port 80 as upstream's nginx image does.
				cmd = []string{"/agnhost", "netexec", "--http-port=80"}
			case "pause":
				src, entry, cmd = pauseRoot, []string{"/pause"}, nil
			}
			tar := filepath.Join(dir, fmt.Sprintf("suite-%s-%d.tar", role, i))
			if err := imagetar.WriteImage(src, name, tar, entry, cmd); err != nil {
				return err
			}
			if err := c.ImportImage(ctx, tar); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyWithLibs copies the binary from to root/to and every shared library
// ldd says it loads to the same path under root.
func copyWithLibs(from, root, to string) error {
	dst := filepath.Join(root, to)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("test image: %w", err)
	}
	if err := copyFile(from, dst, 0o755); err != nil {
		return err
	}
	out, err := exec.Command("ldd", from).Output()
	if err != nil {
		// A static binary: "not a dynamic executable", exit 1.
		return nil
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		var lib string
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			lib = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			lib = f[0] // the dynamic loader
		default:
			continue
		}
		d := filepath.Join(root, lib)
		if _, err := os.Stat(d); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			return fmt.Errorf("test image: %w", err)
		}
		if err := copyFile(lib, d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// moduleDir is where the Go module cache holds module at the version the
// release's build module pins.
func (c *Cluster) moduleDir(ctx context.Context, module string) (string, error) {
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, goTool(), "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = filepath.Join(src, "build", c.Opts.Release.kubeModule())
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("find %s in the module cache: %v", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}
