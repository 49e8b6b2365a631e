package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// ensureClaims makes the cluster-wide claims match the committed
// allocations: a claim that
// is missing (lost in a crash, deleted by hand while its pod runs) is
// taken again, with the pool that allows it now; one another pod took
// meanwhile quarantines the allocation — routed and advertised nowhere,
// and said so — rather than letting two pods answer on one IP. An API
// error leaves it to the next repair.
func (a *Agent) ensureClaims(ctx context.Context) {
	if a.cfg.Claims == nil {
		return
	}
	held := map[netip.Addr]string{}
	for _, c := range a.cfg.Claims.Node() {
		held[c.IP] = c.ContainerID
	}
	for _, r := range a.state.Committed() {
		var missing []Claim
		for _, c := range a.claimsNow(r) {
			if held[c.IP] != r.ContainerID {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			a.reclaim(ctx, r.ContainerID, missing)
		}
	}
}

// reclaim takes an allocation's missing claims again, under its lock.
func (a *Agent) reclaim(ctx context.Context, id string, cs []Claim) {
	unlock := a.locks.Lock(id)
	defer unlock()
	if _, phase, ok := a.state.Get(id); !ok || phase != nodestate.Committed {
		return // deleted meanwhile
	}
	for _, c := range cs {
		err := a.cfg.Claims.Claim(ctx, c)
		switch {
		case err == nil:
			a.log.Info("cluster-wide claim taken again (it was missing from the API)", "container", id, "pod", c.Pod, "ip", c.IP, "pool", c.Pool)
		case errors.Is(err, ErrClaimed):
			a.log.Error("quarantined allocation: another pod holds its address cluster-wide", "container", id, "pod", c.Pod, "ip", c.IP, "err", err)
			a.state.MarkStuck(id, fmt.Sprintf("claim of %s: %v", c.IP, err))
			return
		default:
			a.log.Warn("cannot check a cluster-wide claim; the next repair tries again", "container", id, "ip", c.IP, "err", err)
		}
	}
}

// releaseUnowned gives back this node's claims that no attachment holds:
// a crash between the claim and the record, a create whose answer was
// lost (by an ADD the runtime then retried with other IPs) and whose
// release failed. An ADD in flight holds its IPs before it claims them.
func (a *Agent) releaseUnowned(ctx context.Context) {
	if a.cfg.Claims == nil {
		return
	}
	for _, c := range a.cfg.Claims.Node() {
		if a.state.Holds(c.ContainerID, c.IP) {
			continue
		}
		a.log.Warn("releasing a cluster-wide claim no allocation owns", "ip", c.IP, "container", c.ContainerID, "pod", c.Pod)
		a.releaseClaims(ctx, []Claim{c})
	}
}

// claimsNow are an allocation's claims with the pools that allow them
// now (a restored record does not say which pool granted an IP).
func (a *Agent) claimsNow(r store.Allocation) []Claim {
	ips, ranges := grants{}, map[netip.Prefix]string{}
	if a.cfg.Authority != nil {
		for _, ip := range r.IPs {
			p := netip.PrefixFrom(ip, ip.BitLen())
			if a.inSummary(p) {
				continue
			}
			if pool, err := a.cfg.Authority.Authorize(v1alpha1.UsePod, p, r.Pod.Namespace); err == nil {
				ranges[p] = pool
			}
		}
		for _, ip := range r.Addresses {
			if pool, err := a.cfg.Authority.Authorize(v1alpha1.UseAddresses, netip.PrefixFrom(ip, ip.BitLen()), r.Pod.Namespace); err == nil {
				ips[ip] = pool
			}
		}
	}
	return a.claimsOf(r, ips, ranges)
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
