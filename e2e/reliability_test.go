package e2e

import (
	"encoding/json"
	"os"
	"sync"
	"testing"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// reliabilityRow is a RELIABILITY.md row. Tests record rows as they run;
// with FLOCK_RELIABILITY_OUT set they also go to that file (JSON lines),
// from which `make reliability` renders RELIABILITY.md.
type reliabilityRow = lab.ReliabilityRow

var reliabilityMu sync.Mutex

// record logs a row and appends it to FLOCK_RELIABILITY_OUT, if set.
func record(t *testing.T, r reliabilityRow) {
	t.Helper()
	r.Test = t.Name()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RELIABILITY %s", b)
	path := os.Getenv("FLOCK_RELIABILITY_OUT")
	if path == "" {
		return
	}
	reliabilityMu.Lock()
	defer reliabilityMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("reliability output: %v", err)
		return
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		t.Errorf("reliability output: %v", err)
	}
}
