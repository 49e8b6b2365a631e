package relay

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// TestRandomizedNodesFollowRelays interleaves pod changes from many
// goroutines with faults (connections cut, a relay that lists again and
// starts over, relays too short of history for a watcher, relays that
// come and go) and checks at quiescent points that every node's cache is
// the upstream's pods as trim keeps them: no pod missing, none deleted
// held, none stale. FLOCK_SEED replays a run.
func TestRandomizedNodesFollowRelays(t *testing.T) {
	seed := uint64(testutil.Seed(t))
	rng := rand.New(rand.NewPCG(seed, 1))
	up := newUpstream()
	api := fake.NewClientset()
	relays := map[string]*relayUnderTest{}
	caches := map[string]*Cache{}
	start := func(name string, history int) {
		c := NewCache(history)
		if err := up.attach(c); err != nil {
			t.Fatal(err)
		}
		caches[name] = c
		relays[name] = startRelay(t, c)
	}
	stop := func(name string) {
		relays[name].relay.Stop()
		relays[name].srv.CloseClientConnections()
		relays[name].srv.Close()
		up.detach(caches[name])
		delete(relays, name)
		delete(caches, name)
	}
	start("relay-a", 4096)
	start("relay-b", 4096)
	publish(t, api, relays)
	var nodes []*node
	for i := range 3 {
		n := newNamedNode(t, api, testToken, false, fmt.Sprintf("node-%d", i))
		nodes = append(nodes, n)
	}
	const keys = 40
	short := "" // a relay of short history lives one round
	for round := range 12 {
		if short != "" && len(relays) > 2 {
			stop(short)
			if err := Withdraw(t.Context(), api.CoreV1().ConfigMaps("flock-system"), short); err != nil {
				t.Fatal(err)
			}
			short = ""
		}
		seeds := make([]uint64, 4)
		for i := range seeds {
			seeds[i] = rng.Uint64()
		}
		var wg sync.WaitGroup
		for w, s := range seeds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(s, uint64(w)))
				for range 60 {
					i := r.IntN(keys)
					key := fmt.Sprintf("ns%d/p%d", i%3, i)
					up.apply(key, func(p *corev1.Pod) *corev1.Pod { return change(r, p, i) })
				}
			}()
		}
		// A fault while the changes go on.
		fault := rng.IntN(5)
		switch fault {
		case 0: // connections cut: watchers resume where they were
			for _, r := range relays {
				r.srv.CloseClientConnections()
			}
		case 1: // a relay's informer lists again: it fails, and starts
			// over (the others serve meanwhile)
			name := pick(rng, relays)
			caches[name].Handler().OnDelete(cache.DeletedFinalStateUnknown{Key: "ns0/gone"})
			wg.Wait()
			stop(name)
			start(name, 4096)
			publish(t, api, relays)
		case 2: // a relay comes, another goes for good (never the last
			// two: with no relay up, nodes follow the API server, which
			// this test does not model)
			// Its history is short once in a while: watchers that fall
			// behind (or resume from long ago) are told to list again.
			// Not always: client-go backs off longer after each.
			name, history := fmt.Sprintf("relay-%d", round), 4096
			if rng.IntN(2) == 0 {
				history, short = 20+rng.IntN(40), name
			}
			start(name, history)
			if len(relays) > 3 {
				gone := pick(rng, relays)
				for gone == name {
					gone = pick(rng, relays)
				}
				stop(gone)
			}
			publish(t, api, relays)
			// The directory names relays that are gone too (stopped
			// without withdrawing): nodes try the next.
			_ = Publish(t.Context(), api.CoreV1().ConfigMaps("flock-system"), "relay-dead", Entry{URL: "https://127.0.0.1:1", Certificate: relays[pick(rng, relays)].entry.Certificate, ServerName: "example.com"})
		}
		wg.Wait()
		want := up.snapshot()
		t0 := time.Now()
		for i, n := range nodes {
			// client-go's reflector backs off up to 30s after watches
			// that failed.
			if err := converged(n, want, 90*time.Second); err != nil {
				t.Fatalf("round %d, node %d (from %s): %v", round, i, n.source.using, err)
			}
		}
		t.Logf("round %d: fault %d, converged after %s", round, fault, time.Since(t0).Round(time.Millisecond))
	}
}

func pick(rng *rand.Rand, relays map[string]*relayUnderTest) string {
	names := make([]string, 0, len(relays))
	for n := range relays {
		names = append(names, n)
	}
	slicesSort(names)
	return names[rng.IntN(len(names))]
}

// change is a random change of pod i (nil: absent): made, relabelled,
// given addresses or a phase, its addresses taken, touched where trim
// does not look, deleted.
func change(r *rand.Rand, p *corev1.Pod, i int) *corev1.Pod {
	if p == nil {
		if r.IntN(4) == 0 {
			return nil
		}
		p := testPod(fmt.Sprintf("ns%d", i%3), fmt.Sprintf("p%d", i), i+r.IntN(1000))
		if r.IntN(2) == 0 {
			p.Status.PodIPs = nil // pending: other nodes are not sent it
		}
		return p
	}
	switch r.IntN(7) {
	case 0:
		return nil
	case 6: // addresses gone (other nodes no longer hold it)
		p.Status.PodIPs = nil
	case 1:
		p.Labels = map[string]string{"app": fmt.Sprintf("app-%d", r.IntN(5))}
	case 2:
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIPs = []corev1.PodIP{{IP: fmt.Sprintf("2001:db8::%x", r.IntN(1<<16))}}
	case 3:
		p.Status.Phase = corev1.PodSucceeded
	default: // what the kubelet writes most: nothing trim keeps
		p.Annotations = map[string]string{"noise": strconv.Itoa(r.Int())}
		p.Status.Conditions = append(p.Status.Conditions[:0], corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	}
	return p
}

func slicesSort(s []string) { slices.Sort(s) }
