package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/k8s/check"
)

// buildFlockctl builds flockctl from this tree.
func buildFlockctl(t *testing.T) string {
	t.Helper()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "flockctl")
	if out, err := exec.Command("go", "build", "-C", root, "-o", bin, "./cmd/flockctl").CombinedOutput(); err != nil {
		t.Fatalf("build flockctl: %v\n%s", err, out)
	}
	return bin
}

// flockctlCheck runs `flockctl check` (built from this tree) against the
// lab with the admin kubeconfig, the probes from this tree's image, and
// returns its results; a check that fails is the test's failure (unless
// wantFail), the table in the log.
func flockctlCheck(t *testing.T, c *k8slab.Cluster, what string, wantFail ...string) []check.Result {
	t.Helper()
	bin := buildFlockctl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "check", "--kubeconfig", c.Kubeconfig, "--image", k8sImage, "-o", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var rs []check.Result
	if jerr := json.Unmarshal(out, &rs); jerr != nil {
		t.Fatalf("flockctl check (%s): %v (%v)\n%s%s", what, jerr, err, out, stderr.String())
	}
	var table strings.Builder
	for _, r := range rs {
		table.WriteString(r.Check + " | " + r.Result + " | " + r.Detail + "\n")
	}
	t.Logf("flockctl check (%s):\n%s", what, table.String())
	for _, r := range rs {
		expected := false
		for _, w := range wantFail {
			expected = expected || strings.Contains(r.Check, w)
		}
		if r.Result == check.Fail && !expected {
			t.Errorf("flockctl check (%s): %s: %s; why: %s", what, r.Check, r.Detail, r.Why)
		}
	}
	if (err != nil) != check.Failed(rs) {
		t.Errorf("flockctl check (%s): exit %v with results failed=%v", what, err, check.Failed(rs))
	}
	return rs
}
