// Package elect runs a term's work (the LoadBalancer assigner with the
// caches it decides from) on the one process holding a Lease (client-go
// leader election). It is apart from package
// loadbalancers because client-go's leader election links the whole typed
// clientset and registers every API group at start (+17 MB binary, +10 MB
// RSS): a process that runs it pays that, one that only shares the
// assigner's types does not.
package elect

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the Lease the candidates compete for (in flock's namespace):
// its holder is the one writer of LoadBalancer addresses.
const LeaseName = "flock-loadbalancers"

// Elect runs Term on whichever process holds the Lease: client-go's
// leader election (a candidate that loses the Lease stops writing before
// another can take it: RenewDeadline < LeaseDuration). It is a Runner: it
// returns nil when ctx ends, and competes again after losing the Lease.
// Competing needs nothing but the Lease: whatever a term needs, Term
// builds.
type Elect struct {
	Leases    coordinationv1.LeasesGetter
	Namespace string
	Identity  string // the node's name
	// Term is one term's work: it runs from winning the Lease until ctx
	// ends, and the Lease is given up only once it has returned. A term
	// that returns on its own gives the Lease up too (a holder doing
	// nothing would keep everyone else from assigning), and the candidate
	// competes again.
	Term func(ctx context.Context) error
	Log  *slog.Logger
	// Timings; zero: client-go's defaults for core components (15 s, 10 s,
	// 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	leading atomic.Bool
	mu      sync.Mutex
	running *term // the current term, or nil
	// stopped: the current term ended (stop ran) before its work started
	// (client-go starts it on a goroutine of its own).
	stopped bool
}

// term is one term's work: cancel stops it, done closes once it has.
type term struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the current term's work and waits until it has returned:
// from then on this process writes nothing.
func (e *Elect) stop() {
	e.mu.Lock()
	r := e.running
	e.running, e.stopped = nil, true
	e.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
	e.leading.Store(false)
}

// releaseAfterStop is the Lease lock, except that giving the Lease up
// (client-go's release: an update naming no holder) first stops the
// term. client-go releases the Lease before it cancels the leader's
// context, so without this another process could take the Lease, and
// write, while this one's assigner still ran.
type releaseAfterStop struct {
	resourcelock.Interface
	stop func()
}

func (l releaseAfterStop) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if r.HolderIdentity == "" {
		l.stop()
	}
	return l.Interface.Update(ctx, r)
}

// resignKey holds, in the context of one le.Run, what ends that run: a
// term that returns on its own gives up its own Lease term, not a later
// one.
type resignKey struct{}

// Leading tells whether this process writes the addresses now.
func (e *Elect) Leading() bool { return e.leading.Load() }

// Run competes for the Lease until ctx ends.
func (e *Elect) Run(ctx context.Context) error {
	log := e.Log
	if log == nil {
		log = slog.Default()
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock: releaseAfterStop{Interface: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: LeaseName},
			Client:     e.Leases,
			LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
		}, stop: e.stop},
		LeaseDuration:   or(e.LeaseDuration, 15*time.Second),
		RenewDeadline:   or(e.RenewDeadline, 10*time.Second),
		RetryPeriod:     or(e.RetryPeriod, 2*time.Second),
		ReleaseOnCancel: true, // a planned stop hands over at once
		Name:            LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				ctx, cancel := context.WithCancel(ctx)
				r := &term{cancel: cancel, done: make(chan struct{})}
				defer close(r.done)
				e.mu.Lock()
				if e.stopped || ctx.Err() != nil {
					e.mu.Unlock()
					cancel()
					return
				}
				e.running = r
				e.leading.Store(true)
				e.mu.Unlock()
				log.Info("LoadBalancer addresses: this process assigns them", "lease", e.Namespace+"/"+LeaseName)
				err := e.Term(ctx)
				if ctx.Err() == nil {
					// Ends le.Run, whose release waits (stop) until this
					// has returned.
					log.Error("LoadBalancer term ended while leading; giving the Lease up", "err", err)
					ctx.Value(resignKey{}).(context.CancelFunc)()
				} else if err != nil {
					log.Error("LoadBalancer term stopped", "err", err)
				}
			},
			OnStoppedLeading: func() {
				e.stop()
				log.Info("LoadBalancer addresses: this process no longer assigns them")
			},
		},
	}
	le, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		return fmt.Errorf("leader election for LoadBalancer addresses: %w", err)
	}
	for ctx.Err() == nil {
		e.mu.Lock()
		e.stopped = false
		e.mu.Unlock()
		run, resign := context.WithCancel(ctx)
		le.Run(context.WithValue(run, resignKey{}, resign)) // returns when leadership is lost or ctx ends
		resign()
	}
	return nil
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
