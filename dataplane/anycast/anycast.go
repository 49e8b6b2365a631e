// Package anycast owns the kernel host routes for the anycast and
// `addresses` IPs of Ready pods: <ip>/128|/32 via <pod eth0 IP> dev <veth>,
// one ECMP route with a next hop per Ready replica on this node. It is the
// kernel target of a reconcile loop: Set takes the full desired set and
// changes only the routes that differ, re-reading the kernel after any
// error and on every full pass, so a route that failed, vanished or was
// left behind by a crash is repaired.
package anycast

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// Kernel is the part of the dataplane the routes live in.
type Kernel interface {
	// SetRoute points dst at nhs (one ECMP route for several) or removes
	// it when nhs is empty.
	SetRoute(dst netip.Prefix, nhs []dataplane.Nexthop) error
	// HostRoutes lists flock's gateway routes as the kernel holds them.
	HostRoutes() (map[netip.Prefix][]dataplane.Nexthop, error)
}

// Routes is the kernel target. Safe for concurrent use.
type Routes struct {
	kernel Kernel

	mu        sync.Mutex
	installed map[netip.Prefix][]dataplane.Nexthop
	// stale: installed may differ from the kernel (start, or an error):
	// re-read before the next diff.
	stale bool
}

// New returns the target; its first Set reads the kernel.
func New(k Kernel) *Routes {
	return &Routes{kernel: k, installed: map[netip.Prefix][]dataplane.Nexthop{}, stale: true}
}

// Set makes the kernel's flock host routes exactly desired (prefix → next
// hops, sorted). Routes flock owns that are not desired are removed.
func (r *Routes) Set(ctx context.Context, desired map[netip.Prefix][]dataplane.Nexthop, full bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if full || r.stale {
		held, err := r.kernel.HostRoutes()
		if err != nil {
			r.stale = true
			return fmt.Errorf("kernel routes: %w", err)
		}
		for p, nhs := range held {
			slices.SortFunc(nhs, dataplane.CompareNexthops)
			held[p] = nhs
		}
		r.installed, r.stale = held, false
	}
	var errs []error
	for p, want := range desired {
		if err := ctx.Err(); err != nil {
			r.stale = true
			return errors.Join(append(errs, err)...)
		}
		if slices.Equal(r.installed[p], want) {
			continue
		}
		if err := r.kernel.SetRoute(p, want); err != nil {
			errs = append(errs, fmt.Errorf("kernel route %s: %w", p, err))
			continue
		}
		r.installed[p] = slices.Clone(want)
	}
	for p := range r.installed {
		if _, ok := desired[p]; ok {
			continue
		}
		if err := r.kernel.SetRoute(p, nil); err != nil {
			errs = append(errs, fmt.Errorf("kernel route %s: remove: %w", p, err))
			continue
		}
		delete(r.installed, p)
	}
	if len(errs) > 0 {
		r.stale = true
	}
	return errors.Join(errs...)
}

// LinkGone tells the target that a device vanished behind its back (a pod's
// netns went without a DEL): the kernel dropped the next hops on it — and
// for IPv4 the whole multipath route, other replicas included — so every
// route that used it is re-programmed at the next pass. It reports whether
// any route did.
func (r *Routes) LinkGone(dev string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	hit := false
	for p, nhs := range r.installed {
		for _, nh := range nhs {
			if nh.Dev == dev {
				// Unknown now: what the kernel holds can equal no desired
				// set, so the next pass sets or removes it.
				r.installed[p] = []dataplane.Nexthop{{Dev: "?" + dev}}
				hit = true
				break
			}
		}
	}
	return hit
}

// MarkStale makes the next pass re-read the kernel.
func (r *Routes) MarkStale() {
	r.mu.Lock()
	r.stale = true
	r.mu.Unlock()
}

// Installed is what the target believes the kernel holds.
func (r *Routes) Installed() map[netip.Prefix][]dataplane.Nexthop {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.installed)
}
