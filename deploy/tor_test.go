package deploy_test

import (
	"net/netip"
	"os"
	"os/exec"
	"regexp"
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
		{"tor/bird.conf", []string{"bird", "-p", "-c"}, []string{"graceful restart on;", "bfd graceful;", "extended next hop on;", "if (65535, 0) ~ bgp_community then bgp_local_pref = 0;", "min rx interval 300 ms; min tx interval 300 ms; multiplier 3;"}},
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

// Every ToR config deploy/tor ships agrees with the examples: the AS
// numbers, the password, the ranges its import filter accepts (each
// example pool and node summary inside one), and GTSM where the example
// NodeConfig asks for it. The configs no test runs say so on their first
// line.
func TestToRConfigsAgreeWithExamples(t *testing.T) {
	nc := readExample(t, "examples/nodeconfig.yaml")
	pools := readExample(t, "examples/addresspools.yaml")
	var ranges []string
	for _, m := range regexp.MustCompile(`(?m)^\s*-\s*cidr:\s*(\S+)`).FindAllStringSubmatch(nc, -1) {
		ranges = append(ranges, m[1])
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*-\s*([0-9a-f:.]+/\d+)\s*$`).FindAllStringSubmatch(pools, -1) {
		ranges = append(ranges, m[1])
	}
	if len(ranges) < 8 {
		t.Fatalf("found only %d ranges in the examples: %v", len(ranges), ranges)
	}
	accepted := []netip.Prefix{netip.MustParsePrefix("2001:db8:100::/48"), netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24")}
	for _, r := range ranges {
		p := netip.MustParsePrefix(r)
		ok := false
		for _, a := range accepted {
			ok = ok || (a.Contains(p.Addr()) && p.Bits() >= a.Bits())
		}
		if !ok {
			t.Errorf("example range %s is outside what the ToR configs accept (%v)", r, accepted)
		}
	}
	for _, c := range []struct {
		file     string
		untested bool
		need     []string
	}{
		{"tor/bird.conf", false, []string{"local as 64513", "as 64512", "2001:db8:0:1::2", "2001:db8:0:1::1", `password "s3cret"`, "ttl security on", "2001:db8:100::/48", "198.51.100.0/24", "203.0.113.0/24"}},
		{"tor/frr.conf", false, []string{"router bgp 64513", "remote-as 64512", "bgp listen range 2001:db8:0::/48", "password s3cret", "ttl-security hops 1", "2001:db8:100::/48", "198.51.100.0/24", "203.0.113.0/24"}},
		{"tor/eos.cfg", true, []string{"router bgp 64513", "remote-as 64512", "2001:db8:0::/48", "password 0 s3cret", "ttl maximum-hops 1", "2001:db8:100::/48", "198.51.100.0/24", "203.0.113.0/24", "bfd"}},
		{"tor/nxos.cfg", true, []string{"router bgp 64513", "remote-as 64512", "2001:db8:0::/48", "password 0 s3cret", "ttl-security hops 1", "2001:db8:100::/48", "198.51.100.0/24", "203.0.113.0/24", "bfd"}},
		{"tor/junos.conf", true, []string{"autonomous-system 64513", "peer-as 64512", "allow 2001:db8:0::/48", `authentication-key "s3cret"`, "ttlSecurityMin", "2001:db8:100::/48", "198.51.100.0/24", "203.0.113.0/24", "bfd-liveness-detection"}},
	} {
		s := readExample(t, c.file)
		first, _, _ := strings.Cut(s, "\n")
		if got := strings.Contains(first, "UNTESTED"); got != c.untested {
			t.Errorf("%s: first line %q: marked untested %v, want %v", c.file, first, got, c.untested)
		}
		for _, n := range c.need {
			if !strings.Contains(s, n) {
				t.Errorf("%s lacks %q", c.file, n)
			}
		}
	}
	if !strings.Contains(nc, "ttlSecurityMin: 255") || !strings.Contains(nc, "passwordSecretKey: tor") {
		t.Error("examples/nodeconfig.yaml: the ToR configs expect GTSM and the password from key tor")
	}
}

func readExample(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
