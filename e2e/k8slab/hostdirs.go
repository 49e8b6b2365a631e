package k8slab

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// hardcodedDirs are created outside Dir by kubelet (device plugins, the
// /var/log/containers symlinks), containerd (shim sockets, runc state) and
// libcni (its result cache), whatever their configuration says. Down removes
// the ones that did not exist before Up, deepest first.
var hardcodedDirs = []string{
	"/var/lib/kubelet/device-plugins", "/var/lib/kubelet",
	"/var/log/containers", "/var/log/pods",
	"/var/lib/cni/results", "/var/lib/cni",
	"/run/containerd/runc/k8s.io", "/run/containerd/runc", "/run/containerd/s",
	"/run/containerd/io.containerd.runtime.v2.task", "/run/containerd",
	"/var/run/kubernetes",
	"/usr/libexec/kubernetes", // flex volume default, should a flag be missed
}

func existingPaths(paths []string) map[string]bool {
	m := map[string]bool{}
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			m[p] = true
		}
	}
	return m
}

// removeNewDirs removes the hardcoded dirs that were absent before Up. They
// hold only state of the lab's own containers, which are gone by now.
func removeNewDirs(before map[string]bool) error {
	dirs := append([]string(nil), hardcodedDirs...)
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	var firstErr error
	for _, d := range dirs {
		if before[d] {
			continue
		}
		if err := os.RemoveAll(d); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// cniNetns lists the network namespaces containerd's CRI made for pods.
func cniNetns() map[string]bool {
	m := map[string]bool{}
	names, _ := filepath.Glob("/run/netns/cni-*")
	for _, n := range names {
		m[n] = true
	}
	return m
}

// CNINetns lists the cni-* network namespaces under /run/netns, for tests
// of Down.
func CNINetns() []string {
	var out []string
	for n := range cniNetns() {
		out = append(out, filepath.Base(n))
	}
	sort.Strings(out)
	return out
}
