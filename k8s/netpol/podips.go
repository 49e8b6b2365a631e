package netpol

import (
	"slices"
	"sync"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// podsByIP holds the cluster's pods by status IP, hostNetwork pods left
// out: the engine's lookup of a packet's pods (networkpolicy.Config.
// PodsByIP) and the kernel verdicts' holders (verdicts.Live.Holders). The
// informer index that did this kept a set of keys an address, two small
// maps each: after the pods themselves, the largest part of flock-policy's
// memory on a large cluster. Here an address is one map entry, and a
// slice only while several pods hold it.
//
// The kernel verdicts' pod handler keeps it, before it judges each
// change: what Classify and Dispatch read of the holders follows the
// changes they judge. It is complete once that handler has been told of
// every pod of the informer's first list (the registration's HasSynced).
type podsByIP struct {
	mu   sync.RWMutex
	one  map[string]*trim.Pod   // an address one pod holds: that pod
	more map[string][]*trim.Pod // an address several hold: those
}

func newPodsByIP() *podsByIP {
	return &podsByIP{one: map[string]*trim.Pod{}, more: map[string][]*trim.Pod{}}
}

// update replaces a pod's entries, old's (nil: none, an add) by cur's
// (nil: none, a delete).
func (x *podsByIP) update(old, cur *trim.Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old != nil && !old.Spec.HostNetwork {
		for _, ip := range old.Status.PodIPs {
			x.remove(ip.IP, old)
		}
	}
	if cur != nil && !cur.Spec.HostNetwork {
		for _, ip := range cur.Status.PodIPs {
			x.add(ip.IP, cur)
		}
	}
}

func samePod(a, b *trim.Pod) bool { return a.Namespace == b.Namespace && a.Name == b.Name }

func (x *podsByIP) add(ip string, p *trim.Pod) {
	if hs, ok := x.more[ip]; ok {
		if i := slices.IndexFunc(hs, func(h *trim.Pod) bool { return samePod(h, p) }); i >= 0 {
			hs[i] = p
		} else {
			x.more[ip] = append(hs, p)
		}
		return
	}
	h, ok := x.one[ip]
	switch {
	case !ok || samePod(h, p):
		x.one[ip] = p
	default:
		delete(x.one, ip)
		x.more[ip] = []*trim.Pod{h, p}
	}
}

func (x *podsByIP) remove(ip string, p *trim.Pod) {
	if h, ok := x.one[ip]; ok {
		if samePod(h, p) {
			delete(x.one, ip)
		}
		return
	}
	hs, ok := x.more[ip]
	if !ok {
		return
	}
	hs = slices.DeleteFunc(hs, func(h *trim.Pod) bool { return samePod(h, p) })
	switch len(hs) {
	case 1:
		delete(x.more, ip)
		x.one[ip] = hs[0]
	case 0:
		delete(x.more, ip)
	default:
		x.more[ip] = hs
	}
}

// lookup is the pods holding ip by their status (a new slice; nil: none).
func (x *podsByIP) lookup(ip string) []*trim.Pod {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if h, ok := x.one[ip]; ok {
		return []*trim.Pod{h}
	}
	return slices.Clone(x.more[ip])
}

// len is how many addresses it holds (tests).
func (x *podsByIP) len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.one) + len(x.more)
}
