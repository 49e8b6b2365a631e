package k8slab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// debPackages are the Debian packages the lab runs: etcd, runc (1.1.5:
// containerd 1.7 and 2.4 both take it), the distribution's reference CNI
// plugins (1.1.1: the "old plugins" case, and the benchmark's baseline),
// busybox for the test image, and the tools kubelet and Down use.
// containerd, Kubernetes and the current CNI plugins are built from the
// Go module proxy (build/).
var debPackages = []string{
	"etcd-server", "runc", "containernetworking-plugins",
	"busybox-static", "iptables", "conntrack",
	// Services (kube-proxy's nftables mode) and the tools in the upstream
	// suite's test image.
	"nftables", "curl", "netcat-openbsd", "bind9-dnsutils",
}

// policyRC makes invoke-rc.d refuse to start services while packages are
// installed: the lab starts etcd and containerd itself, with its own config.
const policyRC = "/usr/sbin/policy-rc.d"

// EnsurePackages installs the Debian packages the lab needs; apt is not run
// when all of them are installed already.
func EnsurePackages() error {
	missing := missingPackages()
	if len(missing) == 0 {
		return nil
	}
	if _, err := os.Stat(policyRC); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(policyRC, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", policyRC, err)
		}
		defer os.Remove(policyRC)
	}
	if err := apt("update", "-q"); err != nil {
		return err
	}
	return apt(append([]string{"install", "-yq", "--no-install-recommends"}, missing...)...)
}

func missingPackages() []string {
	var missing []string
	for _, p := range debPackages {
		out, err := exec.Command("dpkg-query", "-W", "-f=${db:Status-Status}", p).Output()
		if err != nil || strings.TrimSpace(string(out)) != "installed" {
			missing = append(missing, p)
		}
	}
	return missing
}

func apt(args ...string) error {
	cmd := exec.Command("apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, tail(out.String(), 20))
	}
	return nil
}
