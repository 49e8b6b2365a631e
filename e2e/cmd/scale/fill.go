package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	flockv1 "code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// filler writes the model into the API server straight through the API,
// as kwok and kube-burner do: Nodes with their status but no kubelet,
// pods already bound and given kubelet's status through the status
// subresource, the Services' EndpointSlices as the controller would
// write them. Sizes are filled one after another: each fill adds what
// the larger model has beyond the last.
type filler struct {
	cs      kubernetes.Interface
	dyn     dynamic.Interface
	workers int
	done    *model // what is in the API (nil: nothing yet)
	// families of each workload's Service, as the apiserver allocated
	// them (read back at create).
	famMu    sync.Mutex
	families map[int][]corev1.IPFamily
	objects  atomic.Int64 // objects written (creates and status writes)
	// churnFree are the IPv4 offsets the churn may hand out (churn):
	// one list for every size, since the sizes share the API server, and
	// a pod whose delete failed holds its address into the next size.
	churnOnce sync.Once
	churnFree chan int
}

// parallel runs f(i) for i in [from, to) from w workers; the first error
// stops it.
func parallel(ctx context.Context, from, to, w int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	next.Store(int64(from))
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= to || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// retry calls f until it succeeds, the API server being busy (429, 5xx,
// a timeout) or a write conflict (f reads again) the only reasons to try
// again.
func retry(ctx context.Context, f func() error) error {
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil || attempt >= 20 || !(apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsConflict(err) ||
			apierrors.IsTimeout(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// fill writes m's objects beyond f.done.
func (f *filler) fill(ctx context.Context, m *model) error {
	var prev envelope
	prevWorkloads, prevPods, prevNS := 0, 0, 0
	if f.done != nil {
		prev, prevWorkloads, prevPods, prevNS = f.done.env, len(f.done.workloads), f.done.env.netPods(), f.done.namespaces()
	}
	if f.families == nil {
		f.families = map[int][]corev1.IPFamily{}
	}
	step := func(what string, from, to int, fn func(ctx context.Context, i int) error) error {
		start := time.Now()
		if err := parallel(ctx, from, to, f.workers, fn); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if to > from {
			logf("fill: %d %s in %s", to-from, what, time.Since(start).Round(time.Millisecond))
		}
		return nil
	}
	if f.done == nil {
		if err := f.pools(ctx); err != nil {
			return err
		}
	}
	if err := step("namespaces", prevNS, m.namespaces(), f.namespace); err != nil {
		return err
	}
	if err := step("nodes (with 4 host-network pods each)", prev.Nodes, m.env.Nodes, f.node); err != nil {
		return err
	}
	if err := step("pods", prevPods, m.env.netPods(), func(ctx context.Context, k int) error { return f.pod(ctx, m, k) }); err != nil {
		return err
	}
	// The workload the last size cut short has grown: its slices are
	// written again.
	if err := step("services and their endpoint slices", max(0, prevWorkloads-1), len(m.workloads), func(ctx context.Context, i int) error {
		return f.service(ctx, m.workloads[i], i >= prevWorkloads)
	}); err != nil {
		return err
	}
	if err := step("network policies", prev.Policies, m.env.Policies, func(ctx context.Context, p int) error {
		return f.write(ctx, func() error {
			_, err := f.cs.NetworkingV1().NetworkPolicies(policyObj(m, p).Namespace).Create(ctx, policyObj(m, p), metav1.CreateOptions{})
			return ignoreExists(err)
		})
	}); err != nil {
		return err
	}
	f.done = m
	return nil
}

// write counts one write made through f.
func (f *filler) write(ctx context.Context, fn func() error) error {
	if err := retry(ctx, fn); err != nil {
		return err
	}
	f.objects.Add(1)
	return nil
}

func (f *filler) namespace(ctx context.Context, i int) error {
	if err := f.write(ctx, func() error {
		_, err := f.cs.CoreV1().Namespaces().Create(ctx, namespaceObj(i), metav1.CreateOptions{})
		return ignoreExists(err)
	}); err != nil {
		return err
	}
	// No controller-manager makes it, and pods are refused without it.
	return f.write(ctx, func() error {
		_, err := f.cs.CoreV1().ServiceAccounts(nsName(i)).Create(ctx, serviceAccountObj(i), metav1.CreateOptions{})
		return ignoreExists(err)
	})
}

func (f *filler) node(ctx context.Context, i int) error {
	var n *corev1.Node
	if err := f.write(ctx, func() (err error) {
		n, err = f.cs.CoreV1().Nodes().Create(ctx, nodeObj(i), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			n, err = f.cs.CoreV1().Nodes().Get(ctx, nodeName(i), metav1.GetOptions{})
		}
		return err
	}); err != nil {
		return err
	}
	nodeStatus(n, i)
	if err := f.write(ctx, func() error {
		_, err := f.cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return err
	}
	for j := range full.HostPods {
		if err := f.createPod(ctx, hostPodObj(i, j), nodeIP(i)); err != nil {
			return err
		}
	}
	if err := f.createCR(ctx, "nodeconfigs", nodeConfigObj(i)); err != nil {
		return err
	}
	return f.writeNodeConfigStatus(ctx, i)
}

// writeNodeConfigStatus writes node i's NodeConfig status as its agent
// does (a GET, then a PUT of the status subresource).
func (f *filler) writeNodeConfigStatus(ctx context.Context, i int) error {
	res := f.dyn.Resource(flockv1.GroupVersion.WithResource("nodeconfigs"))
	return f.write(ctx, func() error {
		u, err := res.Get(ctx, nodeName(i), metav1.GetOptions{})
		if err != nil {
			return err
		}
		st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ptr.To(nodeConfigStatus(i)))
		if err != nil {
			return err
		}
		u.Object["status"] = st
		_, err = res.UpdateStatus(ctx, u, metav1.UpdateOptions{})
		return err
	})
}

// createPod creates p and writes kubelet's status for it: Running with
// ips (the host network's: hostIP).
func (f *filler) createPod(ctx context.Context, p *corev1.Pod, hostIP netip.Addr, ips ...netip.Addr) error {
	var c *corev1.Pod
	if err := f.write(ctx, func() (err error) {
		c, err = f.cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			c, err = f.cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		}
		return err
	}); err != nil {
		return err
	}
	podStatus(c, hostIP, ips...)
	return f.write(ctx, func() error {
		_, err := f.cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	})
}

func (m *model) workloadOf(k int) workload {
	lo, hi := 0, len(m.workloads)
	for lo+1 < hi {
		mid := (lo + hi) / 2
		if m.workloads[mid].first <= k {
			lo = mid
		} else {
			hi = mid
		}
	}
	return m.workloads[lo]
}

func (f *filler) pod(ctx context.Context, m *model, k int) error {
	w := m.workloadOf(k)
	v6, v4 := podIPs(k)
	p := podObj(w, k)
	if err := f.createPod(ctx, p, nodeIP(podNode(k)), v6, v4); err != nil {
		return err
	}
	if _, ok := p.Annotations[flockAddressesKey]; ok {
		return f.createCR(ctx, "addressclaims", podClaim(w, k))
	}
	return nil
}

// service creates w's Service (when new) and writes its EndpointSlices;
// a LoadBalancer gets its claim and status as the assigner would write
// them.
func (f *filler) service(ctx context.Context, w workload, isNew bool) error {
	if isNew {
		var s *corev1.Service
		if err := f.write(ctx, func() (err error) {
			s, err = f.cs.CoreV1().Services(w.namespace()).Create(ctx, serviceObj(w), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				s, err = f.cs.CoreV1().Services(w.namespace()).Get(ctx, w.name(), metav1.GetOptions{})
			}
			return err
		}); err != nil {
			return err
		}
		f.setFamilies(w.index, s.Spec.IPFamilies)
		if w.lb() {
			if err := f.createCR(ctx, "addressclaims", lbClaim(w)); err != nil {
				return err
			}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP(w).String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
			if err := f.write(ctx, func() error {
				_, err := f.cs.CoreV1().Services(w.namespace()).UpdateStatus(ctx, s, metav1.UpdateOptions{})
				return err
			}); err != nil {
				return err
			}
		}
	}
	fams := f.familiesOf(w.index)
	if fams == nil {
		s, err := f.cs.CoreV1().Services(w.namespace()).Get(ctx, w.name(), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("service %s/%s: %w", w.namespace(), w.name(), err)
		}
		fams = s.Spec.IPFamilies
		f.setFamilies(w.index, fams)
	}
	for _, es := range endpointSlices(w, fams) {
		if err := f.write(ctx, func() error {
			_, err := f.cs.DiscoveryV1().EndpointSlices(es.Namespace).Create(ctx, es, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				old, gerr := f.cs.DiscoveryV1().EndpointSlices(es.Namespace).Get(ctx, es.Name, metav1.GetOptions{})
				if gerr != nil {
					return gerr
				}
				es.ResourceVersion = old.ResourceVersion
				_, err = f.cs.DiscoveryV1().EndpointSlices(es.Namespace).Update(ctx, es, metav1.UpdateOptions{})
			}
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

func (f *filler) setFamilies(i int, fams []corev1.IPFamily) {
	f.famMu.Lock()
	defer f.famMu.Unlock()
	f.families[i] = fams
}

func (f *filler) familiesOf(i int) []corev1.IPFamily {
	f.famMu.Lock()
	defer f.famMu.Unlock()
	return f.families[i]
}

// createCR creates a flock object (typed, converted for the dynamic
// client); one already there is left.
func (f *filler) createCR(ctx context.Context, resource string, obj runtime.Object) error {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("convert %T: %w", obj, err)
	}
	return f.write(ctx, func() error {
		_, err := f.dyn.Resource(flockv1.GroupVersion.WithResource(resource)).Create(ctx, &unstructured.Unstructured{Object: u}, metav1.CreateOptions{})
		return ignoreExists(err)
	})
}

func (f *filler) pools(ctx context.Context) error {
	var errs []error
	for _, p := range addressPools() {
		errs = append(errs, f.createCR(ctx, "addresspools", p))
	}
	// The envelope's PreferDualStack Services need more IPv4 addresses
	// than the secondary range holds: more ServiceCIDRs, as a cluster
	// that outgrows its range adds them. The API server allocates from a
	// Ready one; kube-controller-manager, which this lab does not run,
	// would say so: its status is written here.
	for i, cidr := range extraSvcV4CIDRs {
		sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("scale-ipv4-%d", i+1)},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{cidr.String()}}}
		sc, err := f.cs.NetworkingV1().ServiceCIDRs().Create(ctx, sc, metav1.CreateOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("ServiceCIDR %s: %w", cidr, err))
			continue
		}
		sc.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionTrue,
			Reason: "ScaleLab", Message: "written by make scale (no kube-controller-manager)", LastTransitionTime: metav1.Now()}}
		if _, err := f.cs.NetworkingV1().ServiceCIDRs().UpdateStatus(ctx, sc, metav1.UpdateOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("ServiceCIDR %s status: %w", cidr, err))
		}
	}
	return errors.Join(errs...)
}
