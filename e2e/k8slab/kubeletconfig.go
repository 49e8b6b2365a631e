package k8slab

import (
	"fmt"
	"os"
	"path/filepath"
)

// writeKubeletConfig writes the KubeletConfiguration: cgroupfs on this
// cgroup v1 host, swap tolerated, API bound to loopback, image GC and
// disk-pressure eviction effectively off (the images cannot be pulled back).
func (c *Cluster) writeKubeletConfig() (string, error) {
	d := c.kubeletDir()
	path := filepath.Join(d, "config.yaml")
	body := kubeletConfig(kubeletConfigParams{address: "127.0.0.1", socket: c.ContainerdSocket,
		clientCA: filepath.Join(c.pkiDir(), "ca.crt"), dir: d})
	if c.Opts.Services {
		body += fmt.Sprintf("clusterDNS: [%q]\nclusterDomain: %s\n", c.DNSServiceIP(), ClusterDomain)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("write kubelet config: %w", err)
	}
	return path, nil
}

// kubeletConfigParams is what differs between the lab's nodes.
type kubeletConfigParams struct {
	address    string // where kubelet's API listens
	cgroupRoot string // "" for the runtime's default
	socket     string // containerd's
	clientCA   string
	dir        string // the node's kubelet dir (manifests, pod logs, volume plugins)
}

func kubeletConfig(p kubeletConfigParams) string {
	cgroupRoot := ""
	if p.cgroupRoot != "" {
		cgroupRoot = "cgroupRoot: " + p.cgroupRoot + "\n"
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
%sfailSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://%s
address: %q
port: %d
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
staticPodPath: %s
podLogsDir: %s
volumePluginDir: %s
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
`, cgroupRoot, p.socket, p.address, kubeletPort, p.clientCA,
		filepath.Join(p.dir, "manifests"), filepath.Join(p.dir, "pod-logs"), filepath.Join(p.dir, "volume-plugins"))
}
