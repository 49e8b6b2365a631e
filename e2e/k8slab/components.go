package k8slab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// etcdBin is Debian's etcd-server.
const etcdBin = "/usr/bin/etcd"

func (c *Cluster) startEtcd(ctx context.Context) error {
	loop := func(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }
	args := []string{"--name", "k8slab",
		"--data-dir", filepath.Join(c.Opts.Dir, "etcd"),
		"--listen-client-urls", loop(etcdClientPort), "--advertise-client-urls", loop(etcdClientPort),
		"--listen-peer-urls", loop(etcdPeerPort), "--initial-advertise-peer-urls", loop(etcdPeerPort),
		"--initial-cluster", "k8slab=" + loop(etcdPeerPort),
		"--listen-metrics-urls", "http://127.0.0.1:2381"}
	if q := c.Opts.EtcdQuotaBytes; q > 0 {
		args = append(args, "--quota-backend-bytes", strconv.FormatInt(q, 10))
	}
	_, err := c.startProc(Etcd, etcdBin, args...)
	if err != nil {
		return err
	}
	return c.waitHTTPOK(ctx, Etcd, loop(etcdClientPort)+"/health")
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	pki := c.pkiDir()
	f := func(name string) string { return filepath.Join(pki, name) }
	host := c.apiServerHost()
	args := []string{"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(etcdClientPort),
		"--bind-address=" + host, "--secure-port=" + strconv.Itoa(APIServerPort), "--advertise-address=" + host,
		"--service-cluster-ip-range=" + strings.Join(c.ServiceCIDRs(), ",")}
	if !c.Opts.Services {
		// The kubernetes Service's endpoints would point at 127.0.0.1, which
		// is meaningless to pods; the lab's DNAT stands in for them.
		args = append(args, "--endpoint-reconciler-type=none")
	}
	_, err := c.startProc(APIServer, filepath.Join(c.BinDir, APIServer), append(args,
		"--tls-cert-file="+f("apiserver.crt"), "--tls-private-key-file="+f("apiserver.key"),
		"--client-ca-file="+f("ca.crt"),
		"--service-account-key-file="+f("sa.pub"), "--service-account-signing-key-file="+f("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate="+f("apiserver-kubelet-client.crt"), "--kubelet-client-key="+f("apiserver-kubelet-client.key"),
		// kubelet listens on loopback only; the node's hostname resolves there.
		"--kubelet-preferred-address-types=Hostname,InternalIP",
		"--allow-privileged=true",
		"--cert-dir="+filepath.Join(c.Opts.Dir, "run", "apiserver-certs"),
		"--v=1")...)
	if err != nil {
		return err
	}
	return c.WaitAPIServer(ctx)
}

// startControllers starts the controller manager (Deployments, DaemonSets,
// service account tokens) and the scheduler, both as admin, loopback only,
// without leader election.
func (c *Cluster) startControllers() error {
	kc := c.Kubeconfig
	common := []string{"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--leader-elect=false"}
	pki := c.pkiDir()
	kcm := append(append([]string(nil), common...),
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
		"--root-ca-file="+filepath.Join(pki, "ca.crt"),
		"--cluster-signing-cert-file="+filepath.Join(pki, "ca.crt"), "--cluster-signing-key-file="+filepath.Join(pki, "ca.key"),
		"--use-service-account-credentials=true",
		"--service-cluster-ip-range="+strings.Join(c.ServiceCIDRs(), ","),
		// Its default, /usr/libexec/kubernetes/..., would be created on the host.
		"--flex-volume-plugin-dir="+filepath.Join(c.kubeletDir(), "volume-plugins"))
	if _, err := c.startProc(ControllerManager, filepath.Join(c.BinDir, ControllerManager), kcm...); err != nil {
		return err
	}
	_, err := c.startProc(Scheduler, filepath.Join(c.BinDir, Scheduler), common...)
	return err
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	cfg, err := c.writeContainerdConfig()
	if err != nil {
		return err
	}
	if _, err := c.startProc(Containerd, filepath.Join(c.ContainerdDir, "containerd"), "--config", cfg); err != nil {
		return err
	}
	return poll(ctx, "containerd socket", 100*time.Millisecond, func(context.Context) (bool, error) {
		if p := c.proc(Containerd); !p.running() {
			return false, fatalError{p.exitErr()}
		}
		fi, err := os.Stat(c.ContainerdSocket)
		return err == nil && fi.Mode()&os.ModeSocket != 0, err
	})
}

// kubeletArgs are kept so that StartKubelet restarts it identically.
func (c *Cluster) kubeletArgs() ([]string, error) {
	d := c.kubeletDir()
	for _, sub := range []string{"root", "pki", "manifests", "pod-logs", "volume-plugins"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			return nil, fmt.Errorf("create kubelet dirs: %w", err)
		}
	}
	cfg, err := c.writeKubeletConfig()
	if err != nil {
		return nil, err
	}
	kc, err := c.writeKubeconfig("kubelet")
	if err != nil {
		return nil, err
	}
	return []string{"--config=" + cfg, "--kubeconfig=" + kc,
		"--root-dir=" + filepath.Join(d, "root"), "--cert-dir=" + filepath.Join(d, "pki"),
		"--hostname-override=" + c.Opts.NodeName, "--node-ip=" + c.Opts.NodeIP, "--v=2"}, nil
}

// StartKubelet (re)starts kubelet with the arguments Up used.
func (c *Cluster) StartKubelet() error {
	if p := c.proc(Kubelet); p != nil && p.running() {
		return fmt.Errorf("start kubelet: already running as pid %d", p.cmd.Process.Pid)
	}
	_, err := c.startProc(Kubelet, filepath.Join(c.BinDir, Kubelet), c.kubeletFlags...)
	return err
}

// StopKubelet stops kubelet by its PID; its pods keep running, as when
// kubelet crashes or is restarted on a real node.
func (c *Cluster) StopKubelet() error {
	if err := c.stopProc(Kubelet, 10*time.Second); err != nil {
		return err
	}
	c.Opts.Log("k8slab: kubelet stopped")
	return nil
}

// Reboot does to the node what a reboot does to its pods: kubelet and
// containerd stop, every container dies with its shim (SIGKILL: nothing
// runs its shutdown), the pods' network namespaces go; then containerd
// and kubelet start again, find the sandboxes dead and tear them down
// (CNI DEL of namespaces that no longer exist) and start the pods again.
// What is on disk (the agents' state) survives, as it would.
func (c *Cluster) Reboot(ctx context.Context) error {
	if err := c.StopKubelet(); err != nil {
		return err
	}
	for _, pid := range ShimPIDs(c.ContainerdSocket) {
		if p := c.proc(Containerd); p != nil && p.cmd.Process.Pid == pid {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if err := c.stopProc(Containerd, 10*time.Second); err != nil {
		return err
	}
	if err := killShims(c.ContainerdSocket); err != nil {
		return err
	}
	c.mu.Lock()
	before := c.st.NetnsBefore
	c.mu.Unlock()
	if err := deleteNetns(before); err != nil {
		return fmt.Errorf("reboot: remove the pods' network namespaces: %w", err)
	}
	c.Opts.Log("k8slab: node rebooted (containers killed, pod netns removed)")
	if err := c.startContainerd(ctx); err != nil {
		return c.withLog(Containerd, err)
	}
	return c.StartKubelet()
}
