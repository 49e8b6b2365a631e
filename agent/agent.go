// Package agent is the node agent's pod lifecycle: it turns CNI requests
// into changes of the node state (agent/nodestate), persisted records and
// dataplane programming, in the order that keeps every crash recoverable
// (pending record before any netlink work, committed after), and rolls back
// completely on any error. It never publishes a route: the reconcilers
// derive BGP paths and kernel host routes from the state; ADD and DEL only
// wait (bounded) until they have applied the change.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Dataplane is what the agent needs from the kernel for pod attachments.
type Dataplane interface {
	Setup(p dataplane.Pod) (dataplane.Link, error)
	// Retire takes a host veth down (no traffic, no routes through it)
	// without unregistering it, which costs the kernel an RCU grace period.
	Retire(hostVeth string) error
	Teardown(hostVeth string) error
	Check(p dataplane.Pod) error
	HostVeths() ([]string, error)
	NetnsExists(path string) (bool, error)
	EnsureNode(summaries []netip.Prefix) error
}

// Store persists allocation records: an ADD's pending record (Begin,
// before the kernel is touched), then committed (Commit).
type Store interface {
	Begin(a store.Allocation) (*store.Draft, error)
	Commit(d *store.Draft) error
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

// Reasons an allocation is reaped (flock_allocations_reaped_total{reason}).
const (
	ReapNetnsGone   = "netns-gone"      // the pod's network namespace no longer exists (a reboot)
	ReapInterrupted = "interrupted-add" // a pending record left by a crash mid-ADD
)

// Config wires an Agent.
type Config struct {
	Spec      *v1alpha1.NodeConfigSpec
	State     *nodestate.State
	Store     Store
	Dataplane Dataplane
	Source    podmeta.Source
	Log       *slog.Logger
	Hooks     Hooks
	// Settle waits until the route reconcilers have applied state
	// generation gen; nil means no reconcilers (unit tests). ADD returns,
	// and DEL removes the veth, only after it (bounded by SettleTimeout).
	Settle func(ctx context.Context, gen uint64) error
	// SettleTimeout bounds Settle (default 2 s): a failing reconciler
	// retries on its own and must not hang the runtime.
	SettleTimeout time.Duration
	// Reaped, if set, counts reaped allocations by reason.
	Reaped func(reason string)
	// ReapFailed, if set, counts failed reaps (each is retried).
	ReapFailed func()
	// Authority, if set, must allow every anycast, addresses, cidr6 and
	// cidr4 value a pod asks for (nil: everything is allowed).
	Authority Authority
	// Claims, if set, makes addresses and pod IPs outside the summaries
	// unique cluster-wide (nil: per node, standalone mode).
	Claims Claims
	// ReapInterval is the period of Run's netns check (default 30 s).
	ReapInterval time.Duration
	// AddTimeout bounds an ADD (default DefaultAddTimeout).
	AddTimeout time.Duration
}

// DefaultAddTimeout bounds an ADD: well within the plugin's wait for the
// agent (wire.DefaultIOTimeout), so the runtime gets flock's error, not a
// timeout of its own.
const DefaultAddTimeout = 20 * time.Second

// Agent handles pod network lifecycles on one node.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	state    *nodestate.State
	defaults annotations.Defaults
	locks    keyedMutex
	// suspects are containers whose veth vanished: Run checks their netns
	// at once instead of at the next repair.
	suspects chan string
	// claimsChanged: a claim of this node left the API (ClaimsChanged).
	claimsChanged chan struct{}
	// retries are the failed reaps Run tries again.
	retries backoffs
	// removals are the veth removals a DEL left running (see Del).
	removals removals
}

// removals tracks goroutines that unregister veths after their DEL
// returned; waiting takes a snapshot, so churn cannot starve a waiter.
type removals struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]chan struct{}
}

func (r *removals) start() (done func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[uint64]chan struct{}{}
	}
	id, ch := r.next, make(chan struct{})
	r.next++
	r.m[id] = ch
	return func() {
		r.mu.Lock()
		delete(r.m, id)
		r.mu.Unlock()
		close(ch)
	}
}

// wait waits for the removals running now and tells whether there were any.
func (r *removals) wait() bool {
	r.mu.Lock()
	chs := make([]chan struct{}, 0, len(r.m))
	for _, ch := range r.m {
		chs = append(chs, ch)
	}
	r.mu.Unlock()
	for _, ch := range chs {
		<-ch
	}
	return len(chs) > 0
}

// New validates the config and builds an agent; Restore must run before it
// serves.
func New(cfg Config) (*Agent, error) {
	if err := nodeconfig.Validate(cfg.Spec); err != nil {
		return nil, err
	}
	if cfg.State == nil {
		return nil, errors.New("agent: no node state")
	}
	algo := ipam.Algo{Kind: ipam.Random}
	if cfg.Spec.Defaults.IPAlgo != "" {
		var err error
		if algo, err = ipam.ParseAlgo(cfg.Spec.Defaults.IPAlgo); err != nil {
			return nil, err
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.SettleTimeout <= 0 {
		cfg.SettleTimeout = 2 * time.Second
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = 30 * time.Second
	}
	if cfg.AddTimeout <= 0 {
		cfg.AddTimeout = DefaultAddTimeout
	}
	return &Agent{
		cfg: cfg, log: cfg.Log, state: cfg.State, suspects: make(chan string, 64), claimsChanged: make(chan struct{}, 1),
		defaults: annotations.Defaults{IPv6: cfg.Spec.Defaults.WantIPv6(), IPv4: cfg.Spec.Defaults.IPv4, Algo: algo},
	}, nil
}

// State is the node state the agent changes.
func (a *Agent) State() *nodestate.State { return a.state }

// Restore recovers the node at start, before anything is served: committed
// records go back into the state (unless their network namespace is gone:
// those are reaped), pending ones (a crash mid-ADD) are torn down and
// dropped, and flock veths that no record owns are removed. One record
// that cannot be restored or torn down never keeps the node from serving
// (nor from receiving the DEL that clears it): it is quarantined as Stuck.
// A record that cannot even be read does stop the start (store.Load): what
// it holds is unknown, and handing its IPs out again could duplicate them.
func (a *Agent) Restore(ctx context.Context) error {
	if err := a.cfg.Dataplane.EnsureNode(a.state.Summaries()); err != nil {
		return fmt.Errorf("node setup: %w", err)
	}
	recs, err := a.cfg.Store.Load()
	if err != nil {
		return err
	}
	quarantine := func(r store.Allocation, why string, err error) {
		reason := fmt.Sprintf("%s: %v", why, err)
		a.log.Error("quarantined allocation: it is routed nowhere until a DEL or GC removes it", "container", r.ContainerID, "pod", r.Pod, "ips", r.IPs, "reason", reason)
		a.state.Quarantine(r, reason)
	}
	for _, r := range recs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.State == store.Pending {
			a.log.Warn("dropping allocation left pending by a crash", "container", r.ContainerID, "pod", r.Pod, "ips", r.IPs)
			if err := a.dropRecord(r, ReapInterrupted); err != nil {
				quarantine(r, "tear down an interrupted ADD", err)
			}
			continue
		}
		gone, err := a.netnsGone(r)
		if err != nil {
			a.log.Warn("cannot tell whether the network namespace exists; keeping the allocation", "container", r.ContainerID, "err", err)
		} else if gone {
			a.log.Warn("reaping allocation whose network namespace is gone", "container", r.ContainerID, "pod", r.Pod, "netns", r.Netns, "ips", r.IPs)
			if err := a.dropRecord(r, ReapNetnsGone); err != nil {
				quarantine(r, "reap (netns gone)", err)
			}
			continue
		}
		r = a.withStaticUID(r)
		warns, err := a.state.Restore(r)
		if err != nil {
			quarantine(r, "restore", err)
			continue
		}
		for _, w := range warns {
			a.log.Warn("restore: " + w)
		}
	}
	a.ensureClaims(ctx)
	a.releaseUnowned(ctx)
	veths, err := a.cfg.Dataplane.HostVeths()
	if err != nil {
		return err
	}
	for _, v := range veths {
		if _, owned := a.state.VethOwner(v); !owned {
			a.log.Warn("removing flock veth that no allocation owns", "veth", v)
			if err := a.cfg.Dataplane.Teardown(v); err != nil {
				a.log.Error("orphan veth stays", "veth", v, "err", err)
			}
		}
	}
	a.log.Info("allocations recovered", "allocations", a.state.Count(), "summaries", a.state.Summaries())
	return nil
}

// dropRecord removes a record that never made it into the state.
func (a *Agent) dropRecord(r store.Allocation, reason string) error {
	if r.HostVeth != "" {
		if err := a.cfg.Dataplane.Teardown(r.HostVeth); err != nil {
			return err
		}
	}
	a.releaseClaims(context.Background(), a.claimsOf(r, nil, nil))
	if err := a.cfg.Store.Delete(r.ContainerID); err != nil {
		return err
	}
	a.reaped(reason)
	return nil
}

func (a *Agent) reaped(reason string) {
	if a.cfg.Reaped != nil {
		a.cfg.Reaped(reason)
	}
}

func (a *Agent) netnsGone(r store.Allocation) (bool, error) {
	ok, err := a.cfg.Dataplane.NetnsExists(r.Netns)
	if err != nil {
		return false, fmt.Errorf("allocation %s: %w", r.ContainerID, err)
	}
	return !ok, nil
}

// Run is the periodic repair of pod attachments (Repair, every
// ReapInterval), reaps a vanished veth's owner at once, and retries a
// failed reap with back-off until it succeeds.
func (a *Agent) Run(ctx context.Context) error {
	t := time.NewTicker(a.cfg.ReapInterval)
	defer t.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			a.Repair(ctx)
		case id := <-a.suspects:
			a.reapOne(ctx, id)
		case <-retry.C:
			for _, id := range a.retries.due(time.Now()) {
				a.reapOne(ctx, id)
			}
		case <-a.claimsChanged:
			a.ensureClaims(ctx)
		}
		if next, ok := a.retries.next(); ok {
			retry.Reset(time.Until(next))
		}
	}
}

// Repair reaps every attachment whose network namespace is gone and makes
// the cluster-wide claims match the attachments: a claim deleted by hand
// while its pod runs is claimed again, one no attachment holds is given
// back.
func (a *Agent) Repair(ctx context.Context) {
	a.ReapGone(ctx)
	a.ensureClaims(ctx)
	a.releaseUnowned(ctx)
}

// VethGone reports a host veth that vanished without a DEL: if its owner's
// network namespace is gone too, Run reaps it now rather than at the next
// repair. (A full queue is fine: the repair finds it.)
func (a *Agent) VethGone(name string) {
	id, ok := a.state.VethOwner(name)
	if !ok {
		return
	}
	select {
	case a.suspects <- id:
	default:
	}
}

// ClaimsChanged reports that a cluster-wide claim of this node left the
// API: Run claims again, at once rather than at the next repair, what the
// committed allocations still need.
func (a *Agent) ClaimsChanged() {
	select {
	case a.claimsChanged <- struct{}{}:
	default:
	}
}

// ReapGone reaps every attachment whose netns is gone: committed ones,
// and those a failed DEL or reap left deleting or stuck.
func (a *Agent) ReapGone(ctx context.Context) {
	for _, r := range a.state.Attachments(nodestate.Committed, nodestate.Deleting, nodestate.Stuck) {
		if gone, err := a.netnsGone(r.Allocation); err != nil || !gone {
			continue
		}
		a.reapOne(ctx, r.ContainerID)
	}
}

// reapOne reaps one attachment if its netns is gone; a failure is
// counted, logged and retried with back-off (Run).
func (a *Agent) reapOne(ctx context.Context, id string) {
	err := a.reap(ctx, id)
	if err == nil {
		a.retries.done(id)
		return
	}
	n, wait := a.retries.failed(id, time.Now(), a.cfg.ReapInterval)
	if a.cfg.ReapFailed != nil {
		a.cfg.ReapFailed()
	}
	a.log.Error("reap failed; retrying", "container", id, "attempt", n, "retry-in", wait, "err", err)
}

func (a *Agent) reap(ctx context.Context, id string) error {
	unlock := a.locks.Lock(id)
	defer unlock()
	r, phase, ok := a.state.Get(id)
	if !ok || phase == nodestate.Pending {
		return nil // a DEL came first, or an ADD is running
	}
	if gone, err := a.netnsGone(r); err != nil || !gone {
		return err
	}
	a.log.Warn("reaping allocation whose network namespace is gone", "container", id, "pod", r.Pod, "netns", r.Netns, "ips", r.IPs, "phase", phase)
	var err error
	if phase == nodestate.Stuck {
		err = a.teardown(r)
	} else {
		err = a.remove(ctx, r)
	}
	if err != nil {
		return err
	}
	a.reaped(ReapNetnsGone)
	return nil
}

// settle waits (bounded) until the reconcilers applied gen.
func (a *Agent) settle(ctx context.Context, gen uint64) {
	if a.cfg.Settle == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.SettleTimeout)
	defer cancel()
	if err := a.cfg.Settle(ctx, gen); err != nil {
		a.log.Warn("routes not yet reconciled; the reconcilers keep trying", "generation", gen, "err", err)
	}
}

// SetPodReady records a pod's readiness; the reconcilers follow at once.
func (a *Agent) SetPodReady(pod podmeta.ID, ready bool) {
	if a.state.SetReady(pod, ready) {
		a.log.Info("pod readiness changed", "pod", pod, "uid", pod.UID, "staticUID", pod.StaticUID, "ready", ready)
	}
}

// ForgetPod drops the readiness kept for a pod that left the API.
func (a *Agent) ForgetPod(pod podmeta.ID) { a.state.ForgetPod(pod) }

// Allocations returns the committed allocations, sorted by container ID.
func (a *Agent) Allocations() []store.Allocation { return a.state.Committed() }

// PodAllocations returns one pod's allocations (for the leak GC).
func (a *Agent) PodAllocations(pod podmeta.ID) []store.Allocation {
	return a.state.PodAllocations(pod)
}

// Add runs the ADD flow and returns the committed allocation. It ends
// within AddTimeout whatever stalls (the API server, another operation
// on the container), rolled back completely.
func (a *Agent) Add(ctx context.Context, containerID, netns, ifName, cniArgs string) (store.Allocation, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.AddTimeout)
	defer cancel()
	rec, err := a.add(ctx, containerID, netns, ifName, cniArgs)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = &Error{Code: codeTryAgain, Err: fmt.Errorf("ADD of container %s did not finish within %v; nothing was kept: %w", containerID, a.cfg.AddTimeout, err)}
	}
	return rec, err
}

func (a *Agent) add(ctx context.Context, containerID, netns, ifName, cniArgs string) (store.Allocation, error) {
	if err := validateAttachment(containerID, netns, ifName); err != nil {
		return store.Allocation{}, err
	}
	args, err := podmeta.ParseArgs(cniArgs)
	if err != nil {
		return store.Allocation{}, &Error{Code: codeEnv, Err: err}
	}
	start := time.Now()
	unlock, err := a.locks.LockCtx(ctx, containerID)
	if err != nil {
		return store.Allocation{}, fmt.Errorf("waiting for another operation on container %s: %w", containerID, err)
	}
	defer unlock()

	if r, phase, ok := a.state.Get(containerID); ok {
		switch phase {
		case nodestate.Committed:
			if r.IfName != ifName {
				return store.Allocation{}, &Error{Code: codeConfig, Err: fmt.Errorf("container %s already has flock interface %s; a second interface %s is not supported", containerID, r.IfName, ifName)}
			}
			return r, nil // kubelet retried an ADD that succeeded
		case nodestate.Stuck:
			if err := a.teardown(r); err != nil {
				return store.Allocation{}, fmt.Errorf("an earlier failed ADD of %s cannot be cleaned up: %w", containerID, err)
			}
		default:
			return store.Allocation{}, &Error{Code: codeTryAgain, Err: fmt.Errorf("container %s is being deleted (an earlier DEL failed); retry the DEL first", containerID)}
		}
	}
	pod, err := a.cfg.Source.Lookup(ctx, args)
	if err != nil {
		return store.Allocation{}, err
	}
	req, err := annotations.Parse(pod.Annotations, a.defaults)
	if err != nil {
		return store.Allocation{}, err
	}
	// Nothing is allocated for a value no AddressPool allows.
	pools, ranges, err := a.authorize(pod, req)
	if err != nil {
		return store.Allocation{}, err
	}
	rec, draft, err := a.reserve(ctx, containerID, ifName, netns, pod, req, pools, ranges)
	if err != nil && heldByDeleted(err) {
		// An address (or the last free one) may be held only by a deleted
		// pod whose veth is being unregistered (or was a moment ago): try
		// again once that is done rather than refuse the ADD.
		a.removals.wait()
		rec, draft, err = a.reserve(ctx, containerID, ifName, netns, pod, req, pools, ranges)
	}
	if err != nil {
		return store.Allocation{}, err
	}
	committed := false
	defer func() {
		if !committed {
			a.rollback(rec, a.claimsOf(rec, nil, nil))
		}
	}()
	reserved := time.Now()
	_, err = a.cfg.Dataplane.Setup(podOf(rec))
	if errors.Is(err, dataplane.ErrInterfaceExists) && a.removals.wait() {
		// The name may be a deleted pod's, in the same netns, whose veth
		// is still being removed (a runtime that ADDs into a netns right
		// after a DEL from it): try again once the removals running now
		// are done. Nothing was created.
		_, err = a.cfg.Dataplane.Setup(podOf(rec))
	}
	if err != nil {
		return store.Allocation{}, err
	}
	programmed := time.Now()
	if h := a.cfg.Hooks.BeforeCommit; h != nil {
		h(containerID)
	}
	rec.State = store.Committed
	if err := a.cfg.Store.Commit(draft); err != nil {
		return store.Allocation{}, err
	}
	gen, err := a.state.Commit(rec)
	if err != nil {
		return store.Allocation{}, err
	}
	committed = true
	stored := time.Now()
	a.settle(ctx, gen) // the UPDATE leaves before ADD returns
	a.log.Info("pod added", "container", containerID, "pod", pod.ID, "ips", rec.IPs, "veth", rec.HostVeth,
		"reserve", reserved.Sub(start), "dataplane", programmed.Sub(reserved), "commit", stored.Sub(programmed), "advertise", time.Since(stored))
	return rec, nil
}

// claimAttempts bounds the retries of a pod address from a cluster-wide
// range that another node claimed first (its claim not yet in our cache).
const claimAttempts = 4

// reserve takes what an ADD needs — IPs, local claims, veth name and the
// veth's MACs (so the record is whole before the kernel is touched) —
// writes the pending record (a crash from here on leaves a record the
// next start tears down; it reaches the disk while the veth is
// programmed) and takes the cluster-wide claims. A pod address from a
// range that another node took meanwhile is picked again; an IP the pod
// asked for by name is not.
func (a *Agent) reserve(ctx context.Context, containerID, ifName, netns string, pod podmeta.Pod, req annotations.Request, pools grants, ranges map[netip.Prefix]string) (store.Allocation, *store.Draft, error) {
	id := ipam.Identity{Namespace: pod.Namespace, App: pod.App, Image: pod.Image, ContainerID: containerID}
	lost := map[netip.Addr]bool{} // claimed elsewhere during this ADD
	for attempt := 1; ; attempt++ {
		var reqs []ipam.Request
		for _, fam := range []struct {
			want bool
			n    int
			rng  netip.Prefix
		}{{req.IPv6, 6, req.CIDR6}, {req.IPv4, 4, req.CIDR4}} {
			if !fam.want {
				continue
			}
			r := ipam.Request{Family: fam.n, Range: fam.rng, Algo: req.Algo, Identity: id}
			if a.cfg.Claims != nil && fam.rng.IsValid() && !a.inSummary(fam.rng) {
				// Only pods from cluster-wide ranges pay for this.
				r.Avoid = func(ip netip.Addr) bool { return lost[ip] || a.cfg.Claims.Taken(ip) }
			}
			reqs = append(reqs, r)
		}
		rec, err := a.state.Reserve(store.Allocation{
			ContainerID: containerID, IfName: ifName, Netns: netns, Pod: pod.ID,
			Anycast: req.Anycast, Addresses: req.Addresses, Created: time.Now().UTC(),
			HostMAC: dataplane.RandomMAC().String(), PodMAC: dataplane.RandomMAC().String(),
		}, reqs)
		if err != nil {
			return store.Allocation{}, nil, err
		}
		draft, err := a.cfg.Store.Begin(rec)
		if err != nil {
			a.rollback(rec, nil)
			return store.Allocation{}, nil, err
		}
		if a.cfg.Claims == nil {
			return rec, draft, nil
		}
		if _, err = a.claim(ctx, a.claimsOf(rec, pools, ranges)); err == nil {
			return rec, draft, nil
		}
		a.rollback(rec, nil) // claim gave back what it took
		var ce *ClaimError
		if !errors.As(err, &ce) || !errors.Is(err, ErrClaimed) || attempt == claimAttempts {
			return store.Allocation{}, nil, err
		}
		rng := req.CIDR6
		if ce.IP.Is4() {
			rng = req.CIDR4
		}
		if ce.Use != v1alpha1.UsePod || rng.IsSingleIP() {
			return store.Allocation{}, nil, err // the pod asked for exactly that IP
		}
		lost[ce.IP] = true
		a.log.Info("pod address claimed by another node meanwhile; picking another", "container", containerID, "attempt", attempt, "err", err)
	}
}

func podOf(r store.Allocation) dataplane.Pod {
	p := dataplane.Pod{ContainerID: r.ContainerID, HostVeth: r.HostVeth, Netns: r.Netns, IfName: r.IfName, IPs: r.IPs, Addresses: r.Addresses, Anycast: r.Anycast}
	// Records are written with both MACs; an unreadable one leaves the
	// kernel to pick.
	p.HostMAC, _ = net.ParseMAC(r.HostMAC)
	p.PodMAC, _ = net.ParseMAC(r.PodMAC)
	return p
}

// rollback undoes a failed ADD: kernel state, cluster-wide claims,
// record, IPs, local claims. What cannot be undone now keeps the
// attachment stuck — its IPs and pending record held — until the DEL the
// runtime sends after a failed ADD (or the next start) finishes the job:
// handing the IPs out again while the old veth may still route them would
// be worse. A claim the API did not let go of is the claim GC's (see
// releaseClaims): no other pod gets its IP meanwhile, the API refuses it.
func (a *Agent) rollback(rec store.Allocation, claimed []Claim) {
	err := a.cfg.Dataplane.Teardown(rec.HostVeth)
	if err == nil {
		a.releaseClaims(context.Background(), claimed)
	}
	if err == nil {
		err = a.cfg.Store.Delete(rec.ContainerID)
	}
	if err != nil {
		a.log.Error("rollback incomplete; the attachment is held until DEL", "container", rec.ContainerID, "err", err)
		a.state.MarkStuck(rec.ContainerID, "rollback of a failed ADD: "+err.Error())
		return
	}
	a.state.Release(rec.ContainerID)
}

// teardown removes an attachment for good: veth, record, then what the
// state holds (it also finishes a stuck rollback). Call with the
// container's lock held.
func (a *Agent) teardown(rec store.Allocation) error {
	if err := a.cfg.Dataplane.Teardown(rec.HostVeth); err != nil {
		return err
	}
	a.releaseClaims(context.Background(), a.claimsOf(rec, nil, nil))
	if err := a.cfg.Store.Delete(rec.ContainerID); err != nil {
		return err
	}
	a.state.Release(rec.ContainerID)
	return nil
}

// remove takes a committed (or half-deleted) attachment out of every route
// first, then tears it down and releases it. Call with the container's lock
// held.
func (a *Agent) remove(ctx context.Context, rec store.Allocation) error {
	a.withdraw(ctx, rec.ContainerID)
	return a.teardown(rec)
}

// withdraw takes an attachment out of every route and advertisement and
// waits (bounded) until the reconcilers applied that: other replicas' ECMP
// routes must stop naming its veth before the veth goes down, and the ToR
// should stop sending traffic here.
func (a *Agent) withdraw(ctx context.Context, id string) {
	if gen, ok := a.state.MarkDeleting(id); ok {
		a.settle(ctx, gen)
	}
}

// Del tears a container down. Unknown containers succeed; a leftover veth
// of the container's name is still removed, unless another container holds
// that name.
//
// The kernel needs ~20 ms (an RCU grace period) to unregister a veth: more
// than the rest of a DEL together. So DEL withdraws the routes, takes the
// veth down, releases the cluster-wide claims and deletes the record, and
// returns; the veth is unregistered afterwards, still under the container's
// lock (a retried ADD or DEL of the container waits for it) and with its
// IPs and name held until it is gone. A crash meanwhile leaves a veth no
// record owns, which the next start removes before it serves.
func (a *Agent) Del(ctx context.Context, containerID string) error {
	return a.del(ctx, containerID, true)
}

// del is Del; early false removes the veth before returning (GC: nobody
// waits on it, and its errors are reported).
func (a *Agent) del(ctx context.Context, containerID string, early bool) error {
	if err := validateContainerID(containerID); err != nil {
		return err
	}
	unlock := a.locks.Lock(containerID)
	handedOff := false
	defer func() {
		if !handedOff {
			unlock()
		}
	}()
	rec, phase, known := a.state.Get(containerID)
	if !known {
		// A leftover veth of the container's default name goes, unless a
		// live container holds that name (a hash collision); the name is
		// held meanwhile so that no ADD takes it under our feet.
		name := dataplane.HostVethName(containerID)
		if release, ok := a.state.HoldVeth(name, containerID); ok {
			err := a.cfg.Dataplane.Teardown(name)
			release()
			if err != nil {
				return err
			}
		}
		// A record the state does not know (one left by a failed
		// rollback before a restart) goes too.
		return a.cfg.Store.Delete(containerID)
	}
	if phase == nodestate.Stuck {
		return a.teardown(rec)
	}
	if !early {
		return a.remove(ctx, rec)
	}
	start := time.Now()
	a.withdraw(ctx, rec.ContainerID)
	withdrawn := time.Since(start)
	// The record goes before the veth goes down: a restart must never
	// find a committed record whose veth is already down (it would route
	// the pod again into a dead link); a veth no record owns it removes.
	a.releaseClaims(context.Background(), a.claimsOf(rec, nil, nil))
	if err := a.cfg.Store.Delete(rec.ContainerID); err != nil {
		return err
	}
	if err := a.cfg.Dataplane.Retire(rec.HostVeth); err != nil {
		return err // the state still knows it: a retried DEL finishes
	}
	handedOff = true
	done := a.removals.start()
	go func() {
		defer done()
		defer unlock()
		var err error
		for attempt, wait := 1, 10*time.Millisecond; ; attempt, wait = attempt+1, 2*wait {
			if err = a.cfg.Dataplane.Teardown(rec.HostVeth); err == nil {
				a.state.Release(containerID)
				return
			}
			if attempt == removeAttempts {
				break
			}
			time.Sleep(wait)
		}
		// Down and unrouted, but its IPs stay held until a DEL or the next
		// start removes it.
		a.log.Error("veth of a deleted pod not removed; its IPs are held until a DEL or the next start", "container", containerID, "veth", rec.HostVeth, "err", err)
		a.state.MarkStuck(containerID, "remove the veth after DEL: "+err.Error())
	}()
	a.log.Info("pod deleted", "container", containerID, "pod", rec.Pod, "ips", rec.IPs, "withdrawn", withdrawn, "took", time.Since(start))
	return nil
}

// removeAttempts bounds the retries of a veth removal after DEL (10 ms
// apart, doubling): the container's lock is held meanwhile.
const removeAttempts = 5

// heldByDeleted tells whether a reservation failed on something a deleted
// pod may still hold: an address or the last free one.
func heldByDeleted(err error) bool {
	var ce *nodestate.ConflictError
	return errors.Is(err, ipam.ErrExhausted) || errors.Is(err, ipam.ErrConflict) || errors.As(err, &ce)
}

// Wait returns once no veth removal a DEL left running is left (shutdown,
// and tests at quiescent points).
func (a *Agent) Wait() {
	for a.removals.wait() {
	}
}

// Check compares the kernel with the record; prev, if set, are the IPs of
// the runtime's cached result, which must match the record.
func (a *Agent) Check(ctx context.Context, containerID, ifName string, prev []netip.Addr) error {
	if err := validateContainerID(containerID); err != nil {
		return err
	}
	unlock := a.locks.Lock(containerID)
	defer unlock()
	rec, phase, ok := a.state.Get(containerID)
	if !ok || phase != nodestate.Committed {
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
	return a.cfg.Dataplane.Check(podOf(rec))
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

// GC deletes every attachment (committed, or left by a failed ADD or DEL)
// whose container interface the runtime no longer lists (CNI GC, spec
// 1.1). An ADD in progress is left alone.
func (a *Agent) GC(ctx context.Context, valid []Attachment) error {
	keep := map[Attachment]bool{}
	for _, v := range valid {
		keep[v] = true
	}
	var errs []error
	for _, r := range a.state.Attachments(nodestate.Committed, nodestate.Deleting, nodestate.Stuck) {
		if keep[Attachment{r.ContainerID, r.IfName}] {
			continue
		}
		a.log.Info("GC: releasing attachment the runtime no longer knows", "container", r.ContainerID, "ifname", r.IfName)
		if err := a.del(ctx, r.ContainerID, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// keyedMutex serialises operations on one container ID. A waiter can give
// up (ADD's deadline): the lock is a one-slot channel.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	ch   chan struct{}
	refs int
}

// Lock waits for the container's lock.
func (k *keyedMutex) Lock(key string) func() {
	unlock, _ := k.LockCtx(context.Background(), key)
	return unlock
}

// LockCtx waits for the container's lock until ctx ends.
func (k *keyedMutex) LockCtx(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{ch: make(chan struct{}, 1)}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	drop := func() {
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
	return func() {
		<-e.ch
		drop()
	}, nil
}
