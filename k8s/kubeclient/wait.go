package kubeclient

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/tools/cache"
)

// SyncWarnAfter is how long a wait for caches goes before it logs what
// it still waits for (and again as often after).
const SyncWarnAfter = 15 * time.Second

// Synced is a named sync check: what a wait is for, in its log.
type Synced struct {
	Name   string
	Synced cache.InformerSynced
}

// WaitLogged waits, as cache.WaitForCacheSync does, until every check is
// true or ctx ends (false). While it waits, it logs which checks are
// still false after warnAfter and every warnAfter since, so that a
// process that stays unready says what it waits for.
func WaitLogged(ctx context.Context, log *slog.Logger, what string, warnAfter time.Duration, checks ...Synced) bool {
	start := time.Now()
	warn := time.NewTicker(warnAfter)
	defer warn.Stop()
	poll := time.NewTicker(100 * time.Millisecond) // client-go's sync poll
	defer poll.Stop()
	for {
		var waiting []string
		for _, c := range checks {
			if !c.Synced() {
				waiting = append(waiting, c.Name)
			}
		}
		if len(waiting) == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-warn.C:
			log.Warn("still waiting to sync", "what", what, "for", waiting, "since", time.Since(start).Round(time.Second))
		case <-poll.C:
		}
	}
}
