package k8slab

import (
	"fmt"
	"os"
	"path/filepath"
)

// writeContainerdConfig writes containerd's config: CRI with runc and the
// lab's CNI dirs, every path containerd can be told about kept under Dir.
func (c *Cluster) writeContainerdConfig() (string, error) {
	d := filepath.Join(c.Opts.Dir, "containerd")
	path := filepath.Join(d, "config.toml")
	body := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  # The VM's capability bounding set lacks CAP_SYS_RESOURCE, so runc cannot
  # give sandboxes a negative oom_score_adj and every sandbox fails with
  # "can't get final child's PID from pipe: EOF". Clamp to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = %[6]q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
    max_conf_num = 1
    # flock is IPv6-first: make the IPv6 address the pod's primary IP
    # (containerd 1.6 picks IPv4 by default and does not know "cni").
    ip_pref = "ipv6"
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.ContainerdSocket,
		filepath.Join(d, "opt"), PauseImage, filepath.Join(d, "runc"),
		c.Opts.CNIBinDir, c.Opts.CNIConfDir)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("write containerd config: %w", err)
	}
	return path, nil
}
