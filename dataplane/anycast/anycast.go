// Package anycast keeps the node's host routes for the anycast and
// `addresses` IPs of Ready pods: <ip>/128|/32 via <pod eth0 IP> dev <veth>,
// one ECMP route with a next hop per Ready replica on this node. Changes are
// incremental: a pod event recomputes only the IPs that pod claims.
package anycast

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// Kind tells anycast from addresses IPs (advertised with different
// communities later on).
type Kind string

const (
	KindAnycast Kind = "anycast"
	KindAddress Kind = "address"
)

// Member is one pod attachment's claim.
type Member struct {
	ContainerID string
	HostVeth    string
	IPs         []netip.Addr // pod eth0 addresses: the next hops
	Anycast     []netip.Addr
	Addresses   []netip.Addr
	Ready       bool
}

func (m Member) claims() []netip.Addr {
	return append(append([]netip.Addr{}, m.Anycast...), m.Addresses...)
}

func (m Member) nexthop(ip netip.Addr) (dataplane.Nexthop, bool) {
	for _, a := range m.IPs {
		if a.Is4() == ip.Is4() {
			return dataplane.Nexthop{Gateway: a, Dev: m.HostVeth}, true
		}
	}
	return dataplane.Nexthop{}, false
}

// Routes is the part of the dataplane the reconciler drives.
type Routes interface {
	SetRoute(dst netip.Prefix, nhs []dataplane.Nexthop) error
}

// Route is one installed route, for inspection.
type Route struct {
	IP       netip.Addr
	Kind     Kind
	Nexthops []dataplane.Nexthop
	Owners   []string // container IDs
}

// Reconciler owns the anycast/addresses host routes.
type Reconciler struct {
	routes Routes
	// OnChange, if set, is called (outside the lock) after the set of
	// installed routes changed.
	OnChange func()

	mu        sync.Mutex
	members   map[string]Member
	byIP      map[netip.Addr]map[string]bool
	installed map[netip.Addr][]dataplane.Nexthop
}

// New returns a reconciler programming routes through r.
func New(r Routes) *Reconciler {
	return &Reconciler{routes: r, members: map[string]Member{}, byIP: map[netip.Addr]map[string]bool{}, installed: map[netip.Addr][]dataplane.Nexthop{}}
}

// Update adds or replaces a member and reprograms the IPs it claims (now
// or before).
func (r *Reconciler) Update(m Member) error {
	r.mu.Lock()
	affected := map[netip.Addr]bool{}
	if old, ok := r.members[m.ContainerID]; ok {
		r.unindex(old, affected)
	}
	r.members[m.ContainerID] = m
	for _, ip := range m.claims() {
		if r.byIP[ip] == nil {
			r.byIP[ip] = map[string]bool{}
		}
		r.byIP[ip][m.ContainerID] = true
		affected[ip] = true
	}
	changed, err := r.sync(affected)
	r.mu.Unlock()
	r.notify(changed)
	return err
}

// Remove drops a member; its IPs lose this next hop (and the route goes
// when it was the last). Call before deleting the pod's veth, so the other
// replicas' ECMP route never references a vanished device.
func (r *Reconciler) Remove(containerID string) error {
	r.mu.Lock()
	old, ok := r.members[containerID]
	if !ok {
		r.mu.Unlock()
		return nil
	}
	affected := map[netip.Addr]bool{}
	r.unindex(old, affected)
	delete(r.members, containerID)
	changed, err := r.sync(affected)
	r.mu.Unlock()
	r.notify(changed)
	return err
}

func (r *Reconciler) notify(changed bool) {
	if changed && r.OnChange != nil {
		r.OnChange()
	}
}

func (r *Reconciler) unindex(m Member, affected map[netip.Addr]bool) {
	for _, ip := range m.claims() {
		delete(r.byIP[ip], m.ContainerID)
		if len(r.byIP[ip]) == 0 {
			delete(r.byIP, ip)
		}
		affected[ip] = true
	}
}

func (r *Reconciler) desired(ip netip.Addr) []dataplane.Nexthop {
	var nhs []dataplane.Nexthop
	for id := range r.byIP[ip] {
		m := r.members[id]
		if !m.Ready {
			continue
		}
		if nh, ok := m.nexthop(ip); ok {
			nhs = append(nhs, nh)
		}
	}
	slices.SortFunc(nhs, func(a, b dataplane.Nexthop) int {
		if c := a.Gateway.Compare(b.Gateway); c != 0 {
			return c
		}
		return strings.Compare(a.Dev, b.Dev)
	})
	return nhs
}

func (r *Reconciler) sync(affected map[netip.Addr]bool) (bool, error) {
	var errs []error
	changed := false
	for ip := range affected {
		want := r.desired(ip)
		if slices.Equal(want, r.installed[ip]) {
			continue
		}
		if err := r.routes.SetRoute(netip.PrefixFrom(ip, ip.BitLen()), want); err != nil {
			errs = append(errs, fmt.Errorf("anycast: %w", err))
			continue
		}
		changed = true
		if len(want) == 0 {
			delete(r.installed, ip)
		} else {
			r.installed[ip] = want
		}
	}
	return changed, errors.Join(errs...)
}

// Resync reprograms every claimed IP from scratch and removes flock gateway
// routes nobody claims (left by a crash). existing lists the gateway routes
// the kernel holds.
func (r *Reconciler) Resync(existing []netip.Prefix) error {
	r.mu.Lock()
	affected := map[netip.Addr]bool{}
	for ip := range r.byIP {
		affected[ip] = true
	}
	r.installed = map[netip.Addr][]dataplane.Nexthop{}
	var errs []error
	for _, p := range existing {
		if p.IsSingleIP() && r.byIP[p.Addr()] != nil {
			continue
		}
		if err := r.routes.SetRoute(p, nil); err != nil {
			errs = append(errs, err)
		}
	}
	changed, err := r.sync(affected)
	r.mu.Unlock()
	r.notify(changed || len(existing) > 0)
	return errors.Join(append(errs, err)...)
}

// Routes returns the installed routes, sorted by IP.
func (r *Reconciler) Routes() []Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Route, 0, len(r.installed))
	for ip, nhs := range r.installed {
		rt := Route{IP: ip, Kind: KindAnycast, Nexthops: nhs}
		for id := range r.byIP[ip] {
			m := r.members[id]
			if m.Ready {
				rt.Owners = append(rt.Owners, id)
			}
			if slices.Contains(m.Addresses, ip) {
				rt.Kind = KindAddress
			}
		}
		slices.Sort(rt.Owners)
		out = append(out, rt)
	}
	slices.SortFunc(out, func(a, b Route) int { return a.IP.Compare(b.IP) })
	return out
}

// Claimant returns a member other than containerID that claims ip as an
// `addresses` IP (addresses are exclusive to one pod; anycast is shared).
func (r *Reconciler) Claimant(ip netip.Addr, containerID string) (string, Kind, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.byIP[ip] {
		if id == containerID {
			continue
		}
		if slices.Contains(r.members[id].Addresses, ip) {
			return id, KindAddress, true
		}
		return id, KindAnycast, true
	}
	return "", "", false
}
