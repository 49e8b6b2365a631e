package daemon

import (
	"context"
	"os"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

// plannedStop returns the context the agent runs in. It ends when outer
// does (a planned stop: SIGTERM, a rollout), but only once before has
// returned: the restart marker is in place before the CNI socket closes,
// so no STATUS finds neither. cancel ends it at once, and waits for a
// before already running.
func plannedStop(outer context.Context, before func()) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(outer))
	done := make(chan struct{})
	stop := context.AfterFunc(outer, func() {
		defer close(done)
		before()
		cancel()
	})
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			if !stop() { // before is running or ran
				<-done
			}
			cancel()
		})
	}
}

// markRestart leaves the restart marker, so the plugin's STATUS keeps the
// node Ready until the next agent serves (it removes the marker) or the
// grace ends. Only an agent that served leaves one: one that never did
// has no Ready node to keep.
func (d *daemon) markRestart() {
	if d.o.RestartGrace <= 0 || !d.ready.Load() {
		return
	}
	until := time.Now().Add(d.o.RestartGrace)
	if err := wire.WriteRestart(d.o.CNISocket, wire.Restart{Until: until, PID: os.Getpid()}); err != nil {
		d.log.Warn("planned stop: no restart marker, so the node goes NotReady until the agent is back", "err", err)
		return
	}
	d.log.Info("planned stop: the CNI plugin keeps the node Ready while the agent restarts",
		"marker", wire.RestartMarker(d.o.CNISocket), "until", until.Format(time.RFC3339))
}

// clearRestart removes the marker once this agent serves.
func (d *daemon) clearRestart() {
	if err := wire.RemoveRestart(d.o.CNISocket); err != nil {
		d.log.Warn("restart marker", "err", err)
	}
}
