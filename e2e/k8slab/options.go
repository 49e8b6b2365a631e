package k8slab

import (
	"fmt"
	"os"
	"path/filepath"
)

// KubeVersion is the Kubernetes release the lab builds and runs.
const KubeVersion = "v1.34.4"

// Fixed addresses of the lab. The service CIDR is what kube-apiserver
// allocates ClusterIPs from; KubernetesServiceIP is its first address, the
// kubernetes Service.
const (
	ServiceCIDR         = "10.96.0.0/16"
	KubernetesServiceIP = "10.96.0.1"
	APIServerPort       = 6443
	etcdClientPort      = 2379
	etcdPeerPort        = 2380
	kubeletPort         = 10250
)

// Images the lab imports into containerd before kubelet starts.
const (
	PauseImage   = "registry.k8s.io/pause:3.10"
	BusyboxImage = "docker.io/local/busybox:1.35"
)

// Options configure a lab cluster. Zero values take the documented defaults.
type Options struct {
	Dir        string // working dir for this cluster (pki, configs, logs, data); created; default a new dir under os.TempDir
	CacheDir   string // persistent cache for built binaries, default /var/cache/flock-e2e/k8s-<version>; reused across runs when the binaries exist
	NodeName   string // default "vm"; must resolve to a loopback address (apiserver reaches kubelet by hostname)
	NodeIP     string // kubelet --node-ip, default "192.0.2.2" (not loopback; nothing routes to it); "v6,v4" for an IPv6-primary dual-stack node
	CNIBinDir  string // containerd's CNI bin_dir (default Dir/cni/bin); Debian's /usr/lib/cni/* are symlinked into it
	CNIConfDir string // containerd's CNI conf_dir (default Dir/cni/net.d)
	Log        func(format string, args ...any)
	// APIOnly starts etcd and kube-apiserver only: an API for agents run
	// by the test (benchmarks), no node, no runtime.
	APIOnly bool
}

// DefaultCacheDir is where built binaries are kept between runs.
func DefaultCacheDir() string {
	return filepath.Join("/var/cache/flock-e2e", "k8s-"+KubeVersion)
}

func (o *Options) setDefaults() error {
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "flock-k8slab-")
		if err != nil {
			return fmt.Errorf("create lab dir: %w", err)
		}
		o.Dir = d
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return fmt.Errorf("lab dir %q: %w", o.Dir, err)
	}
	if dir == "/" {
		return fmt.Errorf("lab dir must not be /")
	}
	o.Dir = dir
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir()
	}
	if o.NodeName == "" {
		o.NodeName = "vm"
	}
	if o.NodeIP == "" {
		o.NodeIP = "192.0.2.2"
	}
	if o.CNIBinDir == "" {
		o.CNIBinDir = filepath.Join(o.Dir, "cni", "bin")
	}
	if o.CNIConfDir == "" {
		o.CNIConfDir = filepath.Join(o.Dir, "cni", "net.d")
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	return nil
}
