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
	"log/slog"
	"net/netip"
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

// container's lock held.
// up (ADD's deadline): the lock is a one-slot channel.
