// Package nodestate is the node's one source of truth: every pod attachment
// (pending, committed, being deleted, stuck), the IPs and veth names they
// hold, the anycast and `addresses` claims, and pod readiness — all behind
// one lock. ADD, DEL, readiness reports, restore and reaping change it and
// nothing else; what the node advertises in BGP and routes in its kernel is
// derived from it (desired.go) by the reconcilers, never published by the
// event handlers themselves. Every change bumps a generation and wakes the
// subscribers.
package nodestate

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Phase of an attachment.
type Phase uint8

const (
	// Pending: an ADD is in progress. Its IPs, claims and veth name are
	// held; nothing is routed or advertised for it yet.
	Pending Phase = iota + 1
	// Committed: set up and recorded; routed and advertised.
	Committed
	// Deleting: a DEL (or a reap) is in progress. It still holds its IPs
	// and veth name, but is routed and advertised nowhere.
	Deleting
	// Stuck: an ADD failed and its rollback could not remove the veth; it
	// holds its IPs until a DEL (or the next start) finishes the job.
	Stuck
)

func (p Phase) String() string {
	switch p {
	case Pending:
		return "pending"
	case Committed:
		return "committed"
	case Deleting:
		return "deleting"
	case Stuck:
		return "stuck"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

type entry struct {
	rec   store.Allocation
	phase Phase
	// why a Stuck entry is stuck (for status and logs)
	reason string
}

// Kind of a claimed IP.
type Kind string

const (
	KindAnycast Kind = "anycast"
	KindAddress Kind = "address"
)

// claim is the set of attachments claiming one anycast or `addresses` IP.
type claim struct {
	kind   Kind
	owners []string // usually one: a slice costs a tenth of a map
}

// ConflictError is a claim that collides with another attachment's.
type ConflictError struct {
	Key    string // annotation key
	IP     netip.Addr
	Reason string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("annotation %s: %s %s", e.Key, e.IP, e.Reason)
}

// ErrExists is a Reserve for a container the state already holds.
var ErrExists = errors.New("container already has an attachment")

// State is the node state. Safe for concurrent use.
type State struct {
	mu        sync.Mutex
	ipam      *ipam.Allocator
	summaries []netip.Prefix
	// legacy are the NodeConfig's shared pools (deprecated: AddressPools)
	legacy []ipam.Pool
	// suppressed summaries are not advertised (they overlap another node's
	// summary or an AddressPool), with the reason.
	suppressed map[netip.Prefix]string
	// defaultReady is the readiness of a pod nobody reported on: true in
	// standalone mode (no API to ask), false in Kubernetes mode.
	defaultReady bool

	entries map[string]*entry     // by container ID
	veths   map[string]string     // host veth name → container ID
	claims  map[netip.Addr]*claim // anycast and `addresses` IPs
	// outside holds restored pod IPs that no configured pool covers any
	// more (IPAM cannot hold them): nobody else may claim them.
	outside map[netip.Addr]string
	ready   map[podKey]bool            // last report per pod incarnation
	pods    map[podKey]map[string]bool // pod incarnation → its container IDs
	gen     uint64
	subs    []chan struct{}
	// services are the Service routes this node delivers (services.go).
	services map[netip.Prefix]ServiceRoute
	// des are the desired sets, kept incrementally (incremental.go).
	des desiredSets
	// leaving: flock is being uninstalled from the node, and nothing is to
	// be advertised any more (Leave).
	leaving bool
}

// New builds an empty state for a node config (its pools become the IPAM
// pools). defaultReady: see State.
func New(spec *v1alpha1.NodeConfigSpec, defaultReady bool) (*State, error) {
	pools, err := nodeconfig.Pools(spec)
	if err != nil {
		return nil, err
	}
	alloc, err := ipam.New(pools)
	if err != nil {
		return nil, err
	}
	var legacy []ipam.Pool
	for _, p := range pools {
		if !p.Summary {
			legacy = append(legacy, p)
		}
	}
	return &State{
		ipam: alloc, summaries: nodeconfig.Summaries(spec), legacy: legacy, defaultReady: defaultReady, suppressed: map[netip.Prefix]string{},
		entries: map[string]*entry{}, veths: map[string]string{}, claims: map[netip.Addr]*claim{}, outside: map[netip.Addr]string{},
		ready: map[podKey]bool{}, pods: map[podKey]map[string]bool{}, des: newDesiredSets(),
	}, nil
}

// Summaries are the node summary prefixes.
func (s *State) Summaries() []netip.Prefix { return slices.Clone(s.summaries) }

// SetPodPools sets the cluster-wide pools (AddressPools of use pod) this
// node hands cidr6/cidr4 pod addresses out from, next to its own summary
// pools. A pool that overlaps a summary is left out and returned: its
// addresses would be the node's own and the cluster's at once. Addresses
// held in a pool that goes stay held; pod addresses restored outside
// every pool that a new pool covers are handed to IPAM, which would
// otherwise give them out again. Anycast and `addresses` IPs in use that
// a new pool covers stay where they are and IPAM never hands them out
// (they are held, see insertLocked); InUseIn lists them for the report.
func (s *State) SetPodPools(pools []netip.Prefix) (skipped []netip.Prefix, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var all []ipam.Pool
	for _, p := range s.summaries {
		all = append(all, ipam.Pool{Prefix: p, Summary: true})
	}
	all = append(all, s.legacy...)
	for _, p := range pools {
		if slices.ContainsFunc(all, func(q ipam.Pool) bool { return q.Prefix.Overlaps(p) }) {
			if !slices.ContainsFunc(s.legacy, func(q ipam.Pool) bool { return q.Prefix == p }) {
				skipped = append(skipped, p)
			}
			continue
		}
		all = append(all, ipam.Pool{Prefix: p})
	}
	if err := s.ipam.SetPools(all); err != nil {
		return skipped, err
	}
	for ip, id := range s.outside {
		if s.ipam.Reserve(ip, id) == nil {
			delete(s.outside, ip) // the same holder, now through IPAM
		}
	}
	return skipped, nil
}

// SetSuppressed names the summaries not to advertise, with the reason
// (an overlap with another node's summary or an AddressPool: advertising
// it could hijack addresses). It reports whether anything changed.
func (s *State) SetSuppressed(reasons map[netip.Prefix]string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if maps.Equal(reasons, s.suppressed) {
		return false
	}
	s.suppressed = maps.Clone(reasons)
	s.des.summaries = true
	s.changedLocked()
	return true
}

// Suppressed returns the summaries not advertised, with the reason.
func (s *State) Suppressed() map[netip.Prefix]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.suppressed)
}

// Changed returns a channel of its own to each caller (each reconciler
// follows the state on its own) that receives a (coalesced) value after
// every change.
func (s *State) Changed() <-chan struct{} {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.subs = append(s.subs, ch)
	s.mu.Unlock()
	return ch
}

// Generation is the number of changes so far.
func (s *State) Generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// changedLocked bumps the generation and wakes the subscribers.
// Leave makes the advertised set empty for good: flock is leaving the
// node (an uninstall), and the ToR is to drop every route of it while the
// sessions are still up. The kernel's routes stay for the pods until the
// dataplane is removed. It returns the generation that says so.
func (s *State) Leave() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaving = true
	return s.changedLocked()
}

func (s *State) changedLocked() uint64 {
	s.gen++
	for _, ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return s.gen
}

// Reserve takes everything a new attachment needs, all or nothing: its
// anycast and `addresses` claims, a host veth name no other attachment
// holds (probing deterministic alternatives on a hash collision), and an
// address per request. rec describes the attachment (its IPs and HostVeth
// are filled in); it enters the state as Pending.
func (s *State) Reserve(rec store.Allocation, reqs []ipam.Request) (store.Allocation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rec.ContainerID
	if _, ok := s.entries[id]; ok {
		return store.Allocation{}, fmt.Errorf("container %s: %w", id, ErrExists)
	}
	if err := s.checkClaimsLocked(rec, false); err != nil {
		return store.Allocation{}, err
	}
	rec.HostVeth = s.freeVethLocked(id)
	rec.IPs = nil
	for _, r := range reqs {
		r.Owner = id
		ip, err := s.ipam.Allocate(r)
		if err != nil {
			for _, got := range rec.IPs {
				s.ipam.Release(got, id)
			}
			return store.Allocation{}, err
		}
		rec.IPs = append(rec.IPs, ip)
	}
	rec.State = store.Pending
	s.insertLocked(rec, Pending)
	return rec, nil
}

// freeVethLocked returns the first of the container's deterministic veth
// names (dataplane.HostVethName, then its probes) that no attachment holds.
func (s *State) freeVethLocked(id string) string {
	for n := 0; ; n++ {
		name := dataplane.ProbeVethName(id, n)
		if owner, taken := s.veths[name]; !taken || owner == id {
			return name
		}
	}
}

func (s *State) insertLocked(rec store.Allocation, phase Phase) {
	id := rec.ContainerID
	s.entries[id] = &entry{rec: rec, phase: phase}
	s.markLocked(&rec)
	if _, taken := s.veths[rec.HostVeth]; !taken && rec.HostVeth != "" {
		s.veths[rec.HostVeth] = id
	}
	for _, set := range []struct {
		kind Kind
		ips  []netip.Addr
	}{{KindAnycast, rec.Anycast}, {KindAddress, rec.Addresses}} {
		for _, ip := range set.ips {
			c := s.claims[ip]
			if c == nil {
				c = &claim{kind: set.kind}
				s.claims[ip] = c
				s.ipam.Hold(ip) // in use: never a pod address, whatever pool covers it
			}
			if !slices.Contains(c.owners, id) {
				c.owners = append(c.owners, id)
			}
		}
	}
	s.addPodLocked(rec.Pod, id)
}

// Restore puts a committed record back (agent start): its IPs, claims and
// veth name are taken again. An IP or claim another record holds is an
// error: the store is inconsistent and must not be papered over.
func (s *State) Restore(rec store.Allocation) (warnings []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rec.ContainerID
	if _, ok := s.entries[id]; ok {
		return nil, fmt.Errorf("allocation %s: %w", id, ErrExists)
	}
	if err := s.checkClaimsLocked(rec, true); err != nil {
		return nil, fmt.Errorf("allocation %s: %w", id, err)
	}
	var taken []netip.Addr
	for _, ip := range rec.IPs {
		if err := s.ipam.Reserve(ip, id); err != nil {
			if errors.Is(err, ipam.ErrConflict) {
				for _, t := range taken {
					s.ipam.Release(t, id)
				}
				return nil, fmt.Errorf("allocation %s: %w", id, err)
			}
			// The pool may have been removed from the NodeConfig: the pod
			// keeps its address, the pool is just no longer handed out.
			warnings = append(warnings, fmt.Sprintf("address %s of %s is outside the configured pools: %v", ip, id, err))
			if o, dup := s.outside[ip]; dup {
				for _, t := range taken {
					s.ipam.Release(t, id)
				}
				return nil, fmt.Errorf("allocation %s: address %s is also held by %s", id, ip, o)
			}
			continue
		}
		taken = append(taken, ip)
	}
	if owner, dup := s.veths[rec.HostVeth]; dup {
		warnings = append(warnings, fmt.Sprintf("allocation %s: host veth %s is also recorded for %s", id, rec.HostVeth, owner))
	}
	for _, ip := range rec.IPs {
		// Held outside IPAM: no pool covers it any more, or only as a
		// boundary address a resized pool no longer hands out.
		if o, ok := s.ipam.Owner(ip); !ok || o != id {
			s.outside[ip] = id
		}
	}
	rec.State = store.Committed
	s.insertLocked(rec, Committed)
	s.changedLocked()
	return warnings, nil
}

// Quarantine puts back a record that cannot be restored as it is (its IPs
// or claims collide with another record's, its anycast IP is another
// record's pod address, its teardown failed) as Stuck: routed and advertised nowhere, it
// holds the IPs IPAM lets it hold until a DEL or GC removes it. Refusing to
// start instead would leave the node without CNI, so that DEL could never
// come.
func (s *State) Quarantine(rec store.Allocation, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rec.ContainerID
	if _, ok := s.entries[id]; ok {
		return
	}
	for _, ip := range rec.IPs {
		_ = s.ipam.Reserve(ip, id) // whatever is free: the rest is someone else's
	}
	// No claims: its anycast and addresses IPs are not routed, and the
	// collision may be with them.
	e := &entry{rec: rec, phase: Stuck, reason: reason}
	s.entries[id] = e
	s.markLocked(&rec)
	if _, taken := s.veths[rec.HostVeth]; !taken && rec.HostVeth != "" {
		s.veths[rec.HostVeth] = id
	}
	s.addPodLocked(rec.Pod, id)
	s.changedLocked()
}

// HoldVeth reserves a host veth name for holder while it is torn down
// outside any attachment (the DEL of an unknown container), so that a
// concurrent ADD cannot take the name in between. It fails if another
// attachment holds the name; release gives it back.
func (s *State) HoldVeth(name, holder string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if owner, taken := s.veths[name]; taken && owner != holder {
		return nil, false
	}
	s.veths[name] = holder
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.veths[name] == holder {
			if e := s.entries[holder]; e == nil || e.rec.HostVeth != name {
				delete(s.veths, name)
			}
		}
	}, true
}

// Commit marks a Pending attachment set up (rec carries what the dataplane
// reported) and returns the new generation.
func (s *State) Commit(rec store.Allocation) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[rec.ContainerID]
	if e == nil {
		return 0, fmt.Errorf("commit %s: no such attachment", rec.ContainerID)
	}
	if e.phase != Pending {
		return 0, fmt.Errorf("commit %s: it is %s, not pending", rec.ContainerID, e.phase)
	}
	rec.State = store.Committed
	s.markLocked(&e.rec)
	e.rec, e.phase = rec, Committed
	s.markLocked(&e.rec)
	return s.changedLocked(), nil
}

// MarkDeleting takes an attachment out of every route and advertisement
// while it still holds its IPs and veth, and returns the new generation.
func (s *State) MarkDeleting(id string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[id]
	if e == nil || (e.phase != Committed && e.phase != Deleting) {
		return 0, false
	}
	e.phase = Deleting
	s.touchLocked(id)
	return s.changedLocked(), true
}

// MarkStuck records that a Pending attachment's rollback could not remove
// its veth: it keeps its IPs until Release.
func (s *State) MarkStuck(id, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[id]; e != nil {
		e.phase, e.reason = Stuck, reason
		s.touchLocked(id)
	}
}

// Release drops an attachment and frees everything it held.
func (s *State) Release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[id]
	if e == nil {
		return
	}
	rec := e.rec
	delete(s.entries, id)
	s.markLocked(&rec)
	for _, ip := range rec.IPs {
		s.ipam.Release(ip, id)
		if s.outside[ip] == id {
			delete(s.outside, ip)
		}
	}
	if s.veths[rec.HostVeth] == id {
		delete(s.veths, rec.HostVeth)
	}
	for _, ip := range append(slices.Clone(rec.Anycast), rec.Addresses...) {
		if c := s.claims[ip]; c != nil && slices.Contains(c.owners, id) {
			c.owners = slices.DeleteFunc(c.owners, func(o string) bool { return o == id })
			if len(c.owners) == 0 {
				delete(s.claims, ip)
				s.ipam.Unhold(ip)
			}
		}
	}
	s.removePodLocked(rec.Pod, id)
	s.changedLocked()
}

// Get returns an attachment and its phase.
func (s *State) Get(id string) (store.Allocation, Phase, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[id]
	if e == nil {
		return store.Allocation{}, 0, false
	}
	return e.rec, e.phase, true
}

// VethOwner tells which attachment holds a host veth name.
func (s *State) VethOwner(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.veths[name]
	return id, ok
}

// Attachment is an entry with its phase.
type Attachment struct {
	store.Allocation
	Phase Phase
	Ready bool
	// Reason a Stuck attachment is stuck.
	Reason string
}

// Attachments lists every attachment in the given phases (all when none
// are given), sorted by container ID.
func (s *State) Attachments(phases ...Phase) []Attachment {
	s.mu.Lock()
	out := make([]Attachment, 0, len(s.entries))
	for _, e := range s.entries {
		if len(phases) == 0 || slices.Contains(phases, e.phase) {
			out = append(out, Attachment{Allocation: e.rec, Phase: e.phase, Ready: s.readyLocked(e.rec.Pod), Reason: e.reason})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Attachment) int { return strings.Compare(a.ContainerID, b.ContainerID) })
	return out
}

// Committed lists the committed allocations, sorted by container ID.
func (s *State) Committed() []store.Allocation {
	s.mu.Lock()
	out := make([]store.Allocation, 0, len(s.entries))
	for _, e := range s.entries {
		if e.phase == Committed {
			out = append(out, e.rec)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b store.Allocation) int { return strings.Compare(a.ContainerID, b.ContainerID) })
	return out
}

// PodAllocations lists the attachments of one pod incarnation (a static
// pod's, through whichever mirror) that are not mid-ADD.
func (s *State) PodAllocations(pod podmeta.ID) []store.Allocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Allocation
	for id := range s.pods[keyOf(pod)] {
		if e := s.entries[id]; e != nil && e.phase != Pending {
			out = append(out, e.rec)
		}
	}
	slices.SortFunc(out, func(a, b store.Allocation) int { return strings.Compare(a.ContainerID, b.ContainerID) })
	return out
}

// Count is the number of committed allocations.
func (s *State) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.entries {
		if e.phase == Committed {
			n++
		}
	}
	return n
}

// IPAM returns pool usage.
func (s *State) IPAM() []ipam.PoolStats { return s.ipam.Stats() }

// IPOwner tells which container IPAM holds an address for.
func (s *State) IPOwner(ip netip.Addr) (string, bool) { return s.ipam.Owner(ip) }

// PoolOf returns the pool an address belongs to.
func (s *State) PoolOf(ip netip.Addr) (ipam.Pool, bool) { return s.ipam.PoolOf(ip) }
