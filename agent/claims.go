package agent

// Cluster-wide claims: the IPs of an attachment that must be unique across
// the cluster (its `addresses` IPs, its pod addresses outside the node's
// summaries) are claimed before the kernel is touched, given back on DEL,
// and kept matching the attachments by the repair.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Claim is one cluster-wide claim on an IP.
type Claim struct {
	IP          netip.Addr
	Use         string // v1alpha1.UsePod or UseAddresses
	Pool        string
	Pod         podmeta.ID
	ContainerID string
}

// ErrClaimed is wrapped by a Claims error when another attachment holds
// the IP, or a Service does (its LoadBalancer address), as opposed to the
// API being unreachable.
var ErrClaimed = errors.New("claimed by another pod")

// Claims makes IPs that are not node-local unique across the cluster (in
// Kubernetes mode through the API server; nil in standalone mode, where
// uniqueness is per node and the node state gives it).
type Claims interface {
	// Claim takes ip for the attachment, or fails naming the holder (an
	// error wrapping ErrClaimed); a claim the same container already
	// holds is fine.
	Claim(ctx context.Context, c Claim) error
	// Release gives up the attachment's claim (not someone else's).
	Release(ctx context.Context, ip netip.Addr, containerID string) error
	// Taken tells whether another attachment (on any node) holds ip. It
	// is called under the node state's lock: it must answer from a cache,
	// never block on the API or call back into the agent.
	Taken(ip netip.Addr) bool
	// Node lists the claims held by this node's attachments.
	Node() []Claim
}

// ClaimError is an IP another attachment holds cluster-wide.
type ClaimError struct {
	Pod podmeta.ID
	Key string
	IP  netip.Addr
	Use string
	Err error
}

func (e *ClaimError) Error() string {
	msg := e.Err.Error()
	if !strings.Contains(msg, e.IP.String()) {
		msg = e.IP.String() + ": " + msg
	}
	return fmt.Sprintf("pod %s: annotation %s: %s", e.Pod, e.Key, msg)
}

func (e *ClaimError) Unwrap() error { return e.Err }

// claimsOf are the IPs of an allocation that must be unique cluster-wide:
// its `addresses` IPs and its pod addresses outside the node's summaries.
// Anycast is shared by design.
func (a *Agent) claimsOf(r store.Allocation, pools grants, ranges map[netip.Prefix]string) []Claim {
	var out []Claim
	for _, ip := range r.IPs {
		if a.inSummary(netip.PrefixFrom(ip, ip.BitLen())) {
			continue
		}
		c := Claim{IP: ip, Use: v1alpha1.UsePod, Pod: r.Pod, ContainerID: r.ContainerID}
		for rng, pool := range ranges {
			if rng.Contains(ip) {
				c.Pool = pool
			}
		}
		out = append(out, c)
	}
	for _, ip := range r.Addresses {
		out = append(out, Claim{IP: ip, Use: v1alpha1.UseAddresses, Pool: pools[ip], Pod: r.Pod, ContainerID: r.ContainerID})
	}
	return out
}

// claim takes every claim of an allocation, all or nothing. On failure it
// gives back what it took — the failed claim too, unless another pod
// holds it: a create whose answer was lost (a timeout, a reset
// connection) may have been committed by the API server — and returns
// what it could not give back.
func (a *Agent) claim(ctx context.Context, cs []Claim) (leftover []Claim, err error) {
	var done []Claim
	for _, c := range cs {
		if err := a.cfg.Claims.Claim(ctx, c); err != nil {
			if !errors.Is(err, ErrClaimed) {
				done = append(done, c)
			}
			leftover = a.releaseClaims(ctx, done)
			key := annotations.CIDR6
			switch {
			case c.Use == v1alpha1.UseAddresses:
				key = annotations.Addresses
			case c.IP.Is4():
				key = annotations.CIDR4
			}
			return leftover, &ClaimError{Pod: c.Pod, Key: key, IP: c.IP, Use: c.Use, Err: err}
		}
		done = append(done, c)
	}
	return nil, nil
}

// claimReleaseTimeout bounds giving claims back. A release that fails
// (the API server down or slow) never holds up DEL or a rollback: the
// node's state no longer names the container, so the claim GC deletes the
// claim once it is older than its grace.
const claimReleaseTimeout = 2 * time.Second

// releaseClaims gives claims back, bounded, and returns those it could
// not (logged; the claim GC reclaims them).
func (a *Agent) releaseClaims(ctx context.Context, cs []Claim) (failed []Claim) {
	if a.cfg.Claims == nil || len(cs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimReleaseTimeout)
	defer cancel()
	for _, c := range cs {
		if err := a.cfg.Claims.Release(ctx, c.IP, c.ContainerID); err != nil {
			a.log.Warn("cluster-wide claim not released; the claim GC deletes it once the container is gone", "ip", c.IP, "container", c.ContainerID, "pod", c.Pod, "err", err)
			failed = append(failed, c)
		}
	}
	return failed
}

// ensureClaims makes the cluster-wide claims match the committed
// allocations: a claim that is missing (lost in a crash, deleted by hand
// while its pod runs) is taken again, with the pool that allows it now; one another pod took
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
