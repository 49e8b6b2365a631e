package netpol

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "node name is empty"},
		{Config{NodeName: "n1", QueueID: -1}, "queue ID -1"},
		{Config{NodeName: "n1", QueueID: 70000}, "queue ID 70000"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
		// Run refuses the same config before it touches the API or the
		// kernel.
		err = Run(context.Background(), &rest.Config{Host: "https://192.0.2.1:1"}, tc.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{NodeName: "n1", QueueID: 100}).Validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}

// The probe answers on this kernel and leaves no table behind. Which
// answer is right depends on the kernel: it is checked against what the
// nft command says of the same rule.
func TestNftQueueProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("FLOCK_REQUIRE_ROOT") != "" {
			t.Fatal("needs root (nftables)")
		}
		t.Skip("needs root (nftables)")
	}
	got, err := nftQueueWorks()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("nft", "list", "tables").CombinedOutput()
	if strings.Contains(string(out), probeTable) {
		t.Errorf("the probe left table %s: %s", probeTable, out)
	}
	// The same rule through the nft command, in a table of this test.
	const tbl = "flock-netpol-probe-test"
	defer exec.Command("nft", "delete", "table", "inet", tbl).Run()
	want := exec.Command("nft", "-f", "-")
	want.Stdin = strings.NewReader("table inet " + tbl + " { chain c { queue num 65535 bypass; } }\n")
	nftSays, err := want.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run nft (Debian's nftables): %v", err)
	}
	if wantOK := err == nil; got != wantOK {
		t.Errorf("probe says nft queue works = %v; nft says %v (%s)", got, wantOK, strings.TrimSpace(string(nftSays)))
	}
}

// The SCTP probe answers without error on any kernel: yes, or no with the
// reason logged at start (this project's CI kernel has no SCTP).
func TestSCTPProbe(t *testing.T) {
	ok, err := sctpSupported()
	if err != nil {
		t.Fatalf("sctpSupported: %v", err)
	}
	t.Logf("kernel has SCTP: %v", ok)
	if _, statErr := os.Stat("/proc/net/sctp"); (statErr == nil) != ok {
		t.Errorf("probe says SCTP %v, /proc/net/sctp exists: %v", ok, statErr == nil)
	}
}
