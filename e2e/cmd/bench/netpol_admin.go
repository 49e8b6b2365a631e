package main

// The NetworkPolicy section's last figures: flock-policy's RSS with
// npMany NetworkPolicies, and new connections with AdminNetworkPolicy and
// BaselineAdminNetworkPolicy on (an admin policy applying to another
// pod) against the same connections with them off.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// npMany is the number of NetworkPolicies of the large RSS figure.
const npMany = 1000

// npMarker is a policy that selects the open server and lets only the
// client in: created after many others, the intruder's SYN to the open
// server dropped says the kernel holds them all (one program is
// compiled from everything the caches hold).
func npMarker() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bench-marker", Namespace: npNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "open"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}}},
		}}
}

// manyRSS adds policies up to npMany, waits until the kernel holds them,
// reads the RSS, and takes the added ones (and the marker) away again
// once they are gone from the kernel.
func (l *npLab) manyRSS(ctx context.Context, cs kubernetes.Interface, p *policyProc, have int, settle time.Duration) (float64, error) {
	nps := cs.NetworkingV1().NetworkPolicies(npNamespace)
	for i := have; i < npMany; i++ {
		if _, err := nps.Create(ctx, npPolicy(i, l.distinctPrefix()), metav1.CreateOptions{}); err != nil {
			return nan(), fmt.Errorf("create NetworkPolicy %d: %w", i, err)
		}
	}
	if _, err := nps.Create(ctx, npMarker(), metav1.CreateOptions{}); err != nil {
		return nan(), fmt.Errorf("create the marker policy: %w", err)
	}
	if err := l.waitFor(p, 90*time.Second, func() error { return l.refused(podIntruder, podOpen) }); err != nil {
		return nan(), fmt.Errorf("%d policies: %w", npMany, err)
	}
	rss, err := p.rss(settle)
	if err != nil {
		return nan(), err
	}
	for i := have; i < npMany; i++ {
		if err := nps.Delete(ctx, fmt.Sprintf("bench-%03d", i), metav1.DeleteOptions{}); err != nil {
			return nan(), fmt.Errorf("delete NetworkPolicy %d: %w", i, err)
		}
	}
	if err := nps.Delete(ctx, "bench-marker", metav1.DeleteOptions{}); err != nil {
		return nan(), fmt.Errorf("delete the marker policy: %w", err)
	}
	err = l.waitFor(p, 90*time.Second, func() error { return l.dial(podIntruder, podOpen, 1500*time.Millisecond) })
	return rss, err
}

// waitFor retries ok until it returns nil, for up to timeout.
func (l *npLab) waitFor(p *policyProc, timeout time.Duration, ok func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := p.exited(); err != nil {
			return err
		}
		why := ok()
		if why == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not in effect after %s: %w\n--- flock-policy log (tail) ---\n%s", timeout, why, p.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// npAdminSubject is the Pod (on another node, in the API only) the admin
// policies apply to.
const npAdminSubject = "admin-subject"

// npAdminObjects are an AdminNetworkPolicy and the
// BaselineAdminNetworkPolicy, both applying to npAdminSubject only.
const npAdminObjects = `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata:
  name: bench-admin
spec:
  priority: 10
  subject:
    pods:
      namespaceSelector: {}
      podSelector:
        matchLabels:
          role: admin-subject
  ingress:
  - name: deny-all
    action: Deny
    from:
    - namespaces: {}
  egress:
  - name: deny-elsewhere
    action: Deny
    to:
    - namespaces:
        matchLabels:
          flock.fritzlab.net/bench: elsewhere
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata:
  name: default
spec:
  subject:
    pods:
      namespaceSelector: {}
      podSelector:
        matchLabels:
          role: admin-subject
  ingress:
  - name: deny-all
    action: Deny
    from:
    - namespaces: {}
`

// adminRates compares the connection rates of connRates with both admin
// policy APIs off and on (their CRDs installed, an admin policy of each
// applying to another pod), in the order off, on, on, off (the machine's
// speed drifts): p, with them off, runs the first; flock-policy then
// restarts with them on, and again with them off (stopped on return).
func (l *npLab) adminRates(ctx context.Context, a *apiLab, p *policyProc, binDir, dir, metrics string, rateTime, settle time.Duration) (on, off [2]float64, queued int, err error) {
	var sums [2][2]float64 // [on][selected, unselected]
	measure := func(p *policyProc, admin bool) error {
		// Each from a conntrack table its predecessor's closed
		// connections have left: the rates fall as the table fills, and
		// the comparison is between the APIs, not the table's load.
		l.settleConntrack(30 * time.Second)
		sel, unsel, err := l.connRates(p, rateTime)
		if err != nil {
			return err
		}
		i := 0
		if admin {
			i = 1
		}
		sums[i][0] += sel / 2
		sums[i][1] += unsel / 2
		logf("netpol: admin policies on %v: %.0f / %.0f connections/s (selected / unselected)", admin, sel, unsel)
		return nil
	}
	restart := func(admin bool) (*policyProc, error) {
		var args []string
		if admin {
			args = []string{"--admin-network-policy", "--baseline-admin-network-policy"}
		}
		d := filepath.Join(dir, fmt.Sprintf("admin-%v", admin))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		p, err := startPolicy(l.node, binDir, d, a.kubeconfig(), metrics, args...)
		if err != nil {
			return nil, err
		}
		if err := p.waitReady(l.httpClient(), "http://"+metrics+"/readyz", 60*time.Second); err != nil {
			p.stop()
			return nil, err
		}
		if err := l.waitEnforced(p, 90*time.Second); err != nil {
			p.stop()
			return nil, err
		}
		// A starting flock-policy lists and compiles everything: the
		// runs measure it at rest.
		time.Sleep(settle)
		return p, nil
	}
	fail := func(err error) ([2]float64, [2]float64, int, error) {
		return [2]float64{nan(), nan()}, [2]float64{nan(), nan()}, -1, err
	}
	if err := measure(p, false); err != nil {
		return fail(err)
	}
	p.stop()
	if err := a.kubectl(ctx, "", "apply", "-f", filepath.Join(a.root, "deploy", "admin-network-policy", "crd")); err != nil {
		return fail(err)
	}
	if err := a.kubectl(ctx, "", "wait", "--for=condition=Established", "--timeout=60s",
		"crd/adminnetworkpolicies.policy.networking.k8s.io", "crd/baselineadminnetworkpolicies.policy.networking.k8s.io"); err != nil {
		return fail(err)
	}
	if err := a.kubectl(ctx, npAdminObjects, "apply", "-f", "-"); err != nil {
		return fail(err)
	}
	if err := createPod(ctx, a.cs, npAdminSubject, map[string]string{"role": "admin-subject"}, npNode+"-other", netip.MustParseAddr("fd00:6e70:ff:ad::1")); err != nil {
		return fail(err)
	}
	pa, err := restart(true)
	if err != nil {
		return fail(err)
	}
	// The subject's address alone is queued: the runs send nothing to
	// the engine.
	before, err := l.queuedPackets()
	if err == nil {
		err = measure(pa, true)
	}
	if err == nil {
		err = measure(pa, true)
	}
	var after int
	if err == nil {
		after, err = l.queuedPackets()
	}
	pa.stop()
	if err != nil {
		return fail(err)
	}
	queued = after - before
	logf("netpol: packets the engine's queue saw during the runs with the admin policies on: %d", queued)
	po, err := restart(false)
	if err != nil {
		return fail(err)
	}
	defer po.stop()
	if err := measure(po, false); err != nil {
		return fail(err)
	}
	return sums[1], sums[0], queued, nil
}

// queuedPackets is how many packets the engine's NFQUEUE (100, in the
// node namespace) has been handed: its id sequence in
// /proc/thread-self/net/netfilter/nfnetlink_queue. An error if the queue is not
// bound (no engine reads it: the count would prove nothing).
func (l *npLab) queuedPackets() (int, error) {
	n := -1
	err := l.node.InNS(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/netfilter/nfnetlink_queue") // this thread's namespace; /proc/net is the process's
		if err != nil {
			return err
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			// queue_number peer_portid queue_total copy_mode
			// copy_range queue_dropped user_dropped id_sequence 1
			f := strings.Fields(line)
			if len(f) >= 8 && f[0] == "100" {
				n, err = strconv.Atoi(f[7])
				return err
			}
		}
		return fmt.Errorf("NFQUEUE 100 is not bound in the node namespace:\n%s", b)
	})
	return n, err
}

// settleConntrack waits (up to timeout) until the node namespace's
// conntrack table holds fewer than 1000 entries.
func (l *npLab) settleConntrack(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, count, err := l.conntrack(); err != nil || count < 1000 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}
