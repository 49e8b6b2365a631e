package daemon

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// The agent's heap is mostly long-lived (GoBGP's tables, the node state),
// and it allocates in bursts (a node filling with pods, a full repair).
// Go's defaults suit the opposite: the heap may grow to twice what is live
// before a collection, and what a burst freed goes back to the kernel only
// slowly. Both cost resident memory and buy little here.
const (
	// gcPercent is GOGC unless the environment sets it: the heap may grow
	// by a quarter of what is live before a collection.
	gcPercent = 25
	// trimEvery is how often memory is looked at, and trimAbove (or a
	// sixteenth of the live heap, if more) how much garbage or freed heap
	// is worth a forced collection and handing the pages back: about once
	// per full repair on an idle loaded node, a few ms of CPU each. Left
	// to the GC's pacing and the scavenger, a loaded node's resident set
	// grew by a third of its live heap within a minute of idling. The
	// cost is bounded: at most one forced collection per natural one, and
	// none while natural ones come less than trimEvery apart.
	trimEvery = 5 * time.Second
	trimAbove = 1 << 20
)

// tuneGC applies gcPercent unless GOGC is set, and returns what paces the
// GC through bursts of CNI requests (nil when GOGC is set: the operator's
// choice stands).
func tuneGC() *burstGC {
	if os.Getenv("GOGC") != "" {
		return nil
	}
	debug.SetGCPercent(gcPercent)
	return &burstGC{quiet: burstQuiet}
}

const (
	// burstGCPercent is GOGC while CNI requests keep coming: collections
	// at gcPercent's pace cost ~15 % of the agent's CPU per ADD in a burst.
	burstGCPercent = 100
	// burstQuiet without a request ends a burst.
	burstQuiet = 2 * time.Second
)

// burstGC lets the heap grow by as much as is live while a node fills with
// pods, and when the burst is over (quiet without a CNI request) puts
// gcPercent back and collects and hands back what the burst left: the
// resident memory at rest is what it was.
type burstGC struct {
	quiet time.Duration
	mu    sync.Mutex
	on    bool
	last  time.Time
	timer *time.Timer
}

// request notes a CNI request. Safe on a nil *burstGC (GOGC set).
func (g *burstGC) request() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.last = time.Now()
	if g.on {
		return
	}
	g.on = true
	debug.SetGCPercent(burstGCPercent)
	if g.timer == nil {
		g.timer = time.AfterFunc(g.quiet, g.rest)
	} else {
		g.timer.Reset(g.quiet)
	}
}

// rest ends the burst once quiet has passed since the last request.
func (g *burstGC) rest() {
	g.mu.Lock()
	if left := g.quiet - time.Since(g.last); left > 0 {
		g.timer.Reset(left) // a request came meanwhile
		g.mu.Unlock()
		return
	}
	g.on = false
	debug.SetGCPercent(gcPercent)
	g.mu.Unlock()
	debug.FreeOSMemory()
}

// trimMemory collects and hands freed heap back to the kernel once a burst
// is over (a node filling with pods, a full repair re-reading 10,000
// routes): when no collection ran since the last look and the garbage or
// the free heap exceeds trimAbove or a sixteenth of the live heap, until ctx
// ends. While the GC keeps running on its own, it is left to its pacing.
func trimMemory(ctx context.Context, log *slog.Logger) error {
	sample := []metrics.Sample{
		{Name: "/memory/classes/heap/free:bytes"},    // freed, not handed back
		{Name: "/memory/classes/heap/objects:bytes"}, // live and garbage
		{Name: "/gc/heap/live:bytes"},                // live at the last collection
		{Name: "/gc/cycles/total:gc-cycles"},
	}
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	var lastCycles uint64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		metrics.Read(sample)
		var v [4]uint64
		for i, s := range sample {
			if s.Value.Kind() == metrics.KindUint64 {
				v[i] = s.Value.Uint64()
			}
		}
		free, garbage, live, cycles := v[0], v[1]-min(v[1], v[2]), v[2], v[3]
		busy := cycles != lastCycles
		lastCycles = cycles
		if busy {
			continue
		}
		if limit := max(trimAbove, live/16); free > limit || garbage > limit {
			debug.FreeOSMemory()
			metrics.Read(sample[3:])
			lastCycles = sample[3].Value.Uint64()
			log.Debug("collected and returned freed heap to the kernel", "free", free, "garbage", garbage)
		}
	}
}
