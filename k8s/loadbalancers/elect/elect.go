// Package elect runs the LoadBalancer assigner on the one process holding
// a Lease (client-go leader election). It is apart from package
// loadbalancers because client-go's leader election links the whole typed
// clientset and registers every API group at start (+17 MB binary, +10 MB
// RSS): a process that runs it pays that, one that only shares the
// assigner's types does not.
package elect

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"code.fritzlab.net/fritzlab/flock/k8s/loadbalancers"
)

// LeaseName is the Lease the candidates compete for (in flock's namespace):
// its holder is the one writer of LoadBalancer addresses.
const LeaseName = "flock-loadbalancers"

// Elect runs the assigner on whichever agent holds the Lease: client-go's
// leader election (a candidate that loses the Lease stops writing before
// another can take it: RenewDeadline < LeaseDuration). It is a Runner: it
// returns nil when ctx ends, and competes again after losing the Lease.
type Elect struct {
	Leases    coordinationv1.LeasesGetter
	Namespace string
	Identity  string // the node's name
	Assigner  *loadbalancers.Assigner
	Log       *slog.Logger
	// Timings; zero: client-go's defaults for core components (15 s, 10 s,
	// 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	leading atomic.Bool
}

// Leading tells whether this agent writes the addresses now.
func (e *Elect) Leading() bool { return e.leading.Load() }

// Run competes for the Lease until ctx ends.
func (e *Elect) Run(ctx context.Context) error {
	log := e.Log
	if log == nil {
		log = slog.Default()
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: LeaseName},
			Client:     e.Leases,
			LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
		},
		LeaseDuration:   or(e.LeaseDuration, 15*time.Second),
		RenewDeadline:   or(e.RenewDeadline, 10*time.Second),
		RetryPeriod:     or(e.RetryPeriod, 2*time.Second),
		ReleaseOnCancel: true, // a planned stop hands over at once
		Name:            LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				e.leading.Store(true)
				log.Info("LoadBalancer addresses: this agent assigns them", "lease", e.Namespace+"/"+LeaseName)
				if err := e.Assigner.Run(ctx); err != nil {
					log.Error("LoadBalancer assigner stopped", "err", err)
				}
			},
			OnStoppedLeading: func() {
				e.leading.Store(false)
				log.Info("LoadBalancer addresses: this agent no longer assigns them")
			},
		},
	}
	le, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		return fmt.Errorf("leader election for LoadBalancer addresses: %w", err)
	}
	for ctx.Err() == nil {
		le.Run(ctx) // returns when leadership is lost or ctx ends
	}
	return nil
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
