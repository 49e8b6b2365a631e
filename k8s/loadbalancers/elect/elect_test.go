package elect

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
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

// Two agents compete for the Lease: exactly one leads at a time (sampled
// throughout), and when it stops the other takes over.
func TestElectOneLeader(t *testing.T) {
	cs := fake.NewClientset()
	elect := func(node string) *Elect {
		f := kubeclient.NewFactory()
		inf := f.Informer("services", func() cache.SharedIndexInformer {
			return kubeclient.NewInformer(lbSvcs{cs.CoreV1().Services("")}, &corev1.Service{}, nil)
		})
		a := loadbalancers.New(loadbalancers.Config{Services: inf, Claims: noClaims{}, Status: noStatus{}, Events: noEvents{},
			Pools: func() []lbassign.Pool { return nil }, Ours: (services.Options{}).Ours})
		testutil.Run(t, f.Run)
		// A Lease held past a starved renewal is taken over once it is
		// LeaseDuration old, while the old holder still believes it leads
		// until its RenewDeadline: leader election is not fencing. A short
		// LeaseDuration made that happen on a loaded CI machine (a and b
		// both leading). A long one keeps this test to what it claims,
		// and the handover it checks comes from the release, not expiry.
		return &Elect{Leases: cs.CoordinationV1(), Namespace: "flock-system", Identity: node, Assigner: a,
			LeaseDuration: 30 * time.Second, RenewDeadline: 20 * time.Second, RetryPeriod: 200 * time.Millisecond}
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
