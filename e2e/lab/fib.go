package lab

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The kernel protocols the ToRs install their routes with: BIRD's, and
// zebra's for FRR's bgpd.
const (
	rtprotBird = 12
	rtprotBGP  = 186
)

// FIBWatch follows the ToR's kernel routing table (what BIRD or FRR
// exports to it): which BGP-learnt prefixes are present, since when, and the fewest
// present since a mark (a restart must never lower it).
type FIBWatch struct {
	mu      sync.Mutex
	changed *sync.Cond
	present map[netip.Prefix]time.Time
	gone    map[netip.Prefix]time.Time
	low     int // fewest present since resetLow
	err     error
	done    chan struct{}
}

func WatchFIB(ns *NS) (*FIBWatch, error) {
	h, err := netns.GetFromPath(ns.Path)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	w := &FIBWatch{present: map[netip.Prefix]time.Time{}, gone: map[netip.Prefix]time.Time{}, done: make(chan struct{})}
	w.changed = sync.NewCond(&w.mu)
	ch := make(chan netlink.RouteUpdate, 4096)
	err = netlink.RouteSubscribeWithOptions(ch, w.done, netlink.RouteSubscribeOptions{
		Namespace: &h, ListExisting: true, ReceiveBufferSize: 32 << 20, ReceiveBufferForceSize: true,
		ErrorCallback: func(err error) {
			w.mu.Lock()
			w.err = fmt.Errorf("ToR FIB watch: %w", err)
			w.mu.Unlock()
			w.changed.Broadcast()
		},
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for u := range ch {
			if (u.Protocol != rtprotBird && u.Protocol != rtprotBGP) || u.Dst == nil {
				continue
			}
			a, ok := netip.AddrFromSlice(u.Dst.IP)
			if !ok {
				continue
			}
			ones, _ := u.Dst.Mask.Size()
			p := netip.PrefixFrom(a.Unmap(), ones)
			now := time.Now()
			w.mu.Lock()
			switch u.Type {
			case unix.RTM_NEWROUTE:
				if _, ok := w.present[p]; !ok {
					w.present[p] = now
				}
				delete(w.gone, p)
			case unix.RTM_DELROUTE:
				delete(w.present, p)
				w.gone[p] = now
				w.low = min(w.low, len(w.present))
			}
			w.mu.Unlock()
			w.changed.Broadcast()
		}
	}()
	return w, nil
}

func (w *FIBWatch) Close() { close(w.done) }

// ResetLow starts a new low-water mark.
func (w *FIBWatch) ResetLow() {
	w.mu.Lock()
	w.low = len(w.present)
	w.mu.Unlock()
}

// LowWater is the fewest prefixes present since ResetLow.
func (w *FIBWatch) LowWater() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.low
}

// wait waits until cond holds and returns the time it returns.
func (w *FIBWatch) wait(timeout time.Duration, what string, cond func() (time.Time, bool)) (time.Time, error) {
	var at time.Time
	w.mu.Lock()
	defer w.mu.Unlock()
	err := condWait(w.changed, timeout, func() (bool, error) {
		var ok bool
		at, ok = cond()
		return ok, w.err
	}, func() error { return fmt.Errorf("ToR FIB: %s not within %s", what, timeout) })
	return at, err
}

// WaitPresent waits until p is installed and returns when it was.
func (w *FIBWatch) WaitPresent(p netip.Prefix, timeout time.Duration) (time.Time, error) {
	return w.wait(timeout, p.String()+" installed", func() (time.Time, bool) {
		at, ok := w.present[p]
		return at, ok
	})
}

// WaitGone waits until p is removed and returns when it was.
func (w *FIBWatch) WaitGone(p netip.Prefix, timeout time.Duration) (time.Time, error) {
	return w.wait(timeout, p.String()+" removed", func() (time.Time, bool) {
		at, ok := w.gone[p]
		return at, ok
	})
}

// WaitCount waits until at least n prefixes inside r are installed and
// returns when the last of them was.
func (w *FIBWatch) WaitCount(r netip.Prefix, n int, timeout time.Duration) (time.Time, error) {
	return w.wait(timeout, fmt.Sprintf("%d routes in %s", n, r), func() (time.Time, bool) {
		var last time.Time
		c := 0
		for p, at := range w.present {
			if r.Contains(p.Addr()) {
				c++
				if at.After(last) {
					last = at
				}
			}
		}
		return last, c >= n
	})
}
