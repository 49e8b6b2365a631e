// Package leakgc releases allocations whose pod no longer exists in the
// API: kubelet sometimes never sends DEL (it was down, the node was
// drained the hard way). It is event-driven — a deleted pod schedules one
// check of its own allocations after a grace period — plus one pass over
// the allocations at startup for pods deleted while the agent was down.
package leakgc

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Attachment is one of the node's pod attachments, as the GC sees it.
type Attachment struct {
	ContainerID string
	Pod         podmeta.ID
	IPs         []netip.Addr
}

// Allocations is the agent side.
type Allocations interface {
	Attachments() []Attachment
	// PodAttachments is one pod's attachments.
	PodAttachments(id podmeta.ID) []Attachment
	Del(ctx context.Context, containerID string) error
}

// API tells whether a pod still exists (asked of the API server, not a
// cache, right before anything is released).
type API interface {
	Exists(ctx context.Context, id podmeta.ID) (bool, error)
}

// DefaultGrace is used when Grace is not set: without a grace, an API
// outage would turn the retries into a busy loop.
const DefaultGrace = 2 * time.Minute

// checkTimeout bounds one API question, so a hung request cannot stall
// the checks of every other pod.
const checkTimeout = 30 * time.Second

// GC schedules and runs the checks. Set the exported fields before Run or
// PodGone is first called. Run owns the schedule; PodGone only queues for
// it, so it never blocks the informer and works before Run starts.
type GC struct {
	Allocs Allocations
	API    API
	// Grace is how long a deleted pod's allocations wait for kubelet's DEL
	// (and how long to wait before asking the API again after an error);
	// 0: DefaultGrace.
	Grace time.Duration
	Log   *slog.Logger // nil: slog.Default()
	// OnCollect is called for every released allocation (a metric).
	OnCollect func()

	running atomic.Bool
	mu      sync.Mutex
	queue   []gone        // PodGone calls not yet taken by Run
	wake    chan struct{} // made on first use, so the zero GC works
}

type gone struct {
	id podmeta.ID
	at time.Time
}

// PodGone schedules a check of the pod's allocations (that incarnation's:
// id.Incarnation() counts) after the grace period, which gives kubelet
// time to send its DEL first. It may be called before Run starts.
func (g *GC) PodGone(id podmeta.ID) {
	g.mu.Lock()
	g.queue = append(g.queue, gone{id: id, at: time.Now()})
	wake := g.wakeLocked()
	g.mu.Unlock()
	select {
	case wake <- struct{}{}:
	default:
	}
}

func (g *GC) wakeLocked() chan struct{} {
	if g.wake == nil {
		g.wake = make(chan struct{}, 1)
	}
	return g.wake
}

func (g *GC) take() []gone {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := g.queue
	g.queue = nil
	return q
}

// Run sweeps every allocation once (pods deleted while the agent was down
// are found this way), then checks pods reported gone, until ctx ends.
func (g *GC) Run(ctx context.Context) error {
	if g.Allocs == nil || g.API == nil {
		return errors.New("leak GC: Allocs and API are required")
	}
	if !g.running.CompareAndSwap(false, true) {
		return errors.New("leak GC: Run called twice")
	}
	log := g.Log
	if log == nil {
		log = slog.Default()
	}
	g.mu.Lock()
	wake := g.wakeLocked()
	g.mu.Unlock()
	grace := g.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	due := map[string]gone{} // pod key → pod and when to check it
	schedule := func(id podmeta.ID, from time.Time) {
		// A later event for the same pod restarts its grace period.
		due[id.Key()] = gone{id: id, at: from.Add(grace)}
	}
	now := time.Now()
	for _, r := range g.Allocs.Attachments() {
		schedule(r.Pod, now)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop() // armed below (Go ≥ 1.23 timers: Reset leaves no stale fire)
	defer timer.Stop()
	for {
		for _, ev := range g.take() {
			schedule(ev.id, ev.at)
		}
		// Check everything due; a failed check comes back after a grace.
		now = time.Now()
		for k, d := range due {
			if ctx.Err() != nil {
				return nil
			}
			if !d.at.After(now) {
				delete(due, k)
				if !g.check(ctx, log, d.id) {
					schedule(d.id, time.Now())
				}
			}
		}
		var next time.Time
		for _, d := range due {
			if next.IsZero() || d.at.Before(next) {
				next = d.at
			}
		}
		var tc <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			tc = timer.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-tc:
		}
	}
}

// check releases the pod's allocations if the API server says that
// incarnation is gone. It reports false when it must be tried again.
func (g *GC) check(ctx context.Context, log *slog.Logger, id podmeta.ID) bool {
	var mine []Attachment
	for _, r := range g.Allocs.PodAttachments(id) {
		// Only the exact incarnation: a record of another UID (or none)
		// is not proven gone by this pod's absence. A static pod's
		// record names the mirror of its ADD, id maybe a later one.
		if r.Pod.Same(id) {
			mine = append(mine, r)
		}
	}
	if len(mine) == 0 {
		return true // kubelet's DEL came first, as it should
	}
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	exists, err := g.API.Exists(cctx, id)
	cancel()
	if err != nil {
		// Never release on doubt: try again after another grace period.
		if ctx.Err() == nil {
			log.Warn("leak GC: cannot ask the API; will retry", "pod", id, "uid", id.UID, "err", err)
		}
		return false
	}
	if exists {
		return true
	}
	ok := true
	for _, r := range mine {
		log.Warn("leak GC: releasing the allocation of a pod that no longer exists", "pod", id, "uid", id.UID, "container", r.ContainerID, "ips", r.IPs)
		if err := g.Allocs.Del(ctx, r.ContainerID); err != nil {
			log.Error("leak GC: release", "pod", id, "container", r.ContainerID, "err", err)
			ok = false
			continue
		}
		if g.OnCollect != nil {
			g.OnCollect()
		}
	}
	return ok
}
