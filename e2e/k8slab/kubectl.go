package k8slab

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// KubectlPath is the built kubectl binary.
func (c *Cluster) KubectlPath() string {
	return filepath.Join(c.BinDir, "kubectl")
}

// Kubectl runs the built kubectl as admin and returns its combined output;
// on failure the error includes that output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlStdin(ctx, "", args...)
}

// KubectlStdin is Kubectl with stdin fed from a string (for apply -f -).
func (c *Cluster) KubectlStdin(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.KubectlPath(), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}
