package bgp

import (
	"context"
	"time"

	"code.fritzlab.net/fritzlab/flock/bgp/advert"
)

// MinResync is the shortest safety-net resync period: the loop is driven
// by events, the periodic pass only repairs what an error left behind.
const MinResync = 30 * time.Second

// Reconcile keeps the speaker's paths equal to the desired set: each change
// is sent at once (changes that arrive while a sync runs are coalesced into
// the next one), and a full diff runs every resync period. observe, if set,
// sees the duration and error of every pass.
func Reconcile(ctx context.Context, set *advert.Set, sp *Speaker, resync time.Duration, observe func(full bool, d time.Duration, err error)) {
	if resync < MinResync {
		resync = MinResync
	}
	t := time.NewTicker(resync)
	defer t.Stop()
	run := func(full bool) {
		start := time.Now()
		var err error
		if full {
			err = sp.Resync(set.Desired())
		} else {
			err = sp.Sync(set.TakeDirty())
		}
		if err != nil {
			sp.log.Error("bgp: reconcile", "full", full, "err", err)
		}
		if observe != nil {
			observe(full, time.Since(start), err)
		}
	}
	run(true)
	for {
		select {
		case <-ctx.Done():
			return
		case <-set.Changed():
			run(false)
		case <-t.C:
			run(true)
		}
	}
}
