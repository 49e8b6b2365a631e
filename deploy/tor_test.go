package deploy_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The ToR configs deploy/tor ships parse with the real BIRD and FRR, and
// keep the statements the restart measurements (e2e
// TestAgentRestartUnderTraffic, the configurations marked recommended)
// depend on.
func TestToRConfigs(t *testing.T) {
	for _, c := range []struct {
		file  string
		check []string // the parser
		need  []string
	}{
		{"tor/bird.conf", []string{"bird", "-p", "-c"}, []string{"graceful restart on;", "bfd graceful;", "extended next hop on;", "min rx interval 300 ms; min tx interval 300 ms; multiplier 3;"}},
		{"tor/frr.conf", []string{"vtysh", "-C", "-f"}, []string{"bgp graceful-restart", "neighbor NODES bfd check-control-plane-failure", "neighbor NODES capability extended-nexthop", "bgp listen range", "update-source", "detect-multiplier 3", "receive-interval 300", "transmit-interval 300"}},
	} {
		t.Run(c.file, func(t *testing.T) {
			b, err := os.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range c.need {
				if !strings.Contains(string(b), s) {
					t.Errorf("%s lacks %q", c.file, s)
				}
			}
			if _, err := exec.LookPath(c.check[0]); err != nil {
				// CI installs bird2 and frr; only a bare dev machine lacks them.
				if os.Getenv("FLOCK_REQUIRE_ROOT") != "" {
					t.Fatalf("%s not installed: %v", c.check[0], err)
				}
				t.Skipf("%s not installed", c.check[0])
			}
			out, err := exec.Command(c.check[0], append(c.check[1:], c.file)...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s rejects %s: %v\n%s", c.check[0], c.file, err, out)
			}
		})
	}
}
