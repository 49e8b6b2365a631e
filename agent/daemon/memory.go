package daemon

import (
	"os"
	"runtime/debug"
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
