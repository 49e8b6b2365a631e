package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// apiOnlyLab starts the lab's etcd and kube-apiserver alone (no node, no
// runtime) for t and tears them down when t ends: an API for agents the
// test runs itself.
func apiOnlyLab(t *testing.T) *k8slab.Cluster {
	t.Helper()
	c, err := k8slab.Up(context.Background(), k8slab.Options{Dir: filepath.Join(t.TempDir(), "k8s"), APIOnly: true, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Down(); err != nil {
			t.Errorf("k8slab down: %v", err)
		}
	})
	return c
}

// kubectlRetry runs kubectl as admin (stdin, if any, fed to it), trying
// again for up to 30 s: a just-created CRD takes a moment to be served.
func kubectlRetry(t *testing.T, c *k8slab.Cluster, stdin string, args ...string) string {
	t.Helper()
	ctx := context.Background()
	var out string
	var err error
	for range 30 {
		if stdin == "" {
			out, err = c.Kubectl(ctx, args...)
		} else {
			out, err = c.KubectlStdin(ctx, stdin, args...)
		}
		if err == nil {
			return out
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	return ""
}

// apiProxy lets processes in ns reach the lab's loopback-only API server
// under the same address (so the kubeconfig and its certificate still
// match) until t ends. It may run inside lab.LabOptions.Setup.
func apiProxy(t *testing.T, ns *lab.NS) error {
	stop, err := ns.Proxy(net127(k8slab.APIServerPort), net127(k8slab.APIServerPort))
	if err != nil {
		return err
	}
	t.Cleanup(stop)
	return nil
}
