package k8slab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// labSysctls are the settings kubelet (kernel and VM tunables it enforces)
// or the CNI plugins (forwarding) change; Up records them and Down puts
// them back.
var labSysctls = []string{
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
	"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding",
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

// ReadSysctl returns a sysctl's value as the kernel prints it.
func ReadSysctl(key string) (string, error) {
	b, err := os.ReadFile(sysctlPath(key))
	if err != nil {
		return "", fmt.Errorf("read sysctl %s: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}

func writeSysctl(key, value string) error {
	if err := os.WriteFile(sysctlPath(key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("write sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// saveSysctls reads the current values of labSysctls.
func saveSysctls() (map[string]string, error) {
	m := map[string]string{}
	for _, k := range labSysctls {
		v, err := ReadSysctl(k)
		if err != nil {
			return nil, err
		}
		m[k] = v
	}
	return m, nil
}

// SavedSysctls returns the values Up recorded before starting anything.
func (c *Cluster) SavedSysctls() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]string, len(c.st.Sysctls))
	for k, v := range c.st.Sysctls {
		m[k] = v
	}
	return m
}

func restoreSysctls(saved map[string]string) error {
	var errs []error
	for k, v := range saved {
		if cur, err := ReadSysctl(k); err == nil && cur == v {
			continue
		}
		errs = append(errs, writeSysctl(k, v))
	}
	return errors.Join(errs...)
}
