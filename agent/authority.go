package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Authority decides whether a pod's namespace may use an address (or a
// cidr6/cidr4 range) for a use: v1alpha1.UsePod, UseAnycast or
// UseAddresses. It returns the AddressPool that allows it.
type Authority interface {
	Authorize(use string, want netip.Prefix, namespace string) (pool string, err error)
}

// Claim is one cluster-wide claim on an IP.
type Claim struct {
	IP          netip.Addr
	Use         string // v1alpha1.UsePod or UseAddresses
	Pool        string
	Pod         podmeta.ID
	ContainerID string
}

// ErrClaimed is wrapped by a Claims error when another attachment holds
// the IP (as opposed to the API being unreachable).
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

// AuthError is a value a pod asked for that no AddressPool allows it.
type AuthError struct {
	Pod podmeta.ID
	Key string // the annotation
	Err error
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("pod %s: annotation %s: %v", e.Pod, e.Key, e.Err)
}

func (e *AuthError) Unwrap() error { return e.Err }

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

// grants are the pools that authorized a pod's values.
type grants map[netip.Addr]string

// authorize checks every anycast, addresses, cidr6 and cidr4 value a pod
// asks for. A range inside one of the node's summaries needs no pool: the
// node's own addresses are open to every pod.
func (a *Agent) authorize(pod podmeta.Pod, req annotations.Request) (grants, map[netip.Prefix]string, error) {
	ips := grants{}
	ranges := map[netip.Prefix]string{}
	if a.cfg.Authority == nil {
		return ips, ranges, nil
	}
	check := func(key, use string, want netip.Prefix) (string, error) {
		pool, err := a.cfg.Authority.Authorize(use, want, pod.Namespace)
		if err != nil {
			return "", &AuthError{Pod: pod.ID, Key: key, Err: err}
		}
		return pool, nil
	}
	for _, r := range []struct {
		key string
		rng netip.Prefix
	}{{annotations.CIDR6, req.CIDR6}, {annotations.CIDR4, req.CIDR4}} {
		if !r.rng.IsValid() || a.inSummary(r.rng) {
			continue
		}
		pool, err := check(r.key, v1alpha1.UsePod, r.rng)
		if err != nil {
			return nil, nil, err
		}
		ranges[r.rng] = pool
	}
	for _, set := range []struct {
		key, use string
		ips      []netip.Addr
	}{{annotations.Anycast, v1alpha1.UseAnycast, req.Anycast}, {annotations.Addresses, v1alpha1.UseAddresses, req.Addresses}} {
		for _, ip := range set.ips {
			// The more precise reason first: a pod pool is IPAM's.
			if err := a.state.NotInPodPool(set.key, ip); err != nil {
				return nil, nil, err
			}
			pool, err := check(set.key, set.use, netip.PrefixFrom(ip, ip.BitLen()))
			if err != nil {
				return nil, nil, err
			}
			ips[ip] = pool
		}
	}
	return ips, ranges, nil
}

func (a *Agent) inSummary(p netip.Prefix) bool {
	for _, s := range a.state.Summaries() {
		if s.Bits() <= p.Bits() && s.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

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
