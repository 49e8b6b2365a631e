// Package advert names what the node advertises in BGP: the kinds of
// advertisement (each can carry its own communities), a desired route with
// its owners, and the diff between a desired set and what the speaker
// holds. The desired set itself is a pure function of the node state
// (agent/nodestate), which takes the Service routes from k8s/services; the
// speaker (bgp) applies the diff. It imports nothing of flock's, so all of
// them can import it.
package advert

import (
	"cmp"
	"net/netip"
	"slices"
)

// Kind of an advertisement; each kind can carry its own communities.
type Kind string

const (
	Summary Kind = "summary" // node pod CIDR
	Pod     Kind = "pod"     // pod /128 or /32 outside the summaries
	Anycast Kind = "anycast" // anycast IP of Ready pods
	Address Kind = "address" // `addresses` IP of a Ready pod
	Service Kind = "service" // LoadBalancer or external IP this node delivers
)

// Kinds in precedence order (when one prefix is claimed as several kinds,
// the first wins; validation normally prevents it). A kind's position is
// also its number in the marker community the speaker recovers its paths
// by after a restart: new kinds go at the end.
var Kinds = []Kind{Summary, Pod, Address, Anycast, Service}

// Path is one desired advertisement as it goes out: its kind and, for a
// Service route, how it is weighted and whether it drains. Two Paths are
// the same advertisement exactly when they are equal (==); the zero Path
// advertises nothing.
type Path struct {
	Kind Kind
	// Drain: the address is delivered only by endpoints on their way out;
	// the path carries GRACEFUL_SHUTDOWN (65535:0, RFC 8326) and a longer
	// AS path, so the fabric moves new flows elsewhere while existing ones
	// finish.
	Drain bool
	// Weight is the number of endpoints behind this node for the address,
	// sent as the link-bandwidth extended community (weighted ECMP at a
	// ToR that honours it); 0 sends none.
	Weight uint32
}

// Paths turns a kind-only set (pod routes carry nothing else) into Paths.
func Paths(kinds map[netip.Prefix]Kind) map[netip.Prefix]Path {
	out := make(map[netip.Prefix]Path, len(kinds))
	for p, k := range kinds {
		out[p] = Path{Kind: k}
	}
	return out
}

// NodeOwner owns the summaries.
const NodeOwner = "node"

// Route is a desired advertisement.
type Route struct {
	Prefix netip.Prefix
	Kind   Kind
	Drain  bool     `json:",omitempty"` // see Path
	Weight uint32   `json:",omitempty"` // see Path
	Owners []string // sorted; several for anycast replicas or shared Service addresses
}

// Path is what the route sends.
func (r Route) Path() Path { return Path{Kind: r.Kind, Drain: r.Drain, Weight: r.Weight} }

// Rank is a kind's position in Kinds (unknown kinds rank last).
func Rank(k Kind) int {
	if i := slices.Index(Kinds, k); i >= 0 {
		return i
	}
	return len(Kinds)
}

// ComparePrefixes orders by address, then by length (so that 10.0.0.0/24
// and 10.0.0.0/32 always come out in the same order).
func ComparePrefixes(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// Diff compares a desired state with what the speaker holds and returns
// the prefixes to (re)announce with their attributes and the ones to
// withdraw. A prefix held with the same attributes is left alone: never
// re-added. A desired zero value (no kind) withdraws.
func Diff[A comparable](desired, held map[netip.Prefix]A) (announce map[netip.Prefix]A, withdraw []netip.Prefix) {
	var none A
	announce = map[netip.Prefix]A{}
	for p, k := range desired {
		if k == none {
			continue
		}
		if h, ok := held[p]; !ok || h != k {
			announce[p] = k
		}
	}
	for p := range held {
		if desired[p] == none {
			withdraw = append(withdraw, p)
		}
	}
	slices.SortFunc(withdraw, ComparePrefixes)
	return announce, withdraw
}
