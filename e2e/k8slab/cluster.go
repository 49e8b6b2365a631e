package k8slab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Cluster is a running lab. Its methods are safe for concurrent use.
type Cluster struct {
	Opts             Options
	Kubeconfig       string // admin kubeconfig
	ContainerdSocket string
	BinDir           string // kube-apiserver, kubelet, kubectl, ...
	ContainerdDir    string // containerd, its runc shim, ctr
	PluginsDir       string // the reference CNI plugins the node gets
	CoreDNSDir       string // coredns, with Services

	mu           sync.Mutex
	procs        map[string]*proc
	http         *http.Client
	kubeletFlags []string
	images       []string // docker-archive tarballs imported at start
	st           labState // what Down restores; also in Dir/run/state.json
	downOnce     sync.Once
	downErr      error
}

func (c *Cluster) pkiDir() string     { return filepath.Join(c.Opts.Dir, "pki") }
func (c *Cluster) kubeletDir() string { return filepath.Join(c.Opts.Dir, "kubelet") }

func (c *Cluster) proc(name string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[name]
}

// Up builds what is missing and starts a single-node cluster. It returns
// once the apiserver is ready and kubelet has registered the node; the node
// becomes Ready only when a CNI config appears in CNIConfDir (see
// WaitNodeReady). On failure everything already started is torn down again
// and the error carries the tail of the failing component's log.
func Up(ctx context.Context, o Options) (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("k8slab: must run as root")
	}
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	c := &Cluster{
		Opts:             o,
		ContainerdSocket: filepath.Join(o.Dir, "containerd", "containerd.sock"),
		procs:            map[string]*proc{},
	}
	c.st = labState{Dir: o.Dir, Socket: c.ContainerdSocket, Procs: map[string]procID{}}
	start := time.Now()
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	if err := c.boot(ctx); err != nil {
		err = fmt.Errorf("k8slab up: %w", err)
		if derr := c.Down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("tear down after failed start: %w", derr))
		}
		return nil, err
	}
	o.Log("k8slab: up in %s (dir %s)", time.Since(start).Round(100*time.Millisecond), o.Dir)
	return c, nil
}

// prepare does everything that changes nothing on the host but files under
// Dir and CacheDir: checks, packages, binaries, PKI, images.
func (c *Cluster) prepare(ctx context.Context) error {
	o := c.Opts
	if err := recoverStale(o.Log); err != nil {
		return err
	}
	if err := checkPortsFree(); err != nil {
		return err
	}
	if err := checkNodeName(o.NodeName); err != nil {
		return err
	}
	// One address, or two of different families (a dual-stack node; the
	// first one's family comes first in every pod's status.podIPs).
	for _, f := range strings.Split(o.NodeIP, ",") {
		if ip := net.ParseIP(f); ip == nil || ip.IsLoopback() {
			return fmt.Errorf("k8slab: NodeIP %q must be non-loopback IP addresses", o.NodeIP)
		}
	}
	o.Log("k8slab: checking Debian packages")
	if err := EnsurePackages(); err != nil {
		return err
	}
	o.Log("k8slab: %s", o.Release)
	var err error
	if c.BinDir, err = buildKubernetes(ctx, o); err != nil {
		return err
	}
	pause, err := buildPause(ctx, c.BinDir)
	if err != nil {
		return err
	}
	if !o.APIOnly {
		if c.ContainerdDir, err = buildContainerd(ctx, o); err != nil {
			return err
		}
		if o.Services {
			if c.CoreDNSDir, err = buildCoreDNS(ctx, o); err != nil {
				return err
			}
		}
		if c.PluginsDir = o.CNIPlugins; c.PluginsDir == "" {
			if c.PluginsDir, err = buildCNIPlugins(ctx, o); err != nil {
				return err
			}
		}
	}
	for _, d := range []string{"logs", "run", "containerd"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o755); err != nil {
			return fmt.Errorf("create lab dir: %w", err)
		}
	}
	if err := writePKI(c.pkiDir(), o.NodeName, c.apiIPs()); err != nil {
		return err
	}
	if c.Kubeconfig, err = c.writeKubeconfig("admin"); err != nil {
		return err
	}
	if c.images, err = c.writeImages(pause); err != nil {
		return err
	}
	if o.APIOnly {
		return nil
	}
	return linkCNIPlugins(c.PluginsDir, o.CNIBinDir, o.CNIConfDir)
}

// boot starts the components in dependency order.
func (c *Cluster) boot(ctx context.Context) error {
	o := c.Opts
	sysctls, err := saveSysctls()
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.st.Sysctls = sysctls
	c.st.DirsBefore = existingPaths(hardcodedDirs)
	c.st.NetnsBefore = cniNetns()
	c.mu.Unlock()
	if err := c.saveState(); err != nil {
		return err
	}
	if !o.APIOnly {
		if err := c.setupLabLink(); err != nil {
			return err
		}
	}
	if err := c.startEtcd(ctx); err != nil {
		return c.withLog(Etcd, err)
	}
	if err := c.startAPIServer(ctx); err != nil {
		return c.withLog(APIServer, err)
	}
	if o.APIOnly {
		return nil
	}
	if o.Services {
		c.mu.Lock()
		c.st.Services = true
		c.mu.Unlock()
		if err := c.saveState(); err != nil {
			return err
		}
		if err := c.startCoreDNS(ctx); err != nil {
			return c.withLog(CoreDNS, err)
		}
	} else if err := installServiceDNAT(); err != nil {
		return err
	}
	if err := c.startControllers(); err != nil {
		return err
	}
	if err := c.startContainerd(ctx); err != nil {
		return c.withLog(Containerd, err)
	}
	for _, img := range c.images {
		if err := c.ImportImage(ctx, img); err != nil {
			return c.withLog(Containerd, err)
		}
	}
	flags, err := c.kubeletArgs()
	if err != nil {
		return err
	}
	c.kubeletFlags = flags
	if err := c.StartKubelet(); err != nil {
		return err
	}
	if err := c.waitNodeRegistered(ctx); err != nil {
		return c.withLog(Kubelet, err)
	}
	if err := c.ensureDefaultServiceAccount(ctx); err != nil {
		return c.withLog(ControllerManager, err)
	}
	if o.Services {
		// After the node exists: kube-proxy takes the node's addresses
		// (NodePorts, its health) from its Node object.
		if err := c.startKubeProxy(ctx); err != nil {
			return c.withLog(KubeProxy, err)
		}
	}
	o.Log("k8slab: node %s registered", o.NodeName)
	return nil
}

func (c *Cluster) withLog(component string, err error) error {
	return fmt.Errorf("%w\n--- %s log (tail) ---\n%s", err, component, c.LogTail(component, 30))
}

// checkPortsFree fails early, naming the port, when an earlier lab or
// another program still listens where the lab's components will.
func checkPortsFree() error {
	for _, port := range []int{APIServerPort, etcdClientPort, etcdPeerPort, 2381, kubeletPort, 10248, 10257, 10259} {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			return fmt.Errorf("k8slab: port %d is in use (a lab left running?): %w", port, err)
		}
		l.Close()
	}
	return nil
}

// checkNodeName insists that the node name resolves to loopback: kubelet
// listens on 127.0.0.1 and the apiserver reaches it (exec, logs) by name.
func checkNodeName(name string) error {
	addrs, err := net.LookupHost(name)
	if err != nil {
		return fmt.Errorf("k8slab: node name %q must resolve to 127.0.0.1 (add it to /etc/hosts): %w", name, err)
	}
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil && ip.IsLoopback() {
			return nil
		}
	}
	return fmt.Errorf("k8slab: node name %q resolves to %v, not loopback (add \"127.0.0.1 %s\" to /etc/hosts)", name, addrs, name)
}

// linkCNIPlugins makes the reference plugins of from (the release's, or
// another set such as Debian's /usr/lib/cni) available in binDir next to
// whatever the caller installs there, and creates confDir. A symlink
// already there (an earlier lab's, maybe to other versions) is replaced;
// a file is the caller's own and wins.
func linkCNIPlugins(from, binDir, confDir string) error {
	for _, d := range []string{binDir, confDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create CNI dir: %w", err)
		}
	}
	plugins, err := filepath.Glob(filepath.Join(from, "*"))
	if err != nil || len(plugins) == 0 {
		return fmt.Errorf("no CNI plugins in %s: %v", from, err)
	}
	for _, p := range plugins {
		if !isExecutable(p) {
			continue // the cache's lock file
		}
		link := filepath.Join(binDir, filepath.Base(p))
		if fi, err := os.Lstat(link); err == nil {
			if fi.Mode()&os.ModeSymlink == 0 {
				continue
			}
			if err := os.Remove(link); err != nil {
				return fmt.Errorf("replace CNI plugin link %s: %w", link, err)
			}
		}
		if err := os.Symlink(p, link); err != nil {
			return fmt.Errorf("link CNI plugin %s: %w", p, err)
		}
	}
	return nil
}
