package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
)

// authority adapts an authz.Set (no namespace labels) to agent.Authority.
type authority struct{ set *authz.Set }

func (a authority) Authorize(use string, want netip.Prefix, ns string) (string, error) {
	p, err := a.set.Authorize(use, want, ns, nil)
	return p.Name, err
}

// claimStore is a cluster's worth of claims shared by several fake nodes:
// creates are atomic like the API server's; the caches (Taken) may lag.
type claimStore struct {
	mu     sync.Mutex
	claims map[netip.Addr]claimRec
	// lag hides claims younger than this many later claims from Taken,
	// as an informer that has not caught up would.
	lag  int
	seq  int
	down bool // the API is unreachable
	// hang: calls wait for their context to end (an API server that
	// accepts connections and never answers); deadlines records theirs.
	hang      bool
	deadlines []time.Duration
	// lost: creates are committed, and the caller hears an error (the
	// answer lost to a timeout or a reset connection).
	lost  bool
	calls int
	// fault, if set, may fail any call (the model test's chaos); lose,
	// if set, may lose a committed create's answer.
	fault func() bool
	lose  func() bool
}

type claimRec struct {
	agent.Claim
	node string
	seq  int
	// service, if set, holds the IP (a LoadBalancer address): no node, no
	// container.
	service string
}

// heldError is a refusal worded as the daemon's adapter words
// k8s/claims' ClaimedError: the holder's message, wrapping ErrClaimed.
type heldError string

func (e heldError) Error() string { return string(e) }
func (heldError) Unwrap() error   { return agent.ErrClaimed }

func newClaimStore() *claimStore { return &claimStore{claims: map[netip.Addr]claimRec{}} }

// node is one node's view of the store.
func (s *claimStore) node(name string) *nodeClaims { return &nodeClaims{s: s, name: name} }

type nodeClaims struct {
	s    *claimStore
	name string
}

// hung waits, if the API hangs, until ctx ends (recording its deadline).
// Called with s.mu held; returns with it held.
func (s *claimStore) hung(ctx context.Context) error {
	if !s.hang {
		return nil
	}
	dl, ok := ctx.Deadline()
	if !ok {
		s.deadlines = append(s.deadlines, -1)
		return errors.New("fake API: a call without a deadline would hang forever")
	}
	s.deadlines = append(s.deadlines, time.Until(dl))
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	return fmt.Errorf("fake API: no answer: %w", ctx.Err())
}

// call is an API call arriving (s.mu held): counted, then hung or
// refused as the store is set.
func (s *claimStore) call(ctx context.Context) error {
	s.calls++
	if err := s.hung(ctx); err != nil {
		return err
	}
	if s.down || (s.fault != nil && s.fault()) {
		return errors.New("fake API: connection refused")
	}
	return nil
}

func (n *nodeClaims) Claim(ctx context.Context, c agent.Claim) error {
	s := n.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call(ctx); err != nil {
		return err
	}
	if h, ok := s.claims[c.IP]; ok {
		if h.service != "" {
			return heldError(fmt.Sprintf("%s is claimed by Service %s", c.IP, h.service))
		}
		if h.ContainerID == c.ContainerID && h.node == n.name {
			return nil
		}
		return fmt.Errorf("%w: %s is claimed by pod %s on node %s, container %s", agent.ErrClaimed, c.IP, h.Pod, h.node, h.ContainerID)
	}
	s.seq++
	s.claims[c.IP] = claimRec{Claim: c, node: n.name, seq: s.seq}
	if s.lost || (s.lose != nil && s.lose()) {
		return errors.New("fake API: connection reset after the create was sent")
	}
	return nil
}

func (n *nodeClaims) Release(ctx context.Context, ip netip.Addr, containerID string) error {
	s := n.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call(ctx); err != nil {
		return err
	}
	if h, ok := s.claims[ip]; ok && h.ContainerID == containerID && h.node == n.name {
		delete(s.claims, ip)
	}
	return nil
}

func (n *nodeClaims) Taken(ip netip.Addr) bool {
	s := n.s
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.claims[ip]
	return ok && s.seq-h.seq >= s.lag
}

func (n *nodeClaims) Node() []agent.Claim {
	s := n.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []agent.Claim
	for _, h := range s.claims {
		if h.node == n.name {
			out = append(out, h.Claim)
		}
	}
	return out
}

// gc is the claim GC's rule for node's claims: one of an IP that the
// node's agent does not hold for its container is deleted
// (k8s/claims.GC, after its grace).
func (s *claimStore) gc(node string, holds func(containerID string, ip netip.Addr) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ip, h := range s.claims {
		if h.node == node && !holds(h.ContainerID, ip) {
			delete(s.claims, ip)
		}
	}
}

// holdForService claims ip for a Service, as the LoadBalancer assigner
// does (k8s/claims.ClaimService).
func (s *claimStore) holdForService(ip netip.Addr, svc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.claims[ip] = claimRec{Claim: agent.Claim{IP: ip, Use: "loadBalancer"}, seq: s.seq, service: svc}
}

// drop deletes a claim behind the agent's back (kubectl delete).
func (s *claimStore) drop(ip netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.claims, ip)
}

// pools maps every claimed IP to its claim's pool.
func (s *claimStore) pools() map[netip.Addr]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[netip.Addr]string{}
	for ip, h := range s.claims {
		out[ip] = h.Pool
	}
	return out
}

func (s *claimStore) holders() map[netip.Addr]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[netip.Addr]string{}
	for ip, h := range s.claims {
		out[ip] = h.node + "/" + h.ContainerID
		if h.service != "" {
			out[ip] = "Service " + h.service
		}
	}
	return out
}

func (s *claimStore) set(f func(s *claimStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}
