package agent_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// A claim create that the API server commits while the agent hears an
// error fails the ADD — and the claim goes with it: the ADD gives back
// the claim it may have made. If the API cannot answer the release
// either, the node holds nothing of the container, which is the claim
// GC's signal to delete it.
func TestAmbiguousClaimCreateLeavesNoClaim(t *testing.T) {
	for _, releaseFails := range []bool{false, true} {
		name := "release works"
		if releaseFails {
			name = "release fails too"
		}
		t.Run(name, func(t *testing.T) {
			cs := newClaimStore()
			e := authorized(t, cs.node("node-a"))
			cs.set(func(s *claimStore) {
				s.lose = func() bool {
					s.down = releaseFails // the API goes away with the answer (called under s.mu)
					return true
				}
			})
			_, err := e.addIn("prod", "amb", annotations.Addresses+"=2001:db8:aa::1")
			if err == nil || !strings.Contains(err.Error(), "2001:db8:aa::1") {
				t.Fatalf("ADD: %v, want an error naming the address", err)
			}
			e.wantNothingFor("amb")
			holders := cs.holders()
			if releaseFails {
				if holders[mustAddr("2001:db8:aa::1")] != "node-a/amb" {
					t.Fatalf("claims %v: the fake should have kept the unreleased claim", holders)
				}
				// What the claim GC does with it: the container is not live.
				cs.gc("node-a", e.state.Holds)
				holders = cs.holders()
			}
			if len(holders) != 0 {
				t.Errorf("claims after the failed ADD: %v, want none", holders)
			}
		})
	}
}

// With the API server hung, DEL finishes locally: the release of its
// claims is bounded (well under the runtime's patience), and what it
// could not release is the claim GC's.
func TestDelWithAPIServerHung(t *testing.T) {
	cs := newClaimStore()
	e := authorized(t, cs.node("node-a"))
	if _, err := e.addIn("prod", "d1", annotations.Addresses+"=2001:db8:aa::1"); err != nil {
		t.Fatal(err)
	}
	cs.set(func(s *claimStore) { s.hang = true })
	if err := e.a.Del(context.Background(), "d1"); err != nil {
		t.Fatalf("DEL with the API server hung: %v", err)
	}
	e.a.Wait()
	e.wantNothingFor("d1")
	cs.set(func(s *claimStore) {
		if len(s.deadlines) == 0 {
			t.Fatal("DEL did not try to release the claim")
		}
		for _, d := range s.deadlines {
			if d < 0 || d > 5*time.Second {
				t.Errorf("a release waited on a deadline %v away (want ≤ 5 s)", d)
			}
		}
		s.hang = false
	})
	cs.gc("node-a", e.state.Holds)
	if h := cs.holders(); len(h) != 0 {
		t.Errorf("claims %v left after the GC", h)
	}
}

// hangingSource never answers a lookup: an API server that stalls.
type hangingSource struct{ calls atomic.Int32 }

func (h *hangingSource) Lookup(ctx context.Context, _ podmeta.Args) (podmeta.Pod, error) {
	h.calls.Add(1)
	<-ctx.Done()
	return podmeta.Pod{}, ctx.Err()
}

// Every ADD ends within AddTimeout whatever stalls — the pod lookup, the
// claims, another operation holding the container — with an error that
// says so, and leaves nothing behind.
func TestAddDeadline(t *testing.T) {
	const timeout = 200 * time.Millisecond
	wantTimeout := func(t *testing.T, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "did not finish within") {
			t.Fatalf("ADD: %v, want the deadline named", err)
		}
		if c := cniCode(t, err); c != types.ErrTryAgainLater {
			t.Errorf("CNI code %d, want %d (try again later)", c, types.ErrTryAgainLater)
		}
	}
	t.Run("pod lookup stalls", func(t *testing.T) {
		src := &hangingSource{}
		e := started(t, func(c *envConfig) { c.Source = src; c.AddTimeout = timeout })
		_, err := e.add("a1")
		wantTimeout(t, err)
		if src.calls.Load() != 1 {
			t.Errorf("lookups %d, want 1", src.calls.Load())
		}
		e.wantNothingFor("a1")
		e.wantUsed(pool6, 0)
	})
	t.Run("claim stalls", func(t *testing.T) {
		cs := newClaimStore()
		e := authorized(t, cs.node("node-a"), func(c *envConfig) { c.AddTimeout = timeout })
		cs.set(func(s *claimStore) { s.hang = true })
		_, err := e.addIn("prod", "a2", annotations.Addresses+"=2001:db8:aa::1")
		wantTimeout(t, err)
		cs.set(func(s *claimStore) { s.hang = false })
		e.wantNothingFor("a2")
		cs.gc("node-a", e.state.Holds)
		if h := cs.holders(); len(h) != 0 {
			t.Errorf("claims %v", h)
		}
	})
	t.Run("another operation holds the container", func(t *testing.T) {
		release := make(chan struct{})
		inCommit := make(chan struct{})
		e := started(t, func(c *envConfig) {
			c.AddTimeout = timeout
			c.Hooks.BeforeCommit = func(string) {
				select {
				case inCommit <- struct{}{}:
					<-release
				default:
				}
			}
		})
		first := make(chan error, 1)
		go func() {
			_, err := e.a.Add(context.Background(), "a3", netnsOf("a3"), "eth0", podArgs("default", "pod-a3"))
			first <- err
		}()
		<-inCommit
		_, err := e.a.Add(context.Background(), "a3", netnsOf("a3"), "eth0", podArgs("default", "pod-a3"))
		wantTimeout(t, err)
		close(release)
		if err := <-first; err != nil {
			// The first ADD outlived its own deadline while held: it is
			// rolled back and reports that.
			wantTimeout(t, err)
			e.wantNothingFor("a3")
		}
	})
}

// A reap that fails (netlink busy) is retried with back-off until it
// succeeds, and every failure is counted.
func TestFailedReapIsRetried(t *testing.T) {
	var failures atomic.Int32
	e := started(t, func(c *envConfig) {
		c.ReapInterval = time.Hour // only the retries can do it
		c.ReapFailed = func() { failures.Add(1) }
	})
	rec := e.mustAdd("r1")
	var attempts atomic.Int32
	e.dp.set(func(d *fakeDP) {
		d.goneNetns[rec.Netns] = true
		d.onTeardown = func(string) { attempts.Add(1) }
		d.teardownErr = errors.New("netlink: device or resource busy")
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e.a.VethGone(rec.HostVeth) // the link watch saw it go
	testutil.WaitFor(t, "the first reap failed", func() bool { return failures.Load() >= 1 })
	if _, phase, ok := e.state.Get("r1"); !ok || phase == nodestate.Committed {
		t.Fatalf("after a failed reap: phase %v (known %v), want it out of the routes", phase, ok)
	}
	e.dp.set(func(d *fakeDP) { d.teardownErr = nil })
	testutil.WaitFor(t, "the retry reaped it", func() bool { _, _, ok := e.state.Get("r1"); return !ok })
	e.wantNothingFor("r1")
	if n := failures.Load(); n < 1 || int(n) >= int(attempts.Load()) {
		t.Errorf("%d failures counted in %d attempts: want every failure counted and a success after", n, attempts.Load())
	}
}

// A claim deleted by hand while its pod runs is claimed again at once
// (the informer's delete event) and by every repair, with the pool that
// allows it; a restored record's claims name their pool too.
func TestClaimDeletedByHandIsRecreated(t *testing.T) {
	cs := newClaimStore()
	e := authorized(t, cs.node("node-a"), func(c *envConfig) { c.ReapInterval = time.Hour })
	if _, err := e.addIn("prod", "c1", annotations.Addresses+"=2001:db8:aa::1", annotations.CIDR6+"="+clusterPods6.String()); err != nil {
		t.Fatal(err)
	}
	want := cs.pools()
	if len(want) != 2 {
		t.Fatalf("claims %v, want the address and the pod IP", want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	cs.drop(mustAddr("2001:db8:aa::1"))
	e.a.ClaimsChanged()
	testutil.WaitFor(t, "the claim is back", func() bool { return len(cs.pools()) == 2 })
	if got := cs.pools(); got[mustAddr("2001:db8:aa::1")] != "public" {
		t.Errorf("re-created claim's pool %q, want public", got[mustAddr("2001:db8:aa::1")])
	}

	for ip := range want {
		cs.drop(ip)
	}
	e.a.Repair(context.Background())
	if got := cs.pools(); len(got) != 2 || got[mustAddr("2001:db8:aa::1")] != "public" || !slicesHasValue(got, "pods") {
		t.Errorf("claims after the repair %v, want both again with their pools", got)
	}

	// A claim another pod took meanwhile: the allocation is routed nowhere.
	cs.drop(mustAddr("2001:db8:aa::1"))
	_ = cs.node("node-b").Claim(ctx, agent.Claim{IP: mustAddr("2001:db8:aa::1"), Use: "addresses", Pod: podID("thief"), ContainerID: "thief"})
	e.a.Repair(context.Background())
	if _, phase, _ := e.state.Get("c1"); phase != nodestate.Stuck {
		t.Errorf("allocation whose address another pod took: %v, want stuck", phase)
	}
}

func slicesHasValue(m map[netip.Addr]string, v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}
