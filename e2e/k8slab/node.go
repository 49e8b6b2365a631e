package k8slab

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

// NodeOptions describe a second node of a running lab: its own network
// namespace (the test made it and wired it to its ToR), its own mount
// namespace (private /run/flock, /var/lib/flock, CNI dirs and /run/netns,
// so that flock's DaemonSet pod there is a node of its own), its own
// containerd and kubelet (under a cgroup root of its own).
type NodeOptions struct {
	Name string // node name, a DNS label; resolved by the apiserver through /etc/hosts to the first NodeIP
	// Netns is the path of the node's network namespace.
	Netns string
	// NodeIP is kubelet's --node-ip there ("v6,v4" for dual-stack); the
	// apiserver (in the host's namespace) must have a route to it.
	NodeIP string
}

// Node is a running second node. Stop it with Down.
type Node struct {
	c      *Cluster
	Opts   NodeOptions
	Dir    string
	Socket string // its containerd's socket

	mu       sync.Mutex
	procs    map[string]*proc
	holder   *exec.Cmd     // keeps the node's mount namespace
	held     chan struct{} // closed when the holder exits
	proxy    net.Listener
	hostLine string
	pinned   []string // pinnedDirs this node bound onto themselves
	downOnce sync.Once
	downErr  error
}

// The host paths a node keeps private (bind-mounted from its dir in its
// mount namespace): what flock's DaemonSet and the runtime write there.
var nodePrivateDirs = []string{"/run/flock", "/var/lib/flock", "/opt/cni/bin", "/etc/cni/net.d", "/run/netns"}

// pinnedDirs are the private dirs an uninstall of flock removes. The
// node's binds stand on the host's directories of those paths, and the
// kernel detaches a bind whose mount point is removed in another
// namespace: the first node's uninstall would take the second node's
// directories with it. While a second node stands, the host's are bound
// onto themselves, so no container can remove them (it empties them).
var pinnedDirs = []string{"/run/flock", "/var/lib/flock"}

// isMountPoint tells whether d is a mount point of this namespace.
func isMountPoint(d string) bool {
	mps, err := mountPoints([]string{d})
	return err == nil && slices.Contains(mps, d)
}

// cgroupRoot is the node's kubelet --cgroup-root: its pods' cgroups live
// below it in every hierarchy, apart from the first node's.
func (n *Node) cgroupRoot() string { return "/k8slab-" + n.Opts.Name }

func (n *Node) validate() error {
	o := n.Opts
	if o.Name == "" || o.Name == n.c.Opts.NodeName || strings.ContainsAny(o.Name, "/ \t.") {
		return fmt.Errorf("k8slab: node name %q: want a DNS label other than %q", o.Name, n.c.Opts.NodeName)
	}
	if _, err := os.Stat(o.Netns); err != nil {
		return fmt.Errorf("k8slab: node %s: Netns %q: %w", o.Name, o.Netns, err)
	}
	for _, f := range strings.Split(o.NodeIP, ",") {
		if ip := net.ParseIP(f); ip == nil || ip.IsLoopback() {
			return fmt.Errorf("k8slab: node %s: NodeIP %q must be non-loopback IP addresses", o.Name, o.NodeIP)
		}
	}
	if n.c.Opts.APIOnly {
		return fmt.Errorf("k8slab: node %s: a second node needs a lab with a node", o.Name)
	}
	return nil
}

// AddNode starts a second node and waits until it has registered. On
// failure everything it started is stopped and removed again.
func (c *Cluster) AddNode(ctx context.Context, o NodeOptions) (*Node, error) {
	n := &Node{c: c, Opts: o, Dir: filepath.Join(c.Opts.Dir, "node-"+o.Name), procs: map[string]*proc{}}
	if err := n.validate(); err != nil {
		return nil, err
	}
	n.Socket = filepath.Join(n.Dir, "containerd", "containerd.sock")
	if err := n.start(ctx); err != nil {
		err = fmt.Errorf("k8slab: add node %s: %w", o.Name, err)
		if derr := n.Down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("tear down: %w", derr))
		}
		return nil, err
	}
	c.Opts.Log("k8slab: node %s registered", o.Name)
	return n, nil
}

func (n *Node) start(ctx context.Context) error {
	c, o := n.c, n.Opts
	for _, d := range []string{"logs", "containerd", "kubelet/root", "kubelet/pki", "kubelet/manifests", "kubelet/pod-logs", "kubelet/volume-plugins"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := n.writeKubeletCert(); err != nil {
		return err
	}
	if err := n.writeAdminKubeconfig(); err != nil {
		return err
	}
	if err := n.privateMounts(); err != nil {
		return err
	}
	if err := linkCNIPlugins(c.PluginsDir, filepath.Join(n.Dir, "private", "opt/cni/bin"), filepath.Join(n.Dir, "private", "etc/cni/net.d")); err != nil {
		return err
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	// The node's kubelet reaches the apiserver on its own loopback through
	// a proxy. Without Services, the kubernetes Service address (its pods,
	// hostNetwork ones included) is a DNAT to that; with Services the
	// node runs its own kube-proxy, which sends it to the apiserver on the
	// first node's primary address (the test routes that address there).
	if err := n.startProxy(); err != nil {
		return err
	}
	if !c.Opts.Services {
		if err := n.inNetns("iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-d", KubernetesServiceIP+"/32", "-p", "tcp", "--dport", "443",
			"-j", "DNAT", "--to-destination", "127.0.0.1:"+strconv.Itoa(APIServerPort)); err != nil {
			return err
		}
	}
	if err := n.addHostsEntry(); err != nil {
		return err
	}
	cfg, err := n.writeContainerdConfig()
	if err != nil {
		return err
	}
	if err := n.startProc(Containerd, filepath.Join(c.ContainerdDir, "containerd"), "--config", cfg); err != nil {
		return err
	}
	if err := poll(ctx, "node "+o.Name+"'s containerd socket", 200*time.Millisecond, func(context.Context) (bool, error) {
		_, err := os.Stat(n.Socket)
		return err == nil, err
	}); err != nil {
		return n.withLog(Containerd, err)
	}
	for _, img := range c.images {
		if err := importImage(ctx, c.ContainerdDir, n.Socket, img); err != nil {
			return n.withLog(Containerd, err)
		}
	}
	args, err := n.kubeletArgs()
	if err != nil {
		return err
	}
	if c.Opts.Services {
		if err := n.startProc(KubeProxy, filepath.Join(c.BinDir, KubeProxy), c.kubeProxyArgs(n.kubeconfig(), o.Name)...); err != nil {
			return err
		}
	}
	if err := n.startProc(Kubelet, filepath.Join(c.BinDir, Kubelet), args...); err != nil {
		return err
	}
	return poll(ctx, "node "+o.Name+" to register", 500*time.Millisecond, func(ctx context.Context) (bool, error) {
		if p := n.proc(Kubelet); p != nil && !p.running() {
			return false, fatalError{n.withLog(Kubelet, p.exitErr())}
		}
		_, err := c.getNodeNamed(ctx, o.Name)
		return err == nil, err
	})
}

// ImportImage imports a docker-archive into the node's containerd.
func (n *Node) ImportImage(ctx context.Context, tarPath string) error {
	return importImage(ctx, n.c.ContainerdDir, n.Socket, tarPath)
}

// WaitReady waits until the node's Ready condition is True.
func (n *Node) WaitReady(ctx context.Context) error {
	return n.c.waitReadyNamed(ctx, n.Opts.Name)
}

func (n *Node) proc(name string) *proc {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.procs[name]
}

func (n *Node) logPath(name string) string { return filepath.Join(n.Dir, "logs", name+".log") }

// LogTail is the last lines of one of the node's components' logs.
func (n *Node) LogTail(name string, lines int) string {
	b, _ := os.ReadFile(n.logPath(name))
	return tail(string(b), lines)
}

func (n *Node) withLog(component string, err error) error {
	return fmt.Errorf("%w\n--- node %s %s log (tail) ---\n%s", err, n.Opts.Name, component, n.LogTail(component, 30))
}

// startProc starts a component in the node's network and mount namespaces.
func (n *Node) startProc(name, bin string, args ...string) error {
	// Its PID names the mount namespace: a dead holder's could be reused.
	select {
	case <-n.held:
		return fmt.Errorf("node %s: its mount namespace's holder exited; not starting %s", n.Opts.Name, name)
	default:
	}
	logf, err := os.OpenFile(n.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + n.Opts.Netns, "--mount=/proc/" + strconv.Itoa(n.holder.Process.Pid) + "/ns/mnt", "--", bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = n.Dir
	if err := startDetached(cmd); err != nil {
		return fmt.Errorf("start node %s %s: %w", n.Opts.Name, name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	n.mu.Lock()
	n.procs[name] = p
	n.mu.Unlock()
	n.c.Opts.Log("k8slab: node %s: %s started, pid %d", n.Opts.Name, name, cmd.Process.Pid)
	return nil
}

// inNetns runs a command in the node's network namespace.
func (n *Node) inNetns(bin string, args ...string) error {
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.Opts.Netns, "--", bin}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("node %s: %s %s: %w: %s", n.Opts.Name, bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// privateMounts starts the process that holds the node's mount namespace
// (a slave of the host's: the host's mounts show, the node's do not leak
// out) and bind-mounts the node's private dirs there; /run/netns is made
// shared inside it, as the agent's HostToContainer mount needs.
func (n *Node) privateMounts() error {
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, d := range nodePrivateDirs {
		src := filepath.Join(n.Dir, "private", d)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		fmt.Fprintf(&script, "mount --bind %q %q\n", src, d)
	}
	for _, d := range pinnedDirs {
		if isMountPoint(d) {
			continue
		}
		if out, err := exec.Command("mount", "--bind", d, d).CombinedOutput(); err != nil {
			return fmt.Errorf("pin %s: %v: %s", d, err, out)
		}
		n.pinned = append(n.pinned, d)
	}
	script.WriteString("mount --make-shared /run/netns\nexec sleep infinity\n")
	cmd := exec.Command("unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script.String())
	logf, err := os.OpenFile(n.logPath("mounts"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := startDetached(cmd); err != nil {
		return fmt.Errorf("node %s mount namespace: %w", n.Opts.Name, err)
	}
	n.holder, n.held = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(n.held)
	}()
	// Ready once the script exec'd sleep (its mounts are done).
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm"); err == nil && strings.TrimSpace(string(b)) == "sleep" {
			return nil
		}
		select {
		case <-n.held:
			return n.withLog("mounts", errors.New("the mount namespace's holder exited"))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return n.withLog("mounts", errors.New("the mount namespace was not set up"))
}

// makeCgroupRoot creates the node's cgroup root in every v1 hierarchy
// (cpuset's gets its parent's CPUs and memory nodes, as a new cpuset
// starts with none).
func (n *Node) makeCgroupRoot() error {
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		if fi, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil || fi.IsDir() {
			continue
		}
		d := filepath.Join(h, n.cgroupRoot())
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("node %s cgroup root: %w", n.Opts.Name, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("node %s %s: %w", n.Opts.Name, f, err)
				}
			}
		}
	}
	return nil
}

// removeCgroups kills what still runs in the node's cgroups and removes
// them, deepest first.
func (n *Node) removeCgroups() error {
	var errs []error
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		root := filepath.Join(h, n.cgroupRoot())
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if b, err := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for range 50 {
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// startProxy listens on the node's loopback (the apiserver's port) and
// forwards to the apiserver on the host's.
func (n *Node) startProxy() error {
	l, err := listenInNetns(n.Opts.Netns, "127.0.0.1:"+strconv.Itoa(APIServerPort))
	if err != nil {
		return fmt.Errorf("node %s apiserver proxy: %w", n.Opts.Name, err)
	}
	n.proxy = l
	target := net.JoinHostPort(n.c.apiServerHost(), strconv.Itoa(APIServerPort))
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				up, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
				go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return nil
}

// listenInNetns opens a TCP listener inside the network namespace at path
// (a socket keeps the namespace it was made in).
func listenInNetns(path, addr string) (net.Listener, error) {
	type res struct {
		l   net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// The thread is left locked (and so ends with the goroutine):
		// it is in another namespace.
		runtime.LockOSThread()
		target, err := netns.GetFromPath(path)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			ch <- res{err: err}
			return
		}
		l, err := net.Listen("tcp", addr)
		ch <- res{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

// addHostsEntry makes the node's name resolve to its first address for the
// apiserver (which reaches kubelets by hostname); Down removes the line.
func (n *Node) addHostsEntry() error {
	ip := strings.Split(n.Opts.NodeIP, ",")[0]
	n.hostLine = ip + " " + n.Opts.Name + n.hostMarker()
	b, err := os.ReadFile("/etc/hosts")
	if err != nil {
		return err
	}
	body := removeLine(string(b), n.hostMarker())
	if !strings.HasSuffix(body, "\n") && body != "" {
		body += "\n"
	}
	return os.WriteFile("/etc/hosts", []byte(body+n.hostLine+"\n"), 0o644)
}

// hostMarker ends the node's /etc/hosts line: an old lab's line for the
// same name (another address, maybe) goes too.
func (n *Node) hostMarker() string { return " # k8slab node " + n.Opts.Name }

// removeLine drops the lines ending in marker.
func removeLine(body, marker string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasSuffix(l, marker) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// writeKubeletCert issues the node's kubelet client certificate
// (system:node:<name>, as the Node authorizer wants) from the lab CA.
func (n *Node) writeKubeletCert() error {
	pki := n.c.pkiDir()
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(filepath.Join(pki, "ca.key"))
	if err != nil {
		return err
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return errors.New("k8slab: lab CA unreadable")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return err
	}
	return issue(filepath.Join(n.Dir, "kubelet"), certSpec{file: "kubelet", cn: "system:node:" + n.Opts.Name, orgs: []string{"system:nodes"}}, ca, key)
}

func (n *Node) writeContainerdConfig() (string, error) {
	d := filepath.Join(n.Dir, "containerd")
	path := filepath.Join(d, "config.toml")
	tmpl := containerd17Config
	if n.c.Opts.Release.containerd2() {
		tmpl = containerd2Config
	}
	// The CNI dirs are the node's private ones, at the usual paths.
	body := fmt.Sprintf(tmpl, filepath.Join(d, "root"), filepath.Join(d, "state"), n.Socket,
		filepath.Join(d, "opt"), PauseImage, filepath.Join(d, "runc"),
		"/opt/cni/bin", "/etc/cni/net.d", filepath.Join(n.c.ContainerdDir, "containerd-shim-runc-v2"))
	return path, os.WriteFile(path, []byte(body), 0o644)
}

func (n *Node) kubeletArgs() ([]string, error) {
	c := n.c
	d := filepath.Join(n.Dir, "kubelet")
	cfg := filepath.Join(d, "config.yaml")
	body := kubeletConfig(kubeletConfigParams{address: "::", cgroupRoot: n.cgroupRoot(), socket: n.Socket,
		clientCA: filepath.Join(c.pkiDir(), "ca.crt"), dir: d})
	if c.Opts.Services {
		body += fmt.Sprintf("clusterDNS: [%q]\nclusterDomain: %s\n", c.DNSServiceIP(), ClusterDomain)
	}
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		return nil, err
	}
	kc := filepath.Join(d, "kubelet.kubeconfig")
	kcBody := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8slab
  cluster: {server: %s, certificate-authority: %s}
users:
- name: kubelet
  user: {client-certificate: %s, client-key: %s}
contexts:
- name: kubelet@k8slab
  context: {cluster: k8slab, user: kubelet}
current-context: kubelet@k8slab
`, n.localAPIServerURL(), filepath.Join(c.pkiDir(), "ca.crt"), filepath.Join(d, "kubelet.crt"), filepath.Join(d, "kubelet.key"))
	if err := os.WriteFile(kc, []byte(kcBody), 0o600); err != nil {
		return nil, err
	}
	return []string{"--config=" + cfg, "--kubeconfig=" + kc,
		"--root-dir=" + filepath.Join(d, "root"), "--cert-dir=" + filepath.Join(d, "pki"),
		"--hostname-override=" + n.Opts.Name, "--node-ip=" + n.Opts.NodeIP, "--v=2"}, nil
}

// localAPIServerURL is the apiserver through the node's loopback proxy.
func (n *Node) localAPIServerURL() string {
	return "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(APIServerPort))
}

// kubeconfig is an admin kubeconfig for the node's own components
// (kube-proxy), through its loopback proxy.
func (n *Node) kubeconfig() string { return filepath.Join(n.Dir, "admin.kubeconfig") }

func (n *Node) writeAdminKubeconfig() error {
	b, err := os.ReadFile(n.c.Kubeconfig)
	if err != nil {
		return err
	}
	body := strings.ReplaceAll(string(b), n.c.APIServerURL(), n.localAPIServerURL())
	return os.WriteFile(n.kubeconfig(), []byte(body), 0o600)
}

// Down stops the node: kube-proxy, kubelet, containerd and its shims by PID, whatever
// still runs in its cgroups, the mount namespace, the proxy, the hosts
// line; its Node object is deleted. Safe to call more than once.
func (n *Node) Down() error {
	n.downOnce.Do(func() {
		var errs []error
		for _, name := range []string{Kubelet, KubeProxy, Containerd} {
			if p := n.proc(name); p != nil {
				p.stop(10 * time.Second)
			}
		}
		if n.Socket != "" {
			errs = append(errs, killShims(n.Socket))
		}
		errs = append(errs, n.removeCgroups())
		if n.holder != nil && n.holder.Process != nil {
			_ = n.holder.Process.Kill()
		}
		for _, d := range n.pinned {
			if out, err := exec.Command("umount", "-l", d).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("unpin %s: %v: %s", d, err, out))
			}
		}
		if n.proxy != nil {
			_ = n.proxy.Close()
		}
		if n.hostLine != "" {
			if b, err := os.ReadFile("/etc/hosts"); err == nil {
				errs = append(errs, os.WriteFile("/etc/hosts", []byte(removeLine(string(b), n.hostMarker())), 0o644))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _, _ = n.c.api(ctx, "DELETE", "/api/v1/nodes/"+n.Opts.Name, nil)
		n.downErr = errors.Join(errs...)
	})
	return n.downErr
}
