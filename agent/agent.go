// Package agent is the node agent's pod handler: it turns CNI requests into
// IPAM allocations, persisted records and dataplane programming, in the order
// that keeps every crash recoverable (pending record before any netlink
// work, committed after), and rolls back completely on any error.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/bgp/advert"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/dataplane/anycast"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// Dataplane is what the agent needs from the kernel side.
type Dataplane interface {
	Setup(p dataplane.Pod) (dataplane.Link, error)
	Teardown(containerID string) error
	Check(p dataplane.Pod) error
	HostVeths() ([]string, error)
	DeleteVeth(name string) error
	EnsureNode(summaries []netip.Prefix) error
	SetRoute(dst netip.Prefix, nhs []dataplane.Nexthop) error
	GatewayRoutes() ([]netip.Prefix, error)
}

// Store persists allocation records.
type Store interface {
	Put(a store.Allocation) error
	Delete(containerID string) error
	Load() ([]store.Allocation, error)
}

// Hooks let tests stop the agent at interesting points.
type Hooks struct {
	// BeforeCommit runs after the dataplane is programmed and before the
	// committed record is written.
	BeforeCommit func(containerID string)
}

// Config wires an Agent.
type Config struct {
	Spec      *v1alpha1.NodeConfigSpec
	Store     Store
	Dataplane Dataplane
	Source    podmeta.Source
	Log       *slog.Logger
	Hooks     Hooks
	// ReadyOnCommit treats every committed pod as Ready (standalone mode,
	// where nothing else reports readiness).
	ReadyOnCommit bool
	// Adverts, if set, receives the routes this node should advertise:
	// the summaries, pod IPs outside them, and the anycast and `addresses`
	// IPs of Ready pods.
	Adverts *advert.Set
}

// Agent handles pod network lifecycles on one node.
type Agent struct {
	cfg       Config
	log       *slog.Logger
	ipam      *ipam.Allocator
	defaults  annotations.Defaults
	summaries []netip.Prefix
	anycast   *anycast.Reconciler
	locks     keyedMutex
	ready     atomic.Bool

	mu     sync.Mutex
	allocs map[string]store.Allocation // committed, by container ID
	// claims indexes every anycast and `addresses` IP from allocation on
	// (before the dataplane is touched), so two concurrent ADDs cannot both
	// take one `addresses` IP, nor turn another pod's anycast into one.
	claims map[netip.Addr]*claim
	// stuck holds failed ADDs whose rollback could not remove the veth: their
	// IPs stay reserved until a DEL (or the next start) finishes the job.
	stuck map[string]store.Allocation
	// readiness by pod, as last reported; kept for pods not (yet)
	// allocated, so a report that beats the ADD's commit is not lost.
	readiness map[podmeta.ID]bool
	// pods maps a pod to its attachments (container IDs).
	pods map[podmeta.ID]map[string]bool
}

// New validates the config and builds an agent; Start must run before it
// serves.
func New(cfg Config) (*Agent, error) {
	if err := nodeconfig.Validate(cfg.Spec); err != nil {
		return nil, err
	}
	pools, err := nodeconfig.Pools(cfg.Spec)
	if err != nil {
		return nil, err
	}
	alloc, err := ipam.New(pools)
	if err != nil {
		return nil, err
	}
	algo := ipam.Algo{Kind: ipam.Random}
	if cfg.Spec.Defaults.IPAlgo != "" {
		if algo, err = ipam.ParseAlgo(cfg.Spec.Defaults.IPAlgo); err != nil {
			return nil, err
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	a := &Agent{
		cfg:       cfg,
		log:       cfg.Log,
		ipam:      alloc,
		defaults:  annotations.Defaults{IPv6: cfg.Spec.Defaults.WantIPv6(), IPv4: cfg.Spec.Defaults.IPv4, Algo: algo},
		summaries: nodeconfig.Summaries(cfg.Spec),
		anycast:   anycast.New(cfg.Dataplane),
		allocs:    map[string]store.Allocation{},
		claims:    map[netip.Addr]*claim{},
		stuck:     map[string]store.Allocation{},
		readiness: map[podmeta.ID]bool{},
		pods:      map[podmeta.ID]map[string]bool{},
	}
	return a, nil
}

// Ready reports whether Start has finished.
func (a *Agent) Ready() bool { return a.ready.Load() }

// Start recovers state: committed records go back into IPAM, pending ones
// (a crash mid-ADD) are torn down and dropped, flock veths that no record
// owns are removed, and the anycast routes are rebuilt.
func (a *Agent) Start(ctx context.Context) error {
	if err := a.cfg.Dataplane.EnsureNode(a.summaries); err != nil {
		return fmt.Errorf("node setup: %w", err)
	}
	if a.cfg.Adverts != nil {
		var claims []advert.Claim
		for _, p := range a.summaries {
			claims = append(claims, advert.Claim{Prefix: p, Kind: advert.Summary})
		}
		a.cfg.Adverts.SetOwner(advert.NodeOwner, claims)
	}
	recs, err := a.cfg.Store.Load()
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.State == store.Pending {
			a.log.Warn("dropping allocation left pending by a crash", "container", r.ContainerID, "pod", r.Pod, "ips", r.IPs)
			if err := a.cfg.Dataplane.Teardown(r.ContainerID); err != nil {
				return fmt.Errorf("tear down pending %s: %w", r.ContainerID, err)
			}
			if err := a.cfg.Store.Delete(r.ContainerID); err != nil {
				return err
			}
			continue
		}
		if err := a.restore(r); err != nil {
			return err
		}
	}
	owned := map[string]bool{}
	for _, r := range a.allocs {
		owned[r.HostVeth] = true
	}
	veths, err := a.cfg.Dataplane.HostVeths()
	if err != nil {
		return err
	}
	for _, v := range veths {
		if !owned[v] {
			a.log.Warn("removing flock veth that no allocation owns", "veth", v)
			if err := a.cfg.Dataplane.DeleteVeth(v); err != nil {
				return err
			}
		}
	}
	existing, err := a.cfg.Dataplane.GatewayRoutes()
	if err != nil {
		return err
	}
	if err := a.anycast.Resync(existing); err != nil {
		a.log.Error("anycast resync", "err", err)
	}
	a.ready.Store(true)
	a.log.Info("agent ready", "allocations", len(a.allocs), "summaries", a.summaries)
	return nil
}

func (a *Agent) restore(r store.Allocation) error {
	for _, ip := range r.IPs {
		if err := a.ipam.Reserve(ip, r.ContainerID); err != nil {
			if errors.Is(err, ipam.ErrConflict) {
				return fmt.Errorf("store: allocation %s: %w", r.ContainerID, err)
			}
			// The pool may have been removed from NodeConfig: the pod keeps
			// its address, the pool is just no longer handed out.
			a.log.Warn("restored address is outside the configured pools", "container", r.ContainerID, "ip", ip, "err", err)
		}
	}
	if err := a.claimLocked(r); err != nil {
		return fmt.Errorf("store: allocation %s: %w", r.ContainerID, err)
	}
	a.allocs[r.ContainerID] = r
	a.indexPodLocked(r)
	a.publish(r, a.cfg.ReadyOnCommit || a.readiness[r.Pod])
	return nil
}

func (a *Agent) indexPodLocked(r store.Allocation) {
	k := r.Pod
	if a.pods[k] == nil {
		a.pods[k] = map[string]bool{}
	}
	a.pods[k][r.ContainerID] = true
}

func (a *Agent) unindexPodLocked(r store.Allocation) {
	k := r.Pod
	delete(a.pods[k], r.ContainerID)
	if len(a.pods[k]) == 0 {
		delete(a.pods, k)
	}
}

// publish pushes one pod's state to the kernel anycast routes and the
// desired BGP set.
func (a *Agent) publish(r store.Allocation, ready bool) {
	if err := a.anycast.Update(a.member(r, ready)); err != nil {
		a.log.Error("anycast", "container", r.ContainerID, "err", err)
	}
	if a.cfg.Adverts != nil {
		a.cfg.Adverts.SetOwner(r.ContainerID, a.advertClaims(r, ready))
	}
}

// advertClaims is what a pod contributes to the advertised set: its own IPs when
// they lie outside the node summaries (always: the pod exists), and its
// anycast and `addresses` IPs while it is Ready.
func (a *Agent) advertClaims(r store.Allocation, ready bool) []advert.Claim {
	var out []advert.Claim
	for _, ip := range r.IPs {
		if !a.inSummary(ip) {
			out = append(out, advert.Claim{Prefix: netip.PrefixFrom(ip, ip.BitLen()), Kind: advert.Pod})
		}
	}
	if ready {
		for _, ip := range r.Anycast {
			out = append(out, advert.Claim{Prefix: netip.PrefixFrom(ip, ip.BitLen()), Kind: advert.Anycast})
		}
		for _, ip := range r.Addresses {
			out = append(out, advert.Claim{Prefix: netip.PrefixFrom(ip, ip.BitLen()), Kind: advert.Address})
		}
	}
	return out
}

func (a *Agent) inSummary(ip netip.Addr) bool {
	for _, s := range a.summaries {
		if s.Contains(ip) {
			return true
		}
	}
	return false
}

// SetPodReady records a pod's readiness and re-publishes the anycast and
// `addresses` IPs of its attachments at once (kernel routes and BGP).
func (a *Agent) SetPodReady(k podmeta.ID, ready bool) {
	a.mu.Lock()
	prev, known := a.readiness[k]
	a.readiness[k] = ready
	var recs []store.Allocation
	if !known || prev != ready {
		for id := range a.pods[k] {
			recs = append(recs, a.allocs[id])
		}
	}
	a.mu.Unlock()
	for _, r := range recs {
		a.publish(r, ready || a.cfg.ReadyOnCommit)
		a.log.Info("pod readiness changed", "pod", k, "ready", ready, "container", r.ContainerID)
	}
}

// ForgetPod drops the readiness kept for a pod that left the API.
func (a *Agent) ForgetPod(id podmeta.ID) {
	a.mu.Lock()
	delete(a.readiness, id)
	a.mu.Unlock()
}

func (a *Agent) member(r store.Allocation, ready bool) anycast.Member {
	return anycast.Member{ContainerID: r.ContainerID, HostVeth: r.HostVeth, IPs: r.IPs, Anycast: r.Anycast, Addresses: r.Addresses, Ready: ready}
}

func (a *Agent) get(id string) (store.Allocation, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.allocs[id]
	return r, ok
}

// Allocations returns the committed allocations, sorted by container ID.
func (a *Agent) Allocations() []store.Allocation {
	a.mu.Lock()
	out := make([]store.Allocation, 0, len(a.allocs))
	for _, r := range a.allocs {
		out = append(out, r)
	}
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y store.Allocation) int { return strings.Compare(x.ContainerID, y.ContainerID) })
	return out
}

// PodAllocations returns one pod's allocations, from the pod index (no
// scan over every allocation).
func (a *Agent) PodAllocations(pod podmeta.ID) []store.Allocation {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []store.Allocation
	for id := range a.pods[pod] {
		out = append(out, a.allocs[id])
	}
	return out
}

// Count is the number of committed allocations.
func (a *Agent) Count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.allocs)
}

// IPAM returns pool usage.
func (a *Agent) IPAM() []ipam.PoolStats { return a.ipam.Stats() }

// AnycastRoutes returns the installed anycast/addresses host routes.
func (a *Agent) AnycastRoutes() []anycast.Route { return a.anycast.Routes() }

// Add runs the ADD flow and returns the committed allocation.
func (a *Agent) Add(ctx context.Context, containerID, netns, ifName, cniArgs string) (store.Allocation, error) {
	if err := validateAttachment(containerID, netns, ifName); err != nil {
		return store.Allocation{}, err
	}
	args, err := podmeta.ParseArgs(cniArgs)
	if err != nil {
		return store.Allocation{}, &Error{Code: codeEnv, Err: err}
	}
	unlock := a.locks.Lock(containerID)
	defer unlock()

	if r, ok := a.get(containerID); ok {
		if r.IfName != ifName {
			return store.Allocation{}, &Error{Code: codeConfig, Err: fmt.Errorf("container %s already has flock interface %s; a second interface %s is not supported", containerID, r.IfName, ifName)}
		}
		return r, nil // kubelet retried an ADD that succeeded
	}
	if _, err := a.finishStuck(containerID); err != nil {
		return store.Allocation{}, fmt.Errorf("an earlier failed ADD of %s cannot be cleaned up: %w", containerID, err)
	}
	pod, err := a.cfg.Source.Lookup(ctx, args)
	if err != nil {
		return store.Allocation{}, err
	}
	req, err := annotations.Parse(pod.Annotations, a.defaults)
	if err != nil {
		return store.Allocation{}, err
	}
	rec := store.Allocation{
		ContainerID: containerID, IfName: ifName, Netns: netns,
		HostVeth: dataplane.HostVethName(containerID), State: store.Pending,
		Pod:     pod.ID,
		Anycast: req.Anycast, Addresses: req.Addresses, Created: time.Now().UTC(),
	}
	if err := a.claim(rec); err != nil {
		return store.Allocation{}, err
	}
	committed := false
	defer func() {
		if !committed {
			a.rollback(rec)
		}
	}()
	id := ipam.Identity{Namespace: pod.Namespace, App: pod.App, Image: pod.Image, ContainerID: containerID}
	for _, fam := range []struct {
		want bool
		n    int
		rng  netip.Prefix
	}{{req.IPv6, 6, req.CIDR6}, {req.IPv4, 4, req.CIDR4}} {
		if !fam.want {
			continue
		}
		ip, err := a.ipam.Allocate(ipam.Request{Owner: containerID, Family: fam.n, Range: fam.rng, Algo: req.Algo, Identity: id})
		if err != nil {
			return store.Allocation{}, err
		}
		rec.IPs = append(rec.IPs, ip)
	}
	// Persist before touching the kernel: a crash from here on leaves a
	// record that the next start tears down.
	if err := a.cfg.Store.Put(rec); err != nil {
		return store.Allocation{}, err
	}
	link, err := a.cfg.Dataplane.Setup(dataplane.Pod{ContainerID: containerID, Netns: netns, IfName: ifName, IPs: rec.IPs, Addresses: rec.Addresses, Anycast: rec.Anycast})
	if err != nil {
		return store.Allocation{}, err
	}
	rec.HostMAC, rec.PodMAC = link.HostMAC.String(), link.PodMAC.String()
	if h := a.cfg.Hooks.BeforeCommit; h != nil {
		h(containerID)
	}
	rec.State = store.Committed
	if err := a.cfg.Store.Put(rec); err != nil {
		return store.Allocation{}, err
	}
	committed = true
	a.mu.Lock()
	a.allocs[containerID] = rec
	a.indexPodLocked(rec)
	ready := a.readiness[rec.Pod] || a.cfg.ReadyOnCommit
	a.mu.Unlock()
	a.publish(rec, ready)
	a.log.Info("pod added", "container", containerID, "pod", pod.ID, "ips", rec.IPs, "veth", rec.HostVeth)
	return rec, nil
}

// claim is the set of pods claiming one anycast or `addresses` IP.
type claim struct {
	kind   anycast.Kind
	owners map[string]bool
}

func (c *claim) other(id string) string {
	for o := range c.owners {
		if o != id {
			return o
		}
	}
	return ""
}

// claim checks the anycast/addresses IPs and indexes them.
func (a *Agent) claim(rec store.Allocation) error {
	for _, set := range []struct {
		key string
		ips []netip.Addr
	}{{annotations.Anycast, rec.Anycast}, {annotations.Addresses, rec.Addresses}} {
		for _, ip := range set.ips {
			if p, ok := a.ipam.PoolOf(ip); ok {
				return &annotations.Error{Key: set.key, Value: ip.String(), Reason: fmt.Sprintf("inside pod pool %s, where IPAM hands addresses out", p.Prefix)}
			}
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.claimLocked(rec)
}

// claimLocked: an `addresses` IP belongs to one pod; an anycast IP may be
// shared, but never with a pod that holds it as an `addresses` IP.
func (a *Agent) claimLocked(rec store.Allocation) error {
	id := rec.ContainerID
	for _, ip := range rec.Addresses {
		if c := a.claims[ip]; c != nil {
			if o := c.other(id); o != "" {
				return &Error{Code: codeConfig, Err: fmt.Errorf("annotation %s: %s is already claimed by container %s (as %s)", annotations.Addresses, ip, o, c.kind)}
			}
		}
	}
	for _, ip := range rec.Anycast {
		if c := a.claims[ip]; c != nil && c.kind == anycast.KindAddress {
			if o := c.other(id); o != "" {
				return &Error{Code: codeConfig, Err: fmt.Errorf("annotation %s: %s is an `addresses` IP of container %s, not anycast", annotations.Anycast, ip, o)}
			}
		}
	}
	for _, set := range []struct {
		kind anycast.Kind
		ips  []netip.Addr
	}{{anycast.KindAnycast, rec.Anycast}, {anycast.KindAddress, rec.Addresses}} {
		for _, ip := range set.ips {
			c := a.claims[ip]
			if c == nil {
				c = &claim{kind: set.kind, owners: map[string]bool{}}
				a.claims[ip] = c
			}
			c.owners[id] = true
		}
	}
	return nil
}

// rollback undoes a failed ADD: kernel state, record, IPs, claims.
func (a *Agent) rollback(rec store.Allocation) {
	if err := a.cfg.Dataplane.Teardown(rec.ContainerID); err != nil {
		// Keep the IPs and the pending record: handing the IPs out again
		// while the old veth may still route them would be worse than
		// holding them until DEL (which the runtime sends after a failed
		// ADD) or the next start finishes the teardown.
		a.log.Error("rollback: teardown failed; IPs stay reserved until DEL", "container", rec.ContainerID, "err", err)
		a.mu.Lock()
		a.stuck[rec.ContainerID] = rec
		a.mu.Unlock()
		return
	}
	if err := a.cfg.Store.Delete(rec.ContainerID); err != nil {
		a.log.Error("rollback: delete record", "container", rec.ContainerID, "err", err)
	}
	a.release(rec)
}

func (a *Agent) release(rec store.Allocation) {
	for _, ip := range rec.IPs {
		a.ipam.Release(ip, rec.ContainerID)
	}
	a.mu.Lock()
	for _, ip := range append(append([]netip.Addr{}, rec.Anycast...), rec.Addresses...) {
		if c := a.claims[ip]; c != nil {
			delete(c.owners, rec.ContainerID)
			if len(c.owners) == 0 {
				delete(a.claims, ip)
			}
		}
	}
	a.mu.Unlock()
}

// finishStuck completes the rollback of a failed ADD whose teardown failed.
// Call with the container's lock held.
func (a *Agent) finishStuck(containerID string) (bool, error) {
	a.mu.Lock()
	rec, ok := a.stuck[containerID]
	a.mu.Unlock()
	if !ok {
		return false, nil
	}
	if err := a.cfg.Dataplane.Teardown(containerID); err != nil {
		return true, err
	}
	if err := a.cfg.Store.Delete(containerID); err != nil {
		return true, err
	}
	a.mu.Lock()
	delete(a.stuck, containerID)
	a.mu.Unlock()
	a.release(rec)
	return true, nil
}

// Del tears a container down. Unknown containers succeed; a leftover veth
// of that name is still removed.
func (a *Agent) Del(ctx context.Context, containerID string) error {
	if err := validateContainerID(containerID); err != nil {
		return err
	}
	unlock := a.locks.Lock(containerID)
	defer unlock()
	rec, known := a.get(containerID)
	if done, err := a.finishStuck(containerID); done || err != nil {
		return err
	}
	if known {
		if err := a.anycast.Remove(containerID); err != nil {
			a.log.Error("anycast", "container", containerID, "err", err)
		}
		if a.cfg.Adverts != nil {
			a.cfg.Adverts.SetOwner(containerID, nil)
		}
	}
	if err := a.cfg.Dataplane.Teardown(containerID); err != nil {
		return err
	}
	if !known {
		return nil
	}
	if err := a.cfg.Store.Delete(containerID); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.allocs, containerID)
	a.unindexPodLocked(rec)
	a.mu.Unlock()
	a.release(rec)
	a.log.Info("pod deleted", "container", containerID, "pod", rec.Pod, "ips", rec.IPs)
	return nil
}

// Check compares the kernel with the record; prev, if set, are the IPs of
// the runtime's cached result, which must match the record.
func (a *Agent) Check(ctx context.Context, containerID, ifName string, prev []netip.Addr) error {
	if err := validateContainerID(containerID); err != nil {
		return err
	}
	unlock := a.locks.Lock(containerID)
	defer unlock()
	rec, ok := a.get(containerID)
	if !ok {
		return &Error{Code: codeUnknownContainer, Err: fmt.Errorf("no flock allocation for container %s", containerID)}
	}
	if ifName != "" && ifName != rec.IfName {
		return &Error{Code: codeConfig, Err: fmt.Errorf("container %s: flock interface is %s, not %s", containerID, rec.IfName, ifName)}
	}
	if prev != nil {
		want := append(v6First(rec.IPs), rec.Addresses...)
		if !sameSet(prev, want) {
			return fmt.Errorf("container %s: cached result has IPs %v, the agent has %v", containerID, prev, want)
		}
	}
	return a.cfg.Dataplane.Check(dataplane.Pod{ContainerID: rec.ContainerID, Netns: rec.Netns, IfName: rec.IfName, IPs: rec.IPs, Addresses: rec.Addresses, Anycast: rec.Anycast})
}

func sameSet(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	x := slices.Clone(a)
	y := slices.Clone(b)
	slices.SortFunc(x, netip.Addr.Compare)
	slices.SortFunc(y, netip.Addr.Compare)
	return slices.Equal(x, y)
}

// Attachment names one container interface the runtime still uses.
type Attachment struct{ ContainerID, IfName string }

// GC deletes every allocation whose attachment the runtime no longer
// lists (CNI GC, spec 1.1).
func (a *Agent) GC(ctx context.Context, valid []Attachment) error {
	keep := map[Attachment]bool{}
	for _, v := range valid {
		keep[v] = true
	}
	var errs []error
	for _, r := range a.Allocations() {
		if keep[Attachment{r.ContainerID, r.IfName}] {
			continue
		}
		a.log.Info("GC: releasing attachment the runtime no longer knows", "container", r.ContainerID, "ifname", r.IfName)
		if err := a.Del(ctx, r.ContainerID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// keyedMutex serialises operations on one container ID.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedMutex) Lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
