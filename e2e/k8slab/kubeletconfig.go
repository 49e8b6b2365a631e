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
	body := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://%s
address: 127.0.0.1
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
`, c.ContainerdSocket, kubeletPort, filepath.Join(c.pkiDir(), "ca.crt"),
		filepath.Join(d, "manifests"), filepath.Join(d, "pod-logs"), filepath.Join(d, "volume-plugins"))
	if c.Opts.Services {
		body += fmt.Sprintf("clusterDNS: [%q]\nclusterDomain: %s\n", c.DNSServiceIP(), ClusterDomain)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("write kubelet config: %w", err)
	}
	return path, nil
}
