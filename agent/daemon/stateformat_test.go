package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/store"
)

// An agent given a state directory a newer release wrote (a downgrade
// across a state format) refuses to start, naming both releases, before
// it reads or touches anything there.
func TestAgentRefusesNewerState(t *testing.T) {
	dir := t.TempDir()
	stamp := `{"format":99,"release":"v9.0.0"}`
	if err := os.WriteFile(filepath.Join(dir, store.FormatFile), []byte(stamp), 0o600); err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(dir, "allocations", "c1.json")
	if err := os.MkdirAll(filepath.Dir(rec), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rec, []byte(`{"version":99,"containerID":"c1"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := newDaemon(context.Background(), Options{
		NodeConfig: "../../deploy/examples/nodeconfig.yaml", StateDir: dir, Release: "v0.21.0",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err == nil {
		t.Fatal("the agent started on a newer release's state")
	}
	for _, w := range []string{"flock v9.0.0", "state format 99", "this is flock v0.21.0", dir} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, store.FormatFile)); string(b) != stamp {
		t.Errorf("stamp rewritten: %s", b)
	}
	if b, _ := os.ReadFile(rec); string(b) != `{"version":99,"containerID":"c1"}` {
		t.Errorf("record touched: %s", b)
	}
}
