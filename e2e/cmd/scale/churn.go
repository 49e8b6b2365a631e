package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Rates of the churn, cluster-wide.
type churnRates struct {
	pods     float64 // pods created (and as many deleted) a second
	slices   float64 // EndpointSlice changes a second
	policies float64 // NetworkPolicy changes a second
}

// paced calls f rate times a second from up to workers goroutines until
// ctx ends; a tick that finds every worker busy is counted as missed, and
// so are the ticks the ticker dropped while this loop was late (a ticker
// drops what its receiver is not ready for: on two busy cores it can be).
func paced(ctx context.Context, rate float64, workers int, f func(ctx context.Context, n int) error, done, missed, failed *atomic.Int64, lastErr *atomicErr) {
	if rate <= 0 {
		return
	}
	sem := make(chan struct{}, workers)
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	start := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The ticks due by now; one behind is the ticker's jitter.
		for due := int(time.Since(start).Seconds() * rate); n < due-1; n++ {
			missed.Add(1)
		}
		select {
		case sem <- struct{}{}:
		default:
			missed.Add(1)
			continue
		}
		wg.Add(1)
		go func(n int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(ctx, n); err != nil {
				if ctx.Err() == nil {
					failed.Add(1)
					lastErr.set(err)
				}
				return
			}
			done.Add(1)
		}(n)
	}
}

type atomicErr struct {
	mu  sync.Mutex
	err error
}

func (a *atomicErr) set(err error) { a.mu.Lock(); a.err = err; a.mu.Unlock() }
func (a *atomicErr) get() error    { a.mu.Lock(); defer a.mu.Unlock(); return a.err }

// activity is what a churn run or the background achieved.
type activity struct {
	name string
	// kubeProxy: kube-proxy watches what it changes (the only one; the
	// lab has no controller-manager to put churned pods in slices).
	kubeProxy            bool
	done, missed, failed atomic.Int64
	lastErr              atomicErr
}

// reached is the share of the ticks served (1 if none came).
func (a *activity) reached() float64 { return a.reachedSince(tally{}) }

// tally is what an activity had done, missed and failed at a moment.
type tally struct{ done, missed, failed int64 }

func (a *activity) tally() tally { return tally{a.done.Load(), a.missed.Load(), a.failed.Load()} }

// reachedSince is the share of the ticks served since t (1 if none
// came): the figures of a window are judged by the churn in it, not by
// what it did before or after (the fan-out's load of the API server). A
// tick whose call failed made no churn: it counts as not served.
func (a *activity) reachedSince(t tally) float64 {
	done, missed, failed := a.done.Load()-t.done, a.missed.Load()-t.missed, a.failed.Load()-t.failed
	if done+missed+failed <= 0 {
		return 1
	}
	return float64(done) / float64(done+missed+failed)
}

func (a *activity) String() string {
	s := fmt.Sprintf("%s: %d done, %d missed, %d failed", a.name, a.done.Load(), a.missed.Load(), a.failed.Load())
	if err := a.lastErr.get(); err != nil {
		s += fmt.Sprintf(" (last error: %v)", err)
	}
	return s
}

// churnLifetime is how long a churn pod lives: created, given its
// addresses, deleted.
const churnLifetime = 5 * time.Second

// churnWarmup is how long a churn runs before it is measured: its first
// pods reach their deletion.
const churnWarmup = 10 * time.Second

// churn runs the churn until ctx ends and returns what it did:
// pods created on random model nodes in random workloads (their labels,
// so policies select them) and deleted churnLifetime later; EndpointSlices whose first endpoint flips
// readiness; NetworkPolicies that gain or lose a peer.
func (f *filler) churn(ctx context.Context, m *model, r churnRates, seed uint64) (acts []*activity, wait func()) {
	var wg sync.WaitGroup
	goPaced := func(rate float64, workers int, fn func(ctx context.Context, n int) error, a *activity) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paced(ctx, rate, workers, fn, &a.done, &a.missed, &a.failed, &a.lastErr)
		}()
	}
	pods := &activity{name: "pods created, given addresses and deleted"}
	slices := &activity{name: "EndpointSlice changes", kubeProxy: true}
	pols := &activity{name: "NetworkPolicy changes"}
	rng := func(n int) *rand.Rand { return rand.New(rand.NewPCG(seed, uint64(n))) }
	spare := 131072 - full.netPods() // IPv4 addresses of 198.18.0.0/15 the model's pods leave
	// Each churned pod takes one of them, handed out again only once its
	// pod is deleted, as an IPAM frees an address. Taking them in turn
	// reused one every 10 s, held twice by two pods whenever deletes
	// lagged (the API server saturated): no IPAM does that, and an
	// address held twice costs flock-policy a compile.
	f.churnOnce.Do(func() {
		f.churnFree = make(chan int, spare)
		for i := range spare {
			f.churnFree <- i
		}
	})
	free := f.churnFree
	// A pod's worker lives as long as the pod (churnLifetime): enough of
	// them for every pod alive at once.
	goPaced(r.pods, int(r.pods*(churnLifetime.Seconds()+5))+16, func(ctx context.Context, n int) (rerr error) {
		g := rng(n)
		w := m.workloads[g.IntN(len(m.workloads))]
		node := g.IntN(m.env.Nodes)
		p := podObj(w, 0)
		p.Name, p.Annotations = fmt.Sprintf("%s-churn-%d", w.name(), n), nil
		p.Spec.NodeName = nodeName(node)
		v6 := addOffset(nodeSummary(node).Addr(), uint64(0x1000+n%0x1000))
		var off int
		select {
		case off = <-free:
		case <-ctx.Done():
			return nil
		}
		v4 := addOffset(podV4Base, uint64(full.netPods()+off))
		// Deleted whatever the create returned (a status write cut short
		// by the window's end may still have landed) and even after the
		// run ends: nothing it made is left. Its address is free again
		// only once the pod is gone; a pod left behind held it into the
		// next size's churn, which handed it out again: an address held
		// twice.
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := retry(dctx, func() error {
				err := f.cs.CoreV1().Pods(p.Namespace).Delete(dctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			}); err != nil {
				// Logged too: after the window paced counts no error.
				logf("churn: pod %s/%s not deleted, its address %s held from now on: %v", p.Namespace, p.Name, v4, err)
				if rerr == nil {
					rerr = fmt.Errorf("delete churn pod %s: %w", p.Name, err)
				}
				return // its address stays out of the free list
			}
			free <- off
		}()
		if err := f.createPod(ctx, p, nodeIP(node), v6, v4); err != nil {
			return fmt.Errorf("churn pod %s: %w", p.Name, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(churnLifetime):
		}
		return nil
	}, pods)
	goPaced(r.slices, 32, func(ctx context.Context, n int) error {
		w := m.workloads[rng(n).IntN(len(m.workloads))]
		fams := f.familiesOf(w.index)
		if len(fams) == 0 {
			fams = []corev1.IPFamily{corev1.IPv6Protocol}
		}
		es := endpointSlices(w, fams)[0]
		return retry(ctx, func() error {
			cur, err := f.cs.DiscoveryV1().EndpointSlices(es.Namespace).Get(ctx, es.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ep := &cur.Endpoints[0]
			ready := ep.Conditions.Ready == nil || !*ep.Conditions.Ready
			ep.Conditions.Ready, ep.Conditions.Serving = ptr.To(ready), ptr.To(ready)
			_, err = f.cs.DiscoveryV1().EndpointSlices(es.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}, slices)
	goPaced(r.policies, 4, func(ctx context.Context, n int) error {
		p := rng(n).IntN(m.env.Policies)
		np := policyObj(m, p)
		return retry(ctx, func() error {
			cur, err := f.cs.NetworkingV1().NetworkPolicies(np.Namespace).Get(ctx, np.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			in := &cur.Spec.Ingress[0]
			canary := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"track": "canary"}}}
			if last := in.From[len(in.From)-1]; last.PodSelector != nil && last.PodSelector.MatchLabels["track"] == "canary" {
				in.From = in.From[:len(in.From)-1]
			} else {
				in.From = append(in.From, canary)
			}
			_, err = f.cs.NetworkingV1().NetworkPolicies(np.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
	}, pols)
	return []*activity{pods, slices, pols}, wg.Wait
}

// paced is r with its pods at share s of their rate. The EndpointSlice
// and NetworkPolicy changes stay at theirs: a dozen writes a second,
// against the pods' three each, which the API server keeps up with at
// every size, and all of kube-proxy's churn, which is then measured at
// the rate rather than projected to it.
func (r churnRates) paced(s float64) churnRates {
	return churnRates{pods: r.pods * s, slices: r.slices, policies: r.policies}
}

// paceFor is the share of the pod churn a size is measured
// under, given the pods a second a probe at the full rates completed:
// the full churn where the machine sustained 95 % of it; else 90 % of
// what it sustained, in 5 % steps (at least 5 %), a churn its API server
// keeps up with, whose figures are projected to the full rates. A churn
// the API server cannot keep up with is not the either: its
// activities fall behind unevenly (the pods, three writes each, far more
// than the EndpointSlices), which skews what each process is sent.
func paceFor(sustained, target float64) float64 {
	if target <= 0 || sustained >= churnReached*target {
		return 1
	}
	return max(0.05, math.Floor(0.9*sustained/target*20)/20)
}

// maxRepaces bounds how often a size's window is measured again at a
// lighter pace: the probe's rate is a 20 s sample, and at 5,000 nodes
// one repace left the window at 94 % (400eade); each costs one window.
const maxRepaces = 2

// repace is the share of the pod churn a size is measured under again
// after a window whose churn reached only reached of its target at pace:
// 90 % of what it reached, in 5 % steps (at least 5 %); 0 when it kept
// up (churnReached), or there is no lower step. A probe's 20 s flatter
// the machine: over the window's minute the churn fell to 90 % of its
// target at 500 nodes and 84 % at 5,000, and a short churn is never
// called met.
func repace(pace, reached float64) float64 {
	if reached >= churnReached {
		return 0
	}
	if p := max(0.05, math.Floor(0.9*pace*reached*20)/20); p < pace {
		return p
	}
	return 0
}

// probe runs the churn at r for d, after churnWarmup, and returns the
// pods a second it completed: what this machine's API server sustains
// at this size (false if ctx ended first: no rate). Its pods are deleted
// before it returns.
func (f *filler) probe(ctx context.Context, m *model, r churnRates, seed uint64, d time.Duration) (float64, bool) {
	cctx, stop := context.WithCancel(ctx)
	acts, wait := f.churn(cctx, m, r, seed)
	defer wait()
	defer stop()
	pods := acts[0]
	if !sleepCtx(ctx, churnWarmup) {
		return 0, false
	}
	t0, start := pods.tally(), time.Now()
	if !sleepCtx(ctx, d) {
		return 0, false
	}
	return float64(pods.done.Load()-t0.done) / time.Since(start).Seconds(), true
}

// sleepCtx sleeps d, or less if ctx ends first (false then).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
