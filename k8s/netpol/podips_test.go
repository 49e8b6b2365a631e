package netpol

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// The pods by IP, kept from a random stream of pod changes (adds,
// deletes, moves to other addresses, addresses held by several pods,
// hostNetwork toggles, the same address twice in a pod, updates that keep
// the addresses) while readers look up concurrently: at every quiescent
// point each address's holders are exactly the pods of the store that
// hold it by their status, not on the host's network, as the store holds
// them now, and nothing else is held.
func TestPodsByIPIsTheStores(t *testing.T) {
	seed := testutil.Seed(t)
	r := rand.New(rand.NewPCG(uint64(seed), 1))
	addrs := []string{"fd00::1", "fd00::2", "fd00::3", "10.0.0.1", "10.0.0.2", "fd00::4"}
	store := map[string]*trim.Pod{}
	x := newPodsByIP()
	var stop atomic.Bool
	var readers sync.WaitGroup
	for range 3 {
		readers.Go(func() {
			for !stop.Load() {
				for _, a := range addrs {
					for _, p := range x.lookup(a) {
						_ = p.Name // the race detector sees what is read
					}
				}
			}
		})
	}
	defer func() { stop.Store(true); readers.Wait() }()
	for round := range 400 {
		for range 1 + r.IntN(8) {
			key := fmt.Sprintf("p%d", r.IntN(8))
			old := store[key]
			var cur *trim.Pod
			if r.IntN(5) != 0 {
				c := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: key, ResourceVersion: fmt.Sprint(round)}}
				c.Spec.HostNetwork = r.IntN(6) == 0
				switch {
				case old != nil && r.IntN(3) == 0: // the same addresses, a new object
					c.Status.PodIPs = old.Status.PodIPs
				default:
					for range r.IntN(3) {
						c.Status.PodIPs = append(c.Status.PodIPs, corev1.PodIP{IP: addrs[r.IntN(len(addrs))]})
					}
				}
				cur = trim.NewPod(c) // as the informer's transform caches it
			}
			if old == nil && cur == nil {
				continue
			}
			if cur == nil {
				delete(store, key)
			} else {
				store[key] = cur
			}
			x.update(old, cur)
		}
		want := map[string][]*trim.Pod{}
		for _, p := range store {
			if p.Spec.HostNetwork {
				continue
			}
			for _, ip := range p.Status.PodIPs {
				if !slices.Contains(want[ip.IP], p) {
					want[ip.IP] = append(want[ip.IP], p)
				}
			}
		}
		for _, a := range addrs {
			got := x.lookup(a)
			byName := func(a, b *trim.Pod) int { return strings.Compare(a.Name, b.Name) }
			slices.SortFunc(got, byName)
			slices.SortFunc(want[a], byName)
			if !slices.Equal(got, want[a]) {
				t.Fatalf("seed %d, round %d: %s held by %v, want %v (the store's objects)", seed, round, a, names(got), names(want[a]))
			}
		}
		if x.len() != len(want) {
			t.Fatalf("seed %d, round %d: %d addresses held, want %d", seed, round, x.len(), len(want))
		}
	}
}

func names(ps []*trim.Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name+"@"+p.ResourceVersion)
	}
	return out
}

// An address two pods hold by their status is logged with both, and not
// again within heldTwiceEvery.
func TestHeldTwiceIsLogged(t *testing.T) {
	pods, _, _ := stores()
	mk := func(name string) *trim.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Name: name}}
		p.Spec.NodeName = "node-b"
		p.Status.PodIPs = []corev1.PodIP{{IP: "fd00:20::2"}}
		return trim.NewPod(p) // as the informer's transform caches it
	}
	a, b := mk("old"), mk("new")
	_ = pods.Add(a)
	_ = pods.Add(b)
	var buf testutil.SyncBuffer
	k := newKernelVerdicts("node-a", trim.PodLister{}, nil, nil, nil, nil, slog.New(slog.NewTextHandler(&buf, nil)))
	indexPods(k, pods)
	k.logHeldTwice(nil, b)
	k.logHeldTwice(nil, b)
	out := buf.String()
	if !strings.Contains(out, "d/old") || !strings.Contains(out, "d/new") || !strings.Contains(out, "fd00:20::2") {
		t.Fatalf("log %q: want the address and both pods", out)
	}
	if n := strings.Count(out, "several pods hold"); n != 1 {
		t.Errorf("logged %d times within %s, want once", n, heldTwiceEvery)
	}
}
