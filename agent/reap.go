package agent

import (
	"context"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
)

// Run is the periodic repair of pod attachments (Repair, every
// ReapInterval), reaps a vanished veth's owner at once, and retries a
// failed reap with back-off until it succeeds.
func (a *Agent) Run(ctx context.Context) error {
	t := time.NewTicker(a.cfg.ReapInterval)
	defer t.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			a.Repair(ctx)
		case id := <-a.suspects:
			a.reapOne(ctx, id)
		case <-retry.C:
			for _, id := range a.retries.due(time.Now()) {
				a.reapOne(ctx, id)
			}
		case <-a.claimsChanged:
			a.ensureClaims(ctx)
		}
		if next, ok := a.retries.next(); ok {
			retry.Reset(time.Until(next))
		}
	}
}

// Repair reaps every attachment whose network namespace is gone and makes
// the cluster-wide claims match the attachments: a claim deleted by hand
// while its pod runs is claimed again, one no attachment holds is given
// back.
func (a *Agent) Repair(ctx context.Context) {
	a.ReapGone(ctx)
	a.ensureClaims(ctx)
	a.releaseUnowned(ctx)
}

// VethGone reports a host veth that vanished without a DEL: if its owner's
// network namespace is gone too, Run reaps it now rather than at the next
// repair. (A full queue is fine: the repair finds it.)
func (a *Agent) VethGone(name string) {
	id, ok := a.state.VethOwner(name)
	if !ok {
		return
	}
	select {
	case a.suspects <- id:
	default:
	}
}

// ClaimsChanged reports that a cluster-wide claim of this node left the
// API: Run claims again, at once rather than at the next repair, what the
// committed allocations still need.
func (a *Agent) ClaimsChanged() {
	select {
	case a.claimsChanged <- struct{}{}:
	default:
	}
}

// ReapGone reaps every attachment whose netns is gone: committed ones,
// and those a failed DEL or reap left deleting or stuck.
func (a *Agent) ReapGone(ctx context.Context) {
	for _, r := range a.state.Attachments(nodestate.Committed, nodestate.Deleting, nodestate.Stuck) {
		if gone, err := a.netnsGone(r.Allocation); err != nil || !gone {
			continue
		}
		a.reapOne(ctx, r.ContainerID)
	}
}

// reapOne reaps one attachment if its netns is gone; a failure is
// counted, logged and retried with back-off (Run).
func (a *Agent) reapOne(ctx context.Context, id string) {
	err := a.reap(ctx, id)
	if err == nil {
		a.retries.done(id)
		return
	}
	n, wait := a.retries.failed(id, time.Now(), a.cfg.ReapInterval)
	if a.cfg.ReapFailed != nil {
		a.cfg.ReapFailed()
	}
	a.log.Error("reap failed; retrying", "container", id, "attempt", n, "retry-in", wait, "err", err)
}

func (a *Agent) reap(ctx context.Context, id string) error {
	unlock := a.locks.Lock(id)
	defer unlock()
	r, phase, ok := a.state.Get(id)
	if !ok || phase == nodestate.Pending {
		return nil // a DEL came first, or an ADD is running
	}
	if gone, err := a.netnsGone(r); err != nil || !gone {
		return err
	}
	a.log.Warn("reaping allocation whose network namespace is gone", "container", id, "pod", r.Pod, "netns", r.Netns, "ips", r.IPs, "phase", phase)
	var err error
	if phase == nodestate.Stuck {
		err = a.teardown(r)
	} else {
		err = a.remove(ctx, r)
	}
	if err != nil {
		return err
	}
	a.reaped(ReapNetnsGone)
	return nil
}

// backoffs are the failed reaps waiting for another try: 1 s after the
// first failure, doubling up to the repair interval.
type backoffs struct {
	mu sync.Mutex
	m  map[string]*backoff
}

type backoff struct {
	n    int
	next time.Time
}

const firstRetry = time.Second

// failed records a failure of id and tells how many in a row and when the
// next try is.
func (b *backoffs) failed(id string, now time.Time, ceiling time.Duration) (int, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*backoff{}
	}
	e := b.m[id]
	if e == nil {
		e = &backoff{}
		b.m[id] = e
	}
	e.n++
	wait := firstRetry << min(e.n-1, 20)
	if wait > ceiling {
		wait = ceiling
	}
	e.next = now.Add(wait)
	return e.n, wait
}

func (b *backoffs) done(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, id)
}

// due returns the IDs whose retry time has come.
func (b *backoffs) due(now time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id, e := range b.m {
		if !e.next.After(now) {
			out = append(out, id)
		}
	}
	return out
}

// next is the earliest retry time.
func (b *backoffs) next() (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var t time.Time
	for _, e := range b.m {
		if t.IsZero() || e.next.Before(t) {
			t = e.next
		}
	}
	return t, !t.IsZero()
}
