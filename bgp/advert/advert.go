// Package advert names what the node advertises in BGP: the kinds of
// advertisement (each can carry its own communities), a desired route with
// its owners, and the diff between a desired set and what the speaker
// holds. The desired set itself is a pure function of the node state
// (agent/nodestate); the speaker applies the diff.
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
)

// Kinds in precedence order (when one prefix is claimed as several kinds,
// the first wins; validation normally prevents it).
var Kinds = []Kind{Summary, Pod, Address, Anycast}

// NodeOwner owns the summaries.
const NodeOwner = "node"

// Route is a desired advertisement.
type Route struct {
	Prefix netip.Prefix
	Kind   Kind
	Owners []string // sorted; several for anycast replicas
}

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
	slices.SortFunc(withdraw, ComparePrefixes)
	return announce, withdraw
}
