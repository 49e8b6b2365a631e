package verdicts

import (
	"flag"
	"io"
	"os"
	"strconv"
	"testing"

	"k8s.io/klog/v2"
)

// TestMain quiets the engine: its log of every selector that does not
// parse would drown the test's own.
func TestMain(m *testing.M) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	os.Exit(m.Run())
}

// scaled is n, times FLOCK_VERDICTS_SCALE if set (`make fuzz` runs the
// differential tests longer, with a random seed).
func scaled(t *testing.T, n int) int {
	if s := os.Getenv("FLOCK_VERDICTS_SCALE"); s != "" {
		k, err := strconv.Atoi(s)
		if err != nil || k < 1 {
			t.Fatalf("FLOCK_VERDICTS_SCALE=%q: want a positive integer", s)
		}
		return n * k
	}
	return n
}
