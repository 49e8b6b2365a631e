package elect

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// newElect is an agent's election, whose terms wait for their end.
func newElect(t *testing.T, cs *fake.Clientset, node string, lease, renew time.Duration) *Elect {
	return &Elect{Leases: cs.CoordinationV1(), Namespace: "flock-system", Identity: node,
		Term:          func(ctx context.Context) error { <-ctx.Done(); return nil },
		LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: 200 * time.Millisecond}
}

// Two agents compete for the Lease: exactly one leads at a time (sampled
// throughout), and when it stops the other takes over.
func TestElectOneLeader(t *testing.T) {
	cs := fake.NewClientset()
	elect := func(node string) *Elect {
		// A Lease held past a starved renewal is taken over once it is
		// LeaseDuration old, while the old holder still believes it leads
		// until its RenewDeadline: leader election is not fencing. A short
		// LeaseDuration made that happen on a loaded CI machine (a and b
		// both leading). A long one keeps this test to what it claims,
		// and the handover it checks comes from the release, not expiry.
		return newElect(t, cs, node, 30*time.Second, 20*time.Second)
	}
	a, b := elect("node-a"), elect("node-b")
	_, stopA := testutil.Run(t, a.Run)
	testutil.Eventually(t, "node-a to lead", func() (bool, string) { return a.Leading(), "" })
	testutil.Run(t, b.Run)
	testutil.Consistently(t, "exactly one leader", 2*time.Second, func() (bool, string) {
		return a.Leading() != b.Leading(), fmt.Sprintf("a %v, b %v", a.Leading(), b.Leading())
	})
	stopA() // a planned stop releases the Lease
	testutil.EventuallyWithin(t, 10*time.Second, "node-b to take over", func() (bool, string) { return b.Leading() && !a.Leading(), "" })
}

// A leader whose renewals fail gives the Lease up (client-go's release)
// only once its term has returned: at the instant the Lease names no
// holder, it no longer leads, and the two agents never lead together.
// client-go releases before it cancels the leader's context; before
// releaseAfterStop, a still led when b took the released Lease (CI saw
// "a true, b true").
func TestElectReleasesAfterItStops(t *testing.T) {
	cs := fake.NewClientset()
	var failRenew atomic.Bool
	var a *Elect
	var aRunning atomic.Bool       // a's term has not returned
	released := make(chan bool, 1) // a.Leading() or a's term running when the release is written
	cs.PrependReactor("update", "leases", func(act k8stesting.Action) (bool, runtime.Object, error) {
		l := act.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		switch {
		case holder == "node-a" && failRenew.Load():
			return true, nil, errors.New("injected: the API server does not answer node-a")
		case holder == "" && a != nil:
			select {
			case released <- a.Leading() || aRunning.Load():
			default:
			}
		}
		return false, nil, nil
	})
	// b could take an unreleased Lease only 10 s after a's last renewal;
	// a gives up 1 s after it and releases.
	a = newElect(t, cs, "node-a", 10*time.Second, time.Second)
	a.Term = func(ctx context.Context) error {
		aRunning.Store(true)
		defer aRunning.Store(false)
		<-ctx.Done()
		return nil
	}
	b := newElect(t, cs, "node-b", 10*time.Second, time.Second)
	testutil.Run(t, a.Run)
	testutil.Eventually(t, "node-a to lead", func() (bool, string) { return a.Leading(), "" })
	testutil.Run(t, b.Run)
	both := make(chan struct{})
	stopWatch := make(chan struct{})
	go func() {
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(time.Millisecond):
			}
			if a.Leading() && b.Leading() {
				close(both)
				return
			}
		}
	}()
	defer close(stopWatch)
	failRenew.Store(true)
	select {
	case leading := <-released:
		if leading {
			t.Fatal("node-a released the Lease while it still led (its term running)")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("node-a never released the Lease")
	}
	testutil.EventuallyWithin(t, 10*time.Second, "node-b to take over", func() (bool, string) { return b.Leading(), "" })
	select {
	case <-both:
		t.Fatal("node-a and node-b led at once")
	default:
	}
}

// A term that returns on its own while leading gives the Lease up, only
// once it has returned, and the candidate competes again: the next win
// runs a new term. Before, such a leader kept the Lease doing nothing.
func TestElectTermEndingOnItsOwnGivesTheLeaseUp(t *testing.T) {
	cs := fake.NewClientset()
	var calls, running atomic.Int32
	released := make(chan int32, 1) // terms running when the release is written
	cs.PrependReactor("update", "leases", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if l := act.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease); l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			select {
			case released <- running.Load():
			default:
			}
		}
		return false, nil, nil
	})
	e := newElect(t, cs, "node-a", 30*time.Second, 20*time.Second)
	e.Term = func(ctx context.Context) error {
		running.Add(1)
		defer running.Add(-1)
		if calls.Add(1) == 1 {
			time.Sleep(100 * time.Millisecond) // still running when it decides to end
			return errors.New("injected: the term failed")
		}
		<-ctx.Done()
		return nil
	}
	testutil.Run(t, e.Run)
	select {
	case n := <-released:
		if n != 0 {
			t.Fatal("the Lease was released while the term still ran")
		}
	case <-time.After(testutil.Timeout):
		t.Fatal("a leader whose term ended kept the Lease")
	}
	testutil.Eventually(t, "a second term leading", func() (bool, string) {
		return calls.Load() == 2 && e.Leading() && running.Load() == 1, fmt.Sprintf("calls %d, leading %v", calls.Load(), e.Leading())
	})
	l, err := cs.CoordinationV1().Leases("flock-system").Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "node-a" {
		t.Fatalf("the Lease after the second win: %v, %v", l, err)
	}
}
