package k8slab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Down deletes all pods (so that containerd runs CNI DEL for them), stops
// every process the lab started by its recorded PID, and restores the host:
// mounts, cni-* netns, sysctls, iptables chains and the dirs kubelet,
// containerd and libcni hardcode. It is safe to call more than once; later
// calls return the first result.
func (c *Cluster) Down() error {
	c.downOnce.Do(func() { c.downErr = c.down() })
	return c.downErr
}

func (c *Cluster) down() error {
	log := c.Opts.Log
	var errs []error
	note := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	// Controllers first, or deleted pods come back.
	note("stop kube-scheduler", c.stopProc(Scheduler, 5*time.Second))
	note("stop kube-controller-manager", c.stopProc(ControllerManager, 5*time.Second))
	c.deletePods(log)
	note("stop kubelet", c.stopProc(Kubelet, 10*time.Second))
	c.removeContainers()
	note("stop shims", killShims(c.ContainerdSocket))
	note("stop containerd", c.stopProc(Containerd, 10*time.Second))
	note("stop kube-proxy", c.stopProc(KubeProxy, 5*time.Second))
	note("stop coredns", c.stopProc(CoreDNS, 5*time.Second))
	note("stop kube-apiserver", c.stopProc(APIServer, 10*time.Second))
	note("stop etcd", c.stopProc(Etcd, 10*time.Second))
	c.mu.Lock()
	st := c.st
	c.mu.Unlock()
	note("restore host", restoreHost(&st))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("k8slab down: %w", err)
	}
	log("k8slab: down, host restored")
	return nil
}

// deletePods deletes all pods while kubelet still runs, so their sandboxes
// are torn down through CNI DEL. Pod-network pods go first: a CNI plugin's
// own agent usually is a hostNetwork pod and must outlive them. Failures
// are logged, not returned: the processes are stopped regardless.
func (c *Cluster) deletePods(log func(string, ...any)) {
	if p := c.proc(Kubelet); p == nil || !p.running() {
		log("k8slab: kubelet is not running; pods are not deleted through CNI DEL")
		return
	}
	if p := c.proc(APIServer); p == nil || !p.running() {
		return
	}
	for _, sel := range []string{"spec.hostNetwork=false", ""} {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		args := []string{"delete", "pods", "-A", "--wait=true", "--timeout=60s"}
		if sel != "" {
			args = append(args, "--field-selector", sel)
		} else {
			args = append(args, "--all")
		}
		if out, err := c.Kubectl(ctx, args...); err != nil {
			log("k8slab: delete pods: %v", err)
		} else if s := strings.TrimSpace(out); s != "" && !strings.HasPrefix(s, "No resources") {
			log("k8slab: %s", s)
		}
		cancel()
	}
}

// removeContainers kills what kubelet left behind in containerd (pods it
// could not delete), so that the shims exit on their own.
func (c *Cluster) removeContainers() {
	if p := c.proc(Containerd); p == nil || !p.running() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctr := func(args ...string) []string {
		out, err := runQuiet(ctx, filepath.Join(c.ContainerdDir, "ctr"), append([]string{"-a", c.ContainerdSocket, "-n", "k8s.io"}, args...)...)
		if err != nil {
			return nil
		}
		return strings.Fields(out)
	}
	tasks := ctr("tasks", "ls", "-q")
	for _, t := range tasks {
		ctr("tasks", "kill", "-s", "KILL", t)
	}
	for _, t := range tasks {
		ctr("tasks", "delete", "-f", t)
	}
}

// restoreHost undoes what a lab changed on the host once its processes
// are gone: mounts, pod netns, sysctls, iptables chains, hardcoded dirs.
func restoreHost(st *labState) error {
	var errs []error
	note := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	note("unmount", unmountAll([]string{st.Dir, "/run/containerd"}))
	note("delete cni netns", deleteNetns(st.NetnsBefore))
	note("restore sysctls", restoreSysctls(st.Sysctls))
	if st.LabLink {
		note("remove "+LabLink, removeLabLink())
	}
	if st.Services {
		note("remove kube-proxy's tables", removeKubeProxyTables())
	}
	note("remove iptables chains", removeIptables())
	if st.DirsBefore != nil {
		note("remove hardcoded dirs", removeNewDirs(st.DirsBefore))
	}
	note("clear marker", clearMarker(st.Dir))
	return errors.Join(errs...)
}

// deleteNetns removes the cni-* network namespaces that are not in before
// (containerd makes one per sandbox and leaves it when CNI DEL never ran).
func deleteNetns(before map[string]bool) error {
	if before == nil {
		return nil // not recorded: nothing is known to be ours
	}
	var errs []error
	for path := range cniNetns() {
		if before[path] {
			continue
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", path, err))
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", filepath.Base(path), err))
		}
	}
	return errors.Join(errs...)
}
