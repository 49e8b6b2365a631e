package k8slab

import (
	"fmt"
	"os"
	"path/filepath"
)

// writeContainerdConfig writes containerd's config: CRI with runc and the
// lab's CNI dirs, every path containerd can be told about kept under Dir,
// NRI off (it would listen on /var/run/nri on the host). containerd 2
// splits the CRI config into an images and a runtime table (schema 4);
// 1.7 has the one table of schema 2.
func (c *Cluster) writeContainerdConfig() (string, error) {
	d := filepath.Join(c.Opts.Dir, "containerd")
	path := filepath.Join(d, "config.toml")
	tmpl := containerd17Config
	if c.Opts.Release.containerd2() {
		tmpl = containerd2Config
	}
	body := fmt.Sprintf(tmpl, filepath.Join(d, "root"), filepath.Join(d, "state"), c.ContainerdSocket,
		filepath.Join(d, "opt"), PauseImage, filepath.Join(d, "runc"),
		c.Opts.CNIBinDir, c.Opts.CNIConfDir, filepath.Join(c.ContainerdDir, "containerd-shim-runc-v2"))
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("write containerd config: %w", err)
	}
	return path, nil
}

// Both configs: the VM's capability bounding set lacks CAP_SYS_RESOURCE,
// so runc cannot give sandboxes a negative oom_score_adj and every sandbox
// fails with "can't get final child's PID from pipe: EOF": clamp to
// containerd's own (restrict_oom_score_adj). flock is IPv6-first: the IPv6
// address is the pod's primary IP (ip_pref).

const containerd2Config = `version = 4
root = %[1]q
state = %[2]q
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = %[3]q
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '%[3]s.ttrpc'
  [plugins.'io.containerd.internal.v1.opt']
    path = %[4]q
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %[5]q
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        # The shim built with this containerd, not one found on PATH.
        runtime_path = %[9]q
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '/usr/sbin/runc'
          Root = %[6]q
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[7]q]
      conf_dir = %[8]q
      max_conf_num = 1
      ip_pref = 'ipv6'
`

const containerd17Config = `version = 2
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # The shim built with this containerd, not one found on PATH.
      runtime_path = %[9]q
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = %[6]q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
    max_conf_num = 1
    ip_pref = "ipv6"
`
