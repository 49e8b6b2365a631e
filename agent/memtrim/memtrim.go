// Package memtrim hands a process's freed heap back to the kernel once a
// burst of allocation is over. Go's scavenger returns freed pages slowly,
// and a long-lived process that allocates in bursts (the agent filling a
// node with pods, flock-policy compiling a cluster's policies) keeps what
// a burst left resident for minutes.
package memtrim

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

const (
	// Every is how often memory is looked at, and Above (or a sixteenth
	// of the live heap, if more) how much garbage or freed heap is worth
	// a forced collection and handing the pages back: about once per
	// full repair on an idle loaded node, a few ms of CPU each. Left to
	// the GC's pacing and the scavenger, a loaded node's resident set
	// grew by a third of its live heap within a minute of idling. The
	// cost is bounded: at most one forced collection per natural one,
	// and none while natural ones come less than Every apart.
	Every = 5 * time.Second
	Above = 1 << 20
)

// Run collects and hands freed heap back to the kernel once a burst is
// over: every every, when no collection ran since the last look and the
// garbage or the free heap exceeds Above or a sixteenth of the live heap,
// until ctx ends. While the GC keeps running on its own, it is left to
// its pacing. While the process keeps allocating (more than that limit
// since the last look: steady churn, not a burst that ended), it only
// collects, and keeps the pages: handed back, they were faulted in again
// within seconds, and the madvise calls and the page faults were a fifth
// of flock-policy's CPU under churn.
func Run(ctx context.Context, every time.Duration, log *slog.Logger) error {
	t := time.NewTicker(every)
	defer t.Stop()
	return run(ctx, t.C, log)
}

// run looks at each tick.
func run(ctx context.Context, ticks <-chan time.Time, log *slog.Logger) error {
	t := trimmer{log: log, sample: []metrics.Sample{
		{Name: "/memory/classes/heap/free:bytes"},    // freed, not handed back
		{Name: "/memory/classes/heap/objects:bytes"}, // live and garbage
		{Name: "/gc/heap/live:bytes"},                // live at the last collection
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/gc/heap/allocs:bytes"}, // allocated, ever
	}}
	metrics.Read(t.sample)
	t.lastAllocs = t.sample[4].Value.Uint64()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
		}
		t.look()
		looked()
	}
}

type trimmer struct {
	log                    *slog.Logger
	sample                 []metrics.Sample
	lastCycles, lastAllocs uint64
}

func (t *trimmer) look() {
	metrics.Read(t.sample)
	var v [5]uint64
	for i, s := range t.sample {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	free, garbage, live, cycles := v[0], v[1]-min(v[1], v[2]), v[2], v[3]
	allocated := v[4] - min(v[4], t.lastAllocs)
	t.lastAllocs = v[4]
	busy := cycles != t.lastCycles
	t.lastCycles = cycles
	if busy {
		return
	}
	limit := max(Above, live/16)
	switch {
	case allocated > limit && garbage > limit:
		collect()
	case allocated > limit:
		return
	case free > limit || garbage > limit:
		release()
		t.log.Debug("collected and returned freed heap to the kernel", "free", free, "garbage", garbage)
	default:
		return
	}
	metrics.Read(t.sample[3:])
	t.lastCycles, t.lastAllocs = t.sample[3].Value.Uint64(), t.sample[4].Value.Uint64()
}

// collect and release are the runtime's, and looked is called after each
// look (tests count them, and wait for looks).
var (
	collect = runtime.GC
	release = debug.FreeOSMemory
	looked  = func() {}
)
