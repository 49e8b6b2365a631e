// Package advert holds the set of routes the node should advertise: the
// desired set. Owners (the node itself for summaries, each pod attachment
// for its routes) replace their own claims; the set records which prefixes
// changed so that the BGP reconciler sends only the difference, and wakes
// the reconciler at once (coalesced) without any polling.
package advert

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"
)

// Kind of an advertisement; each kind can carry its own communities.
type Kind string

const (
	Summary Kind = "summary" // node pod CIDR
	Pod     Kind = "pod"     // pod /128 or /32 outside the summaries
	Anycast Kind = "anycast" // anycast IP of Ready pods
	Address Kind = "address" // `addresses` IP of a Ready pod
)

// Kinds in precedence order (when one prefix is claimed as several kinds,
// the first wins; validation normally prevents it).
var Kinds = []Kind{Summary, Pod, Address, Anycast}

// NodeOwner owns the summaries.
const NodeOwner = "node"

// Claim is one prefix an owner wants advertised.
type Claim struct {
	Prefix netip.Prefix
	Kind   Kind
}

// Route is a desired advertisement.
type Route struct {
	Prefix netip.Prefix
	Kind   Kind
	Owners []string // sorted; several for anycast replicas
}

type entry struct {
	owners map[string]Kind
}

func (e *entry) kind() Kind {
	for _, k := range Kinds {
		for _, ok := range e.owners {
			if ok == k {
				return k
			}
		}
	}
	return ""
}

// kindRank is a kind's position in Kinds (unknown kinds rank last).
func kindRank(k Kind) int {
	if i := slices.Index(Kinds, k); i >= 0 {
		return i
	}
	return len(Kinds)
}

// comparePrefixes orders by address, then by length (so that 10.0.0.0/24
// and 10.0.0.0/32 always come out in the same order).
func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// Set is the desired set. Safe for concurrent use.
type Set struct {
	mu      sync.Mutex
	routes  map[netip.Prefix]*entry
	byOwner map[string][]Claim
	dirty   map[netip.Prefix]bool
	changed chan struct{}
}

// NewSet returns an empty set.
func NewSet() *Set {
	return &Set{routes: map[netip.Prefix]*entry{}, byOwner: map[string][]Claim{}, dirty: map[netip.Prefix]bool{}, changed: make(chan struct{}, 1)}
}

// Changed is signalled (coalesced) whenever a prefix became dirty.
func (s *Set) Changed() <-chan struct{} { return s.changed }

// SetOwner replaces all of owner's claims (nil or empty: remove the owner).
// Only prefixes whose desired state actually changes become dirty.
func (s *Set) SetOwner(owner string, claims []Claim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.byOwner[owner]
	if slices.Equal(old, claims) {
		return
	}
	// What each touched prefix looked like before, to mark only real changes.
	before := map[netip.Prefix]Kind{}
	for _, c := range append(slices.Clone(old), claims...) {
		if _, ok := before[c.Prefix]; !ok {
			before[c.Prefix] = s.snapshotLocked(c.Prefix)
		}
	}
	for _, c := range old {
		if e := s.routes[c.Prefix]; e != nil {
			delete(e.owners, owner)
			if len(e.owners) == 0 {
				delete(s.routes, c.Prefix)
			}
		}
	}
	for _, c := range claims {
		e := s.routes[c.Prefix]
		if e == nil {
			e = &entry{owners: map[string]Kind{}}
			s.routes[c.Prefix] = e
		}
		// One owner claiming a prefix as several kinds: keep the one
		// that takes precedence, whatever the order of the claims.
		if k, ok := e.owners[owner]; !ok || kindRank(c.Kind) < kindRank(k) {
			e.owners[owner] = c.Kind
		}
	}
	for p, k := range before {
		s.markIfChanged(p, k)
	}
	if len(claims) == 0 {
		delete(s.byOwner, owner)
	} else {
		s.byOwner[owner] = slices.Clone(claims)
	}
}

// snapshotLocked is what the BGP side cares about for one prefix: whether
// it is advertised and as which kind. Replica counts don't matter to a
// peer: one path per prefix, withdrawn only when the last owner goes.
func (s *Set) snapshotLocked(p netip.Prefix) Kind {
	if e := s.routes[p]; e != nil {
		return e.kind()
	}
	return ""
}

// markIfChanged marks p dirty if its state differs from before.
func (s *Set) markIfChanged(p netip.Prefix, before Kind) {
	if s.snapshotLocked(p) == before {
		return
	}
	s.dirty[p] = true
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// TakeDirty returns the desired state of every prefix that changed since
// the last call (Kind "" means: withdraw) and clears the dirty marks.
func (s *Set) TakeDirty() map[netip.Prefix]Kind {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[netip.Prefix]Kind, len(s.dirty))
	for p := range s.dirty {
		out[p] = s.snapshotLocked(p)
	}
	clear(s.dirty)
	return out
}

// Desired returns the whole desired state (for a full resync).
func (s *Set) Desired() map[netip.Prefix]Kind {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[netip.Prefix]Kind, len(s.routes))
	for p := range s.routes {
		out[p] = s.snapshotLocked(p)
	}
	return out
}

// Routes lists the desired routes with their owners, sorted by prefix.
func (s *Set) Routes() []Route {
	s.mu.Lock()
	out := make([]Route, 0, len(s.routes))
	for p, e := range s.routes {
		r := Route{Prefix: p, Kind: e.kind()}
		for o := range e.owners {
			r.Owners = append(r.Owners, o)
		}
		slices.Sort(r.Owners)
		out = append(out, r)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Route) int { return comparePrefixes(a.Prefix, b.Prefix) })
	return out
}

// Diff compares a desired state with what the speaker holds and returns
// the prefixes to (re)announce with their kind and the ones to withdraw.
// A prefix held with the same kind is left alone: never re-added.
func Diff(desired, held map[netip.Prefix]Kind) (announce map[netip.Prefix]Kind, withdraw []netip.Prefix) {
	announce = map[netip.Prefix]Kind{}
	for p, k := range desired {
		if k == "" {
			continue
		}
		if held[p] != k {
			announce[p] = k
		}
	}
	for p := range held {
		if desired[p] == "" {
			withdraw = append(withdraw, p)
		}
	}
	slices.SortFunc(withdraw, comparePrefixes)
	return announce, withdraw
}
