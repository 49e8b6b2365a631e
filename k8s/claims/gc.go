package claims

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// DefaultGrace is the GC's grace when none is set.
const DefaultGrace = 2 * time.Minute

// checkTimeout bounds one API question of the GC, so a hung request cannot
// stall the round.
const checkTimeout = 30 * time.Second

// GC deletes the claims nobody released:
//
//   - this node's claims of an IP that the agent does not hold for that
//     container (not Holds) — the agent crashed between claim and commit,
//     a create whose answer was lost, a release the API server did not
//     answer. The agent is the only writer of its node's claims and holds
//     an attachment's IPs from before it claims them until after it
//     released them, so such a claim is garbage even while its pod exists
//     (a pod whose ADD failed retries with a new sandbox or other IPs, or
//     runs on another node now);
//   - other nodes' claims whose Node object no longer exists and whose pod
//     is gone — the node was removed with its agent. With Peers set, one
//     agent a round asks about each other node, not every agent.
//
// Never a Service's claim (use loadBalancer, a LoadBalancer address): the
// leader-elected assigner that created it owns it and alone deletes it;
// it names no pod, container or node to judge it by.
//
// Only claims older than Grace are considered (a claim that exists but
// whose pod is gone is reclaimed after the grace, not at once): a fresh
// claim may belong to an ADD still in flight. Age is the claim's
// creationTimestamp; a claim without one (never from a real API server)
// ages from when the GC first saw it. Nothing is deleted on doubt: an API
// error, or a claim that changed since it was read (the delete carries UID
// and resourceVersion preconditions), waits for the next round.
//
// Set the fields before Run; Claims, Holds, Pods and Nodes are required.
type GC struct {
	Claims *Claims
	// Holds reports whether the agent holds ip for the container (in any
	// phase). Called from Run's goroutine.
	Holds func(containerID string, ip netip.Addr) bool
	// Pods reports whether the pod (that UID) still exists in the API
	// (asked of the API server, not a cache); pods.Source.Exists fits.
	Pods func(ctx context.Context, id podmeta.ID) (bool, error)
	// Nodes reports whether the Node object exists in the API.
	Nodes func(ctx context.Context, name string) (bool, error)
	// Peers names the nodes whose agents run this GC (every NodeConfig,
	// as the agent's cache has them). Set, the question whether another
	// node still exists (and, if not, whether its pods do) is asked each
	// round by one of them: the one a hash of the node and the round's
	// number picks among the others, so every agent picks the same and
	// the pick moves on every round (a pick with no agent left, a
	// NodeConfig that outlived its node, only delays it a round). Every
	// agent asking every round was N×N/round GETs on a cluster of N
	// nodes with pod claims everywhere. A NodeConfig is no proof that its
	// Node exists (neither a rendered nor a hand-made one goes with it),
	// so it never stands in for the answer. Nil: every agent asks.
	Peers func() []string
	// PeersSynced tells whether Peers names every such node yet (nil:
	// always). Until it does, other nodes' claims wait for a later round:
	// an agent serves before every NodeConfig is listed, and with Peers
	// short it would ask about every other node itself.
	PeersSynced func() bool
	// Grace is the minimum age of a collected claim; the GC runs every
	// Grace/2. 0: DefaultGrace.
	Grace time.Duration
	Log   *slog.Logger // nil: slog.Default()
	// OnCollect is called for every claim deleted (a metric).
	OnCollect func()

	now     func() time.Time // nil: time.Now; tests set it
	running atomic.Bool
}

func (g *GC) clock() time.Time {
	if g.now != nil {
		return g.now()
	}
	return time.Now()
}

// Run sweeps once, then every Grace/2 until ctx ends, and returns nil
// then. Start it once the claims' informer has synced.
func (g *GC) Run(ctx context.Context) error {
	if g.Claims == nil || g.Holds == nil || g.Pods == nil || g.Nodes == nil {
		return errors.New("address claim GC: Claims, Holds, Pods and Nodes are required")
	}
	if !g.running.CompareAndSwap(false, true) {
		return errors.New("address claim GC: Run called twice")
	}
	log := g.Log
	if log == nil {
		log = slog.Default()
	}
	grace := g.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	seen := map[string]time.Time{}
	tick := time.NewTicker(grace / 2)
	defer tick.Stop()
	for {
		g.sweep(ctx, log, grace, seen)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// sweep is one round. seen holds, across rounds, when the GC first saw each
// claim that has no creationTimestamp.
func (g *GC) sweep(ctx context.Context, log *slog.Logger, grace time.Duration, seen map[string]time.Time) {
	now := g.clock()
	node := g.Claims.node
	asks := func(string) bool { return false } // Peers not synced: no other node this round
	if g.PeersSynced == nil || g.PeersSynced() {
		asks = g.asker(now, grace/2)
	}
	present := map[string]bool{}
	nodeExists := map[string]bool{} // this round's answers
	nodeFailed := map[string]bool{} // this round's errors: skip that node's claims
	for _, u := range g.Claims.all() {
		if ctx.Err() != nil {
			return
		}
		name := u.GetName()
		present[name] = true
		cl, err := ClaimOf(u)
		if err != nil {
			log.Warn("address claim GC: claim does not convert; leaving it", "claim", name, "err", err)
			continue
		}
		if cl.isService() {
			continue // the assigner's
		}
		created := cl.Created
		if created.IsZero() {
			if _, ok := seen[name]; !ok {
				seen[name] = now
			}
			created = seen[name]
		}
		if now.Sub(created) < grace {
			continue
		}
		mine := cl.Node == node
		switch {
		case mine:
			if g.Holds(cl.ContainerID, cl.IP) {
				continue
			}
			g.delete(ctx, log, u, cl, now.Sub(created), "its container does not hold it on this node")
			continue
		case cl.Node == "" || nodeFailed[cl.Node] || !asks(cl.Node):
			continue
		default:
			exists, asked := nodeExists[cl.Node]
			if !asked {
				cctx, cancel := context.WithTimeout(ctx, checkTimeout)
				exists, err = g.Nodes(cctx, cl.Node)
				cancel()
				if err != nil {
					if ctx.Err() == nil {
						log.Warn("address claim GC: cannot ask the API for a node; will retry", "node", cl.Node, "err", err)
					}
					nodeFailed[cl.Node] = true
					continue
				}
				nodeExists[cl.Node] = exists
			}
			if exists {
				continue
			}
		}
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		podExists, err := g.Pods(cctx, cl.Pod)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("address claim GC: cannot ask the API for a pod; will retry", "claim", name, "pod", cl.Pod, "uid", cl.Pod.UID, "err", err)
			}
			continue
		}
		if podExists {
			continue
		}
		g.delete(ctx, log, u, cl, now.Sub(created), "its pod and its node are gone")
	}
	for name := range seen {
		if !present[name] {
			delete(seen, name)
		}
	}
}

// asker tells whether this agent asks about holder's claims in the round
// of now (rounds are period long, counted from the Unix epoch, so agents
// agree without talking): see Peers.
func (g *GC) asker(now time.Time, period time.Duration) func(holder string) bool {
	if g.Peers == nil || period <= 0 {
		return func(string) bool { return true }
	}
	peers := slices.Compact(slices.Sorted(slices.Values(g.Peers())))
	round := uint64(now.UnixNano() / int64(period))
	me := g.Claims.node
	return func(holder string) bool {
		at, in := slices.BinarySearch(peers, holder)
		others := len(peers)
		if in {
			others-- // it would not ask about itself: its claims are its own
		}
		if others <= 0 {
			return true
		}
		h := fnv.New64a()
		_, _ = fmt.Fprintf(h, "%s/%d", holder, round)
		i := int(h.Sum64() % uint64(others))
		if in && i >= at {
			i++
		}
		return peers[i] == me
	}
}

// delete deletes a claim the sweep found to be garbage, if it is still the
// version it read, and tells whether it did.
func (g *GC) delete(ctx context.Context, log *slog.Logger, u *unstructured.Unstructured, cl Claim, age time.Duration, why string) bool {
	name := u.GetName()
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	err := g.Claims.deleteExact(cctx, u)
	cancel()
	switch {
	case err == nil:
	case apierrors.IsNotFound(err):
		return false // released meanwhile
	case apierrors.IsConflict(err):
		log.Info("address claim GC: claim changed since it was read; will look again", "claim", name, "ip", cl.IP)
		return false
	default:
		if ctx.Err() == nil {
			log.Error("address claim GC: delete", "claim", name, "ip", cl.IP, "err", err)
		}
		return false
	}
	log.Warn("address claim GC: deleted a claim nobody released: "+why, "ip", cl.IP, "claim", name,
		"pod", cl.Pod, "uid", cl.Pod.UID, "node", cl.Node, "container", shortID(cl.ContainerID), "pool", cl.Pool, "age", age.Round(time.Second))
	if g.OnCollect != nil {
		g.OnCollect()
	}
	return true
}
