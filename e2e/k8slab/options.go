package k8slab

import (
	"fmt"
	"os"
	"path/filepath"
)

// Fixed ports of the lab (the Service ranges are in services.go).
const (
	APIServerPort  = 6443
	etcdClientPort = 2379
	etcdPeerPort   = 2380
	kubeletPort    = 10250
)

// Images the lab imports into containerd before kubelet starts.
const (
	PauseImage   = "registry.k8s.io/pause:3.10"
	BusyboxImage = "docker.io/local/busybox:1.35"
)

// Options configure a lab cluster. Zero values take the documented defaults.
type Options struct {
	Dir string // working dir for this cluster (pki, configs, logs, data); created; default a new dir under os.TempDir
	// Release is what the lab runs; zero: SelectedRelease (FLOCK_K8S).
	Release Release
	// CacheRoot holds the built binaries between runs, a directory per
	// part and version (k8s-v1.37.2, containerd-v2.4.2, cni-plugins-v1.9.1);
	// default /var/cache/flock-e2e.
	CacheRoot string
	// CNIPlugins is where the reference plugins the node gets come from:
	// "" builds the release's (current ones); a directory (Debian's
	// /usr/lib/cni, containernetworking-plugins 1.1.1) takes its own.
	CNIPlugins string
	NodeName   string // default "vm"; must resolve to a loopback address (apiserver reaches kubelet by hostname)
	NodeIP     string // kubelet --node-ip, default "192.0.2.2" (not loopback; nothing routes to it); "v6,v4" for an IPv6-primary dual-stack node
	CNIBinDir  string // containerd's CNI bin_dir (default Dir/cni/bin); the reference plugins (CNIPlugins) are symlinked into it
	CNIConfDir string // containerd's CNI conf_dir (default Dir/cni/net.d)
	Log        func(format string, args ...any)
	// Services gives the cluster the Service plumbing a real one has:
	// kube-proxy (nftables), CoreDNS behind the kube-dns Service and
	// kubelet's clusterDNS, dual-stack Service ranges in the node's family
	// order, and the apiserver on the node's primary address with the lease
	// endpoint reconciler (the kubernetes Service's endpoints). The node's
	// addresses are then put on LabLink. Upstream's e2e suite needs it.
	Services bool
	// PodCIDRs are the ranges pods get addresses from, primary family
	// first (kube-proxy's --cluster-cidr); used with Services.
	PodCIDRs []string
	// APIOnly starts etcd and kube-apiserver only: an API for agents run
	// by the test (benchmarks), no node, no runtime.
	APIOnly bool
	// KubeProxy builds kube-proxy too (with Services it always is): an
	// API-only lab whose test runs it.
	KubeProxy bool
	// ServiceCIDRs, if set, are the apiserver's Service ranges, primary
	// family first (an API-only lab's default: ServiceCIDR4 alone).
	ServiceCIDRs []string
	// EtcdQuotaBytes, if set, is etcd's backend quota (its default is
	// 2 GiB): an API filled to Kubernetes' scalability envelope needs more.
	EtcdQuotaBytes int64
}

// DefaultCacheRoot is where built binaries are kept between runs.
const DefaultCacheRoot = "/var/cache/flock-e2e"

// cacheDir is the cache of one part at one version.
func (o *Options) cacheDir(part, version string) string {
	return filepath.Join(o.CacheRoot, part+"-"+version)
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
	if o.Release == (Release{}) {
		r, err := SelectedRelease()
		if err != nil {
			return err
		}
		o.Release = r
	}
	if o.CacheRoot == "" {
		o.CacheRoot = DefaultCacheRoot
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
