package k8slab

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Component names, as used for log files and LogTail.
const (
	Etcd              = "etcd"
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
	Containerd        = "containerd"
	Kubelet           = "kubelet"
	KubeProxy         = "kube-proxy"
	CoreDNS           = "coredns"
)

func (c *Cluster) logPath(component string) string {
	return filepath.Join(c.Opts.Dir, "logs", component+".log")
}

// LogTail returns the last n lines of a component's log (see the component
// name constants), for test failure output.
func (c *Cluster) LogTail(component string, n int) string {
	f, err := os.Open(c.logPath(component))
	if err != nil {
		return fmt.Sprintf("(no %s log: %v)", component, err)
	}
	defer f.Close()
	// The tail of a busy log is in its last few hundred KiB.
	const window = 512 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		if _, err := f.Seek(-window, io.SeekEnd); err != nil {
			return fmt.Sprintf("(read %s log: %v)", component, err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(read %s log: %v)", component, err)
	}
	return tail(string(b), n)
}

// LogErrors returns the last n error lines of a component's log (klog's
// lines that start with E and the date, logrus's level=error), the ones
// that say why a sandbox or a container failed when the tail is only
// probe noise.
func (c *Cluster) LogErrors(component string, n int) string {
	b, err := os.ReadFile(c.logPath(component))
	if err != nil {
		return fmt.Sprintf("(no %s log: %v)", component, err)
	}
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if len(l) > 5 && l[0] == 'E' && l[1] >= '0' && l[1] <= '9' || strings.Contains(l, "level=error") {
			errs = append(errs, l)
		}
	}
	return tail(strings.Join(errs, "\n"), n)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
