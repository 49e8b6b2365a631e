package loadbalancers

import (
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
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// Two agents compete for the Lease: exactly one leads at a time (sampled
// throughout), and when it stops the other takes over.
func TestElectOneLeader(t *testing.T) {
	cs := fake.NewClientset()
	elect := func(node string) *Elect {
		f := kubeclient.NewFactory()
		inf := f.Informer("services", func() cache.SharedIndexInformer {
			return kubeclient.NewInformer(fakeSvcs{cs.CoreV1().Services("")}, &corev1.Service{}, nil)
		})
		a := New(Config{Services: inf, Claims: &fakeClaims{svc: map[netip.Addr]ServiceRef{}, pods: map[netip.Addr]string{}},
			Status: &fakeStatus{cs: cs}, Events: &events{}, Pools: func() []lbassign.Pool { return nil }, Ours: (services.Options{}).Ours})
		testutil.Run(t, f.Run)
		return &Elect{Leases: cs.CoordinationV1(), Namespace: "flock-system", Identity: node, Assigner: a,
			LeaseDuration: 1500 * time.Millisecond, RenewDeadline: 1 * time.Second, RetryPeriod: 200 * time.Millisecond}
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
