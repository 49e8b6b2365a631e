package elect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/lbassign"
	"code.fritzlab.net/fritzlab/flock/k8s/loadbalancers"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// The assigner's ports, unused here (no Services).
type (
	noClaims struct{}
	noStatus struct{}
	noEvents struct{}
	lbSvcs   struct {
		kubeclient.ListerWatcher[*corev1.ServiceList]
	}
)

func (noClaims) Claim(context.Context, netip.Addr, string, loadbalancers.ServiceRef, string) error {
	return nil
}
func (noClaims) Release(context.Context, netip.Addr, loadbalancers.ServiceRef) error      { return nil }
func (noClaims) Services() map[netip.Addr][]loadbalancers.ServiceRef                      { return nil }
func (noClaims) Others() map[netip.Addr]string                                            { return nil }
func (noStatus) SetIngress(context.Context, loadbalancers.ServiceRef, []netip.Addr) error { return nil }
func (noEvents) Event(loadbalancers.ServiceRef, bool, string, string)                     {}
func (lbSvcs) IsWatchListSemanticsUnSupported() bool                                      { return true }

// newElect is an agent's election, with an assigner that has no Services.
func newElect(t *testing.T, cs *fake.Clientset, node string, lease, renew time.Duration) *Elect {
	f := kubeclient.NewFactory()
	inf := f.Informer("services", func() cache.SharedIndexInformer {
		return kubeclient.NewInformer(lbSvcs{cs.CoreV1().Services("")}, &corev1.Service{}, nil)
	})
	as := loadbalancers.New(loadbalancers.Config{Services: inf, Claims: noClaims{}, Status: noStatus{}, Events: noEvents{},
		Pools: func() []lbassign.Pool { return nil }, Ours: (services.Options{}).Ours})
	testutil.Run(t, f.Run)
	return &Elect{Leases: cs.CoordinationV1(), Namespace: "flock-system", Identity: node, Assigner: as,
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
// only once its assigner has stopped: at the instant the Lease names no
// holder, it no longer leads, and the two agents never lead together.
// client-go releases before it cancels the leader's context; before
// releaseAfterStop, a still led when b took the released Lease (CI saw
// "a true, b true").
func TestElectReleasesAfterItStops(t *testing.T) {
	cs := fake.NewClientset()
	var failRenew atomic.Bool
	var a *Elect
	released := make(chan bool, 1) // a.Leading() when the release is written
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
			case released <- a.Leading():
			default:
			}
		}
		return false, nil, nil
	})
	// b could take an unreleased Lease only 10 s after a's last renewal;
	// a gives up 1 s after it and releases.
	a = newElect(t, cs, "node-a", 10*time.Second, time.Second)
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
			t.Fatal("node-a released the Lease while it still led (its assigner running)")
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
