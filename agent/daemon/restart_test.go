package daemon

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

// A planned stop (outer ends) leaves the restart marker before the agent's
// context ends, so the CNI socket never closes without it; a stop of the
// agent's own (a component failed) leaves none.
func TestPlannedStopMarksBeforeStopping(t *testing.T) {
	d := withGrace(runDaemon(t), 30*time.Second)
	d.ready.Store(true)
	outer, stopOuter := context.WithCancel(context.Background())
	var ctx context.Context
	var doneDuringMark atomic.Bool
	ctx, cancel := plannedStop(outer, func() {
		doneDuringMark.Store(ctx.Err() != nil)
		d.markRestart()
	})
	defer cancel()
	start := time.Now()
	stopOuter()
	<-ctx.Done()
	r, ok := wire.Restarting(d.o.CNISocket, time.Now())
	if !ok {
		t.Fatal("the agent's context ended without a fresh restart marker")
	}
	if doneDuringMark.Load() {
		t.Error("the agent's context ended before the marker was written")
	}
	if r.Until.Before(start.Add(30*time.Second)) || r.Until.After(time.Now().Add(30*time.Second)) || r.PID != os.Getpid() {
		t.Errorf("marker %+v, want until 30 s after the stop and this PID", r)
	}

	// The next agent removes it once it serves.
	(&daemonStartup{d: d}).serve()
	if _, err := os.Stat(wire.RestartMarker(d.o.CNISocket)); !os.IsNotExist(err) {
		t.Errorf("marker still there after serving: %v", err)
	}

	d = withGrace(runDaemon(t), 30*time.Second)
	d.ready.Store(true)
	outer, stopOuter = context.WithCancel(context.Background())
	defer stopOuter()
	ctx, cancel = plannedStop(outer, d.markRestart)
	cancel()
	<-ctx.Done()
	stopOuter() // after the agent stopped: nothing runs any more
	if _, err := os.Stat(wire.RestartMarker(d.o.CNISocket)); !os.IsNotExist(err) {
		t.Errorf("a stop that was not planned left a marker: %v", err)
	}
}

// Only an agent that served leaves a marker, and only with a grace.
func TestMarkRestartOnlyWhenServing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		grace   time.Duration
		serving bool
	}{{"not serving yet", 30 * time.Second, false}, {"no grace", 0, true}} {
		d := withGrace(runDaemon(t), tc.grace)
		d.ready.Store(tc.serving)
		d.markRestart()
		if _, err := os.Stat(wire.RestartMarker(d.o.CNISocket)); !os.IsNotExist(err) {
			t.Errorf("%s: marker written (%v)", tc.name, err)
		}
	}
}

func withGrace(d *daemon, grace time.Duration) *daemon {
	d.o.RestartGrace = grace
	return d
}
