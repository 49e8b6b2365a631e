// Package leakgc releases allocations whose pod no longer exists in the
// API: kubelet sometimes never sends DEL (it was down, the node was
// drained the hard way). It is event-driven — a deleted pod schedules one
// check of its own allocations after a grace period — plus one pass over
// the allocations at startup for pods deleted while the agent was down.
package leakgc

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/agent/store"
)

// Allocations is the agent side.
type Allocations interface {
	Allocations() []store.Allocation
	// PodAllocations is one pod's allocations.
	PodAllocations(id podmeta.ID) []store.Allocation
	Del(ctx context.Context, containerID string) error
}

// API tells whether a pod still exists (asked of the API server, not a
// cache, right before anything is released).
type API interface {
	Exists(ctx context.Context, id podmeta.ID) (bool, error)
}

// GC schedules and runs the checks.
type GC struct {
	Allocs Allocations
	API    API
	Grace  time.Duration
	Log    *slog.Logger
	// OnCollect is called for every released allocation (a metric).
	OnCollect func()

	ctx     context.Context
	mu      sync.Mutex
	pending map[string]*time.Timer // pod key → scheduled check
}

// Start remembers ctx for the scheduled checks and schedules one for every
// allocation (pods deleted while the agent was down are found this way).
func (g *GC) Start(ctx context.Context) {
	g.mu.Lock()
	g.ctx = ctx
	g.pending = map[string]*time.Timer{}
	g.mu.Unlock()
	seen := map[podmeta.ID]bool{}
	for _, r := range g.Allocs.Allocations() {
		if !seen[r.Pod] {
			seen[r.Pod] = true
			g.schedule(r.Pod)
		}
	}
}

// PodGone schedules a check of the pod's allocations after the grace
// period, which gives kubelet time to send its DEL first.
func (g *GC) PodGone(id podmeta.ID) { g.schedule(id) }

func (g *GC) schedule(id podmeta.ID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ctx == nil {
		return
	}
	k := id.Key()
	if t, ok := g.pending[k]; ok {
		t.Stop()
	}
	g.pending[k] = time.AfterFunc(g.Grace, func() {
		g.mu.Lock()
		delete(g.pending, k)
		ctx := g.ctx
		g.mu.Unlock()
		g.check(ctx, id)
	})
}

// Stop cancels the scheduled checks.
func (g *GC) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, t := range g.pending {
		t.Stop()
	}
	g.pending = map[string]*time.Timer{}
	g.ctx = nil
}

func (g *GC) check(ctx context.Context, id podmeta.ID) {
	if ctx == nil || ctx.Err() != nil {
		return
	}
	mine := g.Allocs.PodAllocations(id)
	if len(mine) == 0 {
		return // kubelet's DEL came first, as it should
	}
	exists, err := g.API.Exists(ctx, id)
	if err != nil {
		// Never release on doubt: try again after another grace period.
		g.Log.Warn("leak GC: cannot ask the API; will retry", "pod", id, "err", err)
		g.schedule(id)
		return
	}
	if exists {
		return
	}
	for _, r := range mine {
		g.Log.Warn("leak GC: releasing the allocation of a pod that no longer exists", "pod", id, "uid", id.UID, "container", r.ContainerID, "ips", r.IPs)
		if err := g.Allocs.Del(ctx, r.ContainerID); err != nil {
			g.Log.Error("leak GC: release", "container", r.ContainerID, "err", err)
			g.schedule(id)
			continue
		}
		if g.OnCollect != nil {
			g.OnCollect()
		}
	}
}
