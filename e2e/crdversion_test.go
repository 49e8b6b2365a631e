package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// Issue 31, bad input: the API serves the NodeConfig CRD only in a
// version this agent does not read (as after a newer release dropped
// v1alpha1). A real API server and agent: the agent does not serve, and
// its /readyz and its log name the version it reads and how to see what
// is served; it keeps running (it retries), so a fixed CRD brings it up.
func TestUnknownCRDVersion(t *testing.T) {
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := apiOnlyLab(t)
	k := nctAPI{t: t, c: c}
	k.kubectl("", "apply", "-f", filepath.Join(root, "deploy", "namespace.yaml"))
	k.kubectl("", "apply", "-f", filepath.Join(root, "deploy", "rbac.yaml"))
	crd, err := os.ReadFile(filepath.Join(root, "deploy", "crd", "flock.fritzlab.net_nodeconfigs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(crd), "name: v1alpha1") {
		t.Fatal("the NodeConfig CRD has no version v1alpha1 to rename")
	}
	kubectlRetry(t, c, strings.Replace(string(crd), "name: v1alpha1", "name: v1alpha2", 1), "apply", "-f", "-")
	token := strings.TrimSpace(k.kubectl("", "-n", "flock-system", "create", "token", "flock", "--duration=1h"))
	kubeconfig := filepath.Join(t.TempDir(), "flock.kubeconfig")
	if err := c.WriteTokenKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}
	ns := newNS(t, "fcrd-")
	if err := apiProxy(t, ns); err != nil {
		t.Fatal(err)
	}
	a, err := lab.NewAgent(ns, t.TempDir(), "# Kubernetes mode: unused\n")
	if err != nil {
		t.Fatal(err)
	}
	a.Kubeconfig, a.NodeName = kubeconfig, "node1"
	a.Args = []string{"--metrics-address=127.0.0.1:9476", "--nodeconfig-wait=5m"}
	t.Cleanup(func() { _ = a.Stop() })
	if err := a.Start(filepath.Join(binDir, "flock-agent"), 2*time.Second); err == nil {
		t.Fatal("the agent is ready without a NodeConfig it can read")
	} else if strings.Contains(err.Error(), "exited") {
		t.Fatalf("the agent exited: %v\n%s", err, tail(a.Log(), 20))
	}
	want := "serves no nodeconfigs.flock.fritzlab.net/v1alpha1"
	testutil.EventuallyWithin(t, 30*time.Second, "/readyz to name the version the agent reads", func() (bool, string) {
		body, err := readyzIn(ns)
		return err == nil && strings.Contains(body, "503") && strings.Contains(body, want), fmt.Sprint(body, err)
	})
	if log := a.Log(); !strings.Contains(log, want) || !strings.Contains(log, "spec.versions") {
		t.Errorf("the agent's log does not say which version it reads and how to see the served ones:\n%s", tail(log, 20))
	}
}
