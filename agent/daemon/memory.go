package daemon

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// The agent's heap is mostly long-lived (GoBGP's tables, the node state),
// and it allocates in bursts (a node filling with pods, a full repair).
// Go's defaults suit the opposite: the heap may grow to twice what is live
// before a collection, and what a burst freed goes back to the kernel only
// slowly. Both cost resident memory and buy little here.
const (
	// gcPercent is GOGC unless the environment sets it: the heap may grow
	// by half of what is live before a collection.
	gcPercent = 50
	// trimEvery is how often idle memory is looked at, and trimAbove how
	// much freed heap is worth handing back (a forced collection costs a
	// few ms of CPU on a loaded node).
	trimEvery = 30 * time.Second
	trimAbove = 8 << 20
)

// tuneGC applies gcPercent unless GOGC is set.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}

// trimMemory hands freed heap back to the kernel after a burst, until ctx
// ends.
func trimMemory(ctx context.Context, log *slog.Logger) error {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			continue
		}
		if free := sample[0].Value.Uint64(); free > trimAbove {
			debug.FreeOSMemory()
			log.Debug("returned freed heap to the kernel", "bytes", free)
		}
	}
}
