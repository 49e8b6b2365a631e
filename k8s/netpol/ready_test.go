package netpol

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The kernel writes each bound queue as "%5u %6u %5u %1u %5u %5u %5u %8u %2d"
// (queue, peer port ID, queued, copy mode, copy range, queue dropped, user
// dropped, last packet ID, 1).
const sampleNfqueue = `  100  48213     0 2   128     0     0     1742  1
65535      7     2 2 65531    12     3 4294967295  1

    7  48214     0 2   128     0     0        0  1
`

func TestBoundQueues(t *testing.T) {
	got, err := boundQueues(strings.NewReader(sampleNfqueue))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !got[100] || !got[65535] || !got[7] {
		t.Errorf("bound queues %v, want 7, 100 and 65535", got)
	}
	if got, err := boundQueues(strings.NewReader("")); err != nil || len(got) != 0 {
		t.Errorf("no queue bound: %v, %v; want none", got, err)
	}
	if _, err := boundQueues(strings.NewReader(sampleNfqueue + "  x 1 2\n")); err == nil || !strings.Contains(err.Error(), `line 5: queue number "x"`) {
		t.Errorf("a malformed line: %v, want an error naming it", err)
	}
}

func TestReadyNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	proc := filepath.Join(dir, "nfnetlink_queue")
	if err := os.WriteFile(proc, []byte(sampleNfqueue), 0o600); err != nil {
		t.Fatal(err)
	}
	tableOK := func() error { return nil }
	noTable := func() error { return errors.New("nftables table inet flock-netpol does not exist yet") }
	for _, tc := range []struct {
		name  string
		queue int
		table func() error
		proc  string
		want  string // "" ready
	}{
		{"enforcing", 100, tableOK, proc, ""},
		{"no table", 100, noTable, proc, "table inet flock-netpol does not exist yet"},
		{"queue not bound", 101, tableOK, proc, "no process reads NFQUEUE 101 yet"},
		{"module not loaded", 100, tableOK, filepath.Join(dir, "absent"), "no process reads NFQUEUE 100 (" + dir},
	} {
		err := ready(tc.queue, tc.table, tc.proc)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want ready", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: reason %q is more than one line", tc.name, err)
		}
	}
}

// WaitLoaded waits for a Run to attach and load its first verdicts, or
// for its context.
func TestWaitLoaded(t *testing.T) {
	v := &Verdicts{}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if v.WaitLoaded(ctx) {
		t.Fatal("loaded with no Run attached")
	}
	k := &kernelVerdicts{loaded: make(chan struct{})}
	v.kv.Store(k)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if v.WaitLoaded(ctx2) {
		t.Fatal("loaded before the first load")
	}
	done := make(chan bool, 1)
	go func() { done <- v.WaitLoaded(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	close(k.loaded)
	waitLoadedReturns(t, done, "after the first load")
}

// waitLoadedReturns fails t unless WaitLoaded, started with done, returns
// true within 5 s.
func waitLoadedReturns(t *testing.T, done <-chan bool, when string) {
	t.Helper()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("not loaded " + when)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitLoaded did not return " + when)
	}
}

// WaitLoaded follows the Run attached now: a Run that ended before its
// first load does not hold it when the next one loads.
func TestWaitLoadedFollowsTheAttachedRun(t *testing.T) {
	v := &Verdicts{}
	v.kv.Store(&kernelVerdicts{loaded: make(chan struct{})}) // never loads
	done := make(chan bool, 1)
	go func() { done <- v.WaitLoaded(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	v.kv.Store(nil) // it ended
	k := &kernelVerdicts{loaded: make(chan struct{})}
	v.kv.Store(k) // the next Run attached, and loaded
	close(k.loaded)
	waitLoadedReturns(t, done, "after the next Run's first load (the detached one's never came)")
	if !(*Verdicts)(nil).WaitLoaded(context.Background()) {
		t.Error("a nil Verdicts, ready, is not loaded")
	}
}
