// Package reconcile drives a target — the BGP speaker's paths, the kernel's
// host routes — towards a desired set that is a pure function of the node
// state. It is level-triggered: every pass hands the target the full desired
// set and the target applies the difference, so a lost event, a failed call
// or a restart can delay convergence but never make it wrong.
//
// A pass runs on a coalesced "state changed" signal (the event path stays
// immediate), after an error (retried with exponential back-off), and as a
// periodic full repair in which the target re-reads what it really holds.
package reconcile

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Target is what a Loop drives.
type Target[D any] interface {
	// Set makes the target hold exactly desired. With full it first
	// re-reads what it really holds instead of trusting its own view.
	Set(ctx context.Context, desired D, full bool) error
}

// Status is a loop's health, for flockctl, metrics and NodeConfig status.
type Status struct {
	Target      string    `json:"target"`
	Generation  uint64    `json:"generation"` // state generation the last pass applied
	Passes      uint64    `json:"passes"`
	Errors      uint64    `json:"errors"` // failed passes since start
	Failing     bool      `json:"failing"`
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
}

// Default timings.
const (
	DefaultRepair     = 30 * time.Second
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
)

// Loop runs one target.
type Loop[D any] struct {
	Name   string // the target's label: "bgp", "kernel"
	Target Target[D]
	// Desired returns the full desired set and the state generation it was
	// derived from.
	Desired func() (D, uint64)
	// Wake is the coalesced "state changed" signal.
	Wake <-chan struct{}
	// Repair is the period of full passes (default 30 s).
	Repair                 time.Duration
	MinBackoff, MaxBackoff time.Duration
	Log                    *slog.Logger
	// Observe, if set, sees every pass (metrics).
	Observe func(target string, full bool, d time.Duration, err error)

	mu     sync.Mutex
	status Status
	// passed is closed and replaced after every pass, waking Wait.
	passed chan struct{}
	// kick asks for a pass although the state did not change (the target
	// learnt that what it holds drifted).
	kick chan struct{}
}

func (l *Loop[D]) init() {
	l.mu.Lock()
	if l.passed == nil {
		l.passed = make(chan struct{})
		l.kick = make(chan struct{}, 1)
		l.status.Target = l.Name
	}
	l.mu.Unlock()
}

// Kick asks for a pass now (coalesced).
func (l *Loop[D]) Kick() {
	l.init()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Status returns the loop's health.
func (l *Loop[D]) Status() Status {
	l.init()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status
}

// Wait returns once a pass that saw state generation gen (or a later one)
// has finished — successfully or not: a failed pass is retried by the loop,
// a caller on the event path must not hang on it — or when ctx ends.
func (l *Loop[D]) Wait(ctx context.Context, gen uint64) error {
	l.init()
	for {
		l.mu.Lock()
		done, ch := l.status.Passes > 0 && l.status.Generation >= gen, l.passed
		l.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Pass runs one pass now (the daemon's first full sync, before peers come
// up) and returns its error.
func (l *Loop[D]) Pass(ctx context.Context, full bool) error {
	l.init()
	desired, gen := l.Desired()
	start := time.Now()
	err := l.Target.Set(ctx, desired, full)
	if l.Observe != nil {
		l.Observe(l.Name, full, time.Since(start), err)
	}
	l.mu.Lock()
	l.status.Passes++
	l.status.Generation = max(l.status.Generation, gen)
	if err != nil {
		l.status.Errors++
		l.status.Failing = true
		l.status.LastError, l.status.LastErrorAt = err.Error(), time.Now()
	} else {
		l.status.Failing = false
		l.status.LastSuccess = time.Now()
	}
	close(l.passed)
	l.passed = make(chan struct{})
	l.mu.Unlock()
	return err
}

// Run reconciles until ctx ends: a full pass first, then a pass per wake,
// a retry with back-off after an error, and a full repair every Repair.
func (l *Loop[D]) Run(ctx context.Context) error {
	repair, minB, maxB := l.Repair, l.MinBackoff, l.MaxBackoff
	if repair <= 0 {
		repair = DefaultRepair
	}
	if minB <= 0 {
		minB = DefaultMinBackoff
	}
	if maxB < minB {
		maxB = max(DefaultMaxBackoff, minB)
	}
	log := l.Log
	if log == nil {
		log = slog.Default()
	}
	l.init()
	tick := time.NewTicker(repair)
	defer tick.Stop()
	retry := time.NewTimer(0)
	retry.Stop()
	defer retry.Stop()
	backoff := minB
	full := true
	for {
		if err := l.Pass(ctx, full); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			log.Error("reconcile failed; retrying", "target", l.Name, "full", full, "in", backoff, "err", err)
			retry.Reset(backoff)
			backoff = min(backoff*2, maxB)
		} else {
			retry.Stop()
			backoff = minB
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.Wake:
			full = false
		case <-l.kick:
			full = false
		case <-retry.C:
			full = false
		case <-tick.C:
			full = true
		}
	}
}
