// Package check is `flockctl check`: it proves, against a live cluster,
// that flock does what it promises there, the role `cilium connectivity
// test` plays for Cilium. In a namespace of its own (labelled, so that a
// check cut short is cleaned up by the next) it runs probe pods from
// flock's own image on two nodes and checks: pod to pod across the nodes
// in each family, pod to an `addresses` and an anycast IP, every agent's
// BGP sessions and routes, a LoadBalancer address, and NetworkPolicy
// enforcement. Each result names the command that shows why it failed;
// everything it made goes at the end.
package check

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// Label marks what a check made: its namespace carries it, so the next
// check removes a namespace a check cut short left behind.
const Label = "flock.fritzlab.net/check"

// Alive is the annotation a running check renews on its namespace every
// aliveEvery: a namespace whose mark is older than aliveStale (or has
// none) belongs to no running check, and the next check removes it.
const (
	Alive      = "flock.fritzlab.net/check-alive"
	aliveEvery = 10 * time.Second
	aliveStale = time.Minute
	// fieldManager writes the mark: the API server stamps its time.
	fieldManager = "flockctl-check"
)

const (
	port          = 8080
	flockNS       = "flock-system"
	agentSelector = "app.kubernetes.io/name=flock"
	lbClass       = "flock.fritzlab.net/bgp"
	roleLabel     = "flock.fritzlab.net/check-role"
)

var (
	nodeConfigs  = schema.GroupVersionResource{Group: "flock.fritzlab.net", Version: "v1alpha1", Resource: "nodeconfigs"}
	addressPools = schema.GroupVersionResource{Group: "flock.fritzlab.net", Version: "v1alpha1", Resource: "addresspools"}
	claimsGVR    = schema.GroupVersionResource{Group: "flock.fritzlab.net", Version: "v1alpha1", Resource: "addressclaims"}
)

// Options are a check's settings.
type Options struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Image runs the probes: flock's image of flockctl's own release.
	Image string
	// Timeout bounds each wait (a pod to run, an address to be assigned).
	Timeout time.Duration
	// Progress, if set, hears what the check is doing.
	Progress func(string)
}

// Result is one check's outcome.
type Result struct {
	Check  string `json:"check"`
	Result string `json:"result"` // pass, fail or skip
	Detail string `json:"detail,omitempty"`
	// Why is a command that shows what went wrong (for a failure).
	Why string `json:"why,omitempty"`
}

// Results.
const (
	Pass = "pass"
	Fail = "fail"
	Skip = "skip"
)

// Failed tells whether any result failed.
func Failed(rs []Result) bool {
	return slices.ContainsFunc(rs, func(r Result) bool { return r.Result == Fail })
}

// ErrRights is a check the API would not let run: the error names every
// missing right.
var ErrRights = errors.New("flockctl check lacks rights")

// run is one check's state.
type run struct {
	o       Options
	ns      string
	results []Result
	picked  map[netip.Addr]bool // extra IPs this check gave its pods
}

func (r *run) say(format string, a ...any) {
	if r.o.Progress != nil {
		r.o.Progress(fmt.Sprintf(format, a...))
	}
}

func (r *run) add(check, result, detail, why string) {
	r.results = append(r.results, Result{Check: check, Result: result, Detail: detail, Why: why})
}

// Run runs the check. It returns the results, or an error when it could
// not check at all (missing rights, no flock); what it made is removed
// either way, also when ctx ends half-way (with a context of its own).
func Run(ctx context.Context, o Options) ([]Result, error) {
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	r := &run{o: o, ns: "flock-check-" + suffix()}
	if err := r.rights(ctx); err != nil {
		return nil, err
	}
	r.say("namespace %s", r.ns)
	made, err := o.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns, Labels: map[string]string{Label: "true"},
		Annotations: map[string]string{Alive: time.Now().UTC().Format(time.RFC3339)}}}, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", r.ns, err)
	}
	defer r.cleanup()
	alive, stopAlive := context.WithCancel(ctx)
	defer stopAlive()
	go r.keepAlive(alive)
	// The API server's clock, not this machine's, judges the others.
	now := made.CreationTimestamp.Time
	if now.IsZero() {
		now = time.Now() // no stamp: only a fake API leaves it out
	}
	if err := r.leftovers(ctx, now); err != nil {
		return nil, err
	}
	nodes, err := r.flockNodes(ctx)
	if err != nil {
		return r.results, err
	}
	r.sessions(ctx)
	r.traffic(ctx, nodes)
	return r.results, nil
}

func suffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// need is a right the check uses.
type need struct {
	verb, group, resource, namespace string
}

func (n need) String() string {
	s := n.verb + " " + n.resource
	if n.group != "" {
		s += "." + n.group
	}
	if n.namespace != "" {
		s += " in namespace " + n.namespace
	}
	return s
}

// rights asks the API (SelfSubjectAccessReview) for every right the check
// uses and names the missing ones, with the kubectl that asks the same.
func (r *run) rights(ctx context.Context) error {
	needs := []need{
		{"create", "", "namespaces", ""}, {"delete", "", "namespaces", ""}, {"list", "", "namespaces", ""}, {"get", "", "namespaces", ""},
		{"patch", "", "namespaces", ""},
		{"create", "", "pods", r.ns}, {"get", "", "pods", r.ns}, {"list", "", "pods", r.ns},
		{"create", "", "services", r.ns}, {"get", "", "services", r.ns},
		{"create", "networking.k8s.io", "networkpolicies", r.ns},
		{"list", "", "pods", flockNS},
		{"list", "flock.fritzlab.net", "nodeconfigs", ""}, {"list", "flock.fritzlab.net", "addresspools", ""},
		{"list", "flock.fritzlab.net", "addressclaims", ""},
	}
	var missing []string
	for _, n := range needs {
		rv, err := r.o.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: n.verb, Group: n.group, Resource: n.resource, Namespace: n.namespace}}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("ask the API what flockctl check may do: %w", err)
		}
		if !rv.Status.Allowed {
			missing = append(missing, n.String())
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s (see `kubectl auth can-i --list`; the check's namespaces are flock-check-*)", ErrRights, strings.Join(missing, ", "))
	}
	return nil
}

// keepAlive renews the check's mark on its namespace until ctx ends.
func (r *run) keepAlive(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(aliveEvery):
		}
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, Alive, time.Now().UTC().Format(time.RFC3339))
		_, _ = r.o.Client.CoreV1().Namespaces().Patch(ctx, r.ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: fieldManager})
	}
}

// aliveAt is when a check last marked ns alive, by the API server's
// clock (its managed fields' times); zero if no check ever did.
func aliveAt(ns *corev1.Namespace) time.Time {
	var at time.Time
	for _, m := range ns.ManagedFields {
		if m.Manager == fieldManager && m.Time != nil && m.Time.After(at) {
			at = m.Time.Time
		}
	}
	return at
}

// leftovers removes the namespaces of checks that were cut short: those
// whose mark is stale at now (the API server's time); a running check's
// (another operator's) stays.
func (r *run) leftovers(ctx context.Context, now time.Time) error {
	list, err := r.o.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: Label})
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	for _, ns := range list.Items {
		if ns.Name == r.ns {
			continue
		}
		if at := aliveAt(&ns); now.Sub(at) < aliveStale {
			r.add("another check runs", Skip, "namespace "+ns.Name+" is in use (its check was alive "+now.Sub(at).Round(time.Second).String()+" before this one began)", "")
			continue
		}
		r.say("removing namespace %s, left by a check that was cut short", ns.Name)
		if err := r.deleteNamespace(ctx, ns.Name); err != nil {
			return err
		}
		r.add("earlier check cleaned up", Pass, "namespace "+ns.Name+" removed", "")
	}
	return nil
}

func (r *run) deleteNamespace(ctx context.Context, name string) error {
	err := r.o.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete namespace %s: %w", name, err)
	}
	return r.wait(ctx, "namespace "+name+" gone", func() (bool, error) {
		_, err := r.o.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// cleanup removes the check's namespace, also after ctx ended.
func (r *run) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), r.o.Timeout)
	defer cancel()
	r.say("removing namespace %s", r.ns)
	if err := r.deleteNamespace(ctx, r.ns); err != nil {
		r.add("clean up", Fail, err.Error(), "kubectl get namespace "+r.ns+" -o yaml")
	}
}

// wait polls done until it is true, fails, or the timeout.
func (r *run) wait(ctx context.Context, what string, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	for {
		ok, err := done()
		if ok {
			return nil
		}
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// flockNodes are the nodes whose flock pod is Ready, sorted.
func (r *run) flockNodes(ctx context.Context) ([]string, error) {
	pods, err := r.o.Client.CoreV1().Pods(flockNS).List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return nil, fmt.Errorf("list flock's pods: %w", err)
	}
	var nodes, notReady []string
	for _, p := range pods.Items {
		if podReady(&p) {
			nodes = append(nodes, p.Spec.NodeName)
		} else {
			notReady = append(notReady, p.Spec.NodeName)
		}
	}
	slices.Sort(nodes)
	if len(notReady) > 0 {
		r.add("flock pods Ready", Fail, "not Ready on "+strings.Join(notReady, ", "), "kubectl -n flock-system get pods -l "+agentSelector+" -o wide")
	} else if len(nodes) > 0 {
		r.add("flock pods Ready", Pass, fmt.Sprintf("%d nodes", len(nodes)), "")
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("no Ready flock pod in %s (kubectl -n %s get pods -l %s)", flockNS, flockNS, agentSelector)
	}
	return nodes, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// sessions checks every NodeConfig's status: each BGP session
// Established, and the route reconcilers passing (the routes advertised
// and in the kernel).
func (r *run) sessions(ctx context.Context) {
	list, err := r.o.Dynamic.Resource(nodeConfigs).List(ctx, metav1.ListOptions{})
	if err != nil {
		r.add("BGP sessions and routes", Fail, "list NodeConfigs: "+err.Error(), "kubectl get nodeconfigs")
		return
	}
	for _, nc := range list.Items {
		name := nc.GetName()
		up, _, _ := unstructured.NestedInt64(nc.Object, "status", "peersEstablished")
		all, _, _ := unstructured.NestedInt64(nc.Object, "status", "peersConfigured")
		why := "kubectl get nodeconfig " + name + " -o yaml; on the node: flockctl bgp neighbors"
		var bad []string
		if all == 0 {
			bad = append(bad, "no BGP peer configured")
		} else if up < all {
			bad = append(bad, fmt.Sprintf("%d of %d sessions Established", up, all))
		}
		recs, _, _ := unstructured.NestedSlice(nc.Object, "status", "reconcilers")
		for _, rec := range recs {
			m, _ := rec.(map[string]any)
			if failing, _ := m["failing"].(bool); failing {
				bad = append(bad, fmt.Sprintf("the %v reconciler fails: %v", m["target"], m["lastError"]))
			}
		}
		if len(bad) > 0 {
			r.add("BGP sessions and routes: "+name, Fail, strings.Join(bad, "; "), why)
			continue
		}
		r.add("BGP sessions and routes: "+name, Pass, fmt.Sprintf("%d/%d Established, routes in place", up, all), "")
	}
}

// pool is an AddressPool the check's namespace may use.
type pool struct {
	name  string
	cidrs []netip.Prefix
}

// pools are the AddressPools of use that the check's namespace may use:
// listed by name in namespaces (never the case: its name is new), or
// selected by namespaceSelector, which sees the namespace's labels (the
// check's Label among them).
func (r *run) pools(ctx context.Context, use string) ([]pool, error) {
	list, err := r.o.Dynamic.Resource(addressPools).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list AddressPools: %w", err)
	}
	nsLabels := labels.Set{Label: "true", "kubernetes.io/metadata.name": r.ns}
	var out []pool
	for _, p := range list.Items {
		uses, _, _ := unstructured.NestedStringSlice(p.Object, "spec", "use")
		if !slices.Contains(uses, use) {
			continue
		}
		sel, found, _ := unstructured.NestedMap(p.Object, "spec", "namespaceSelector")
		if !found {
			continue
		}
		var ls metav1.LabelSelector
		if err := runtimeDefault(sel, &ls); err != nil {
			continue
		}
		s, err := metav1.LabelSelectorAsSelector(&ls)
		if err != nil || !s.Matches(nsLabels) {
			continue
		}
		// An `addresses` or anycast IP is picked by the check itself: only
		// from a pool for checks (one that selects the check's namespace
		// by its label, not every namespace), never one production pods
		// may hold (anycast IPs are shared and never claimed).
		if use != "loadBalancer" && s.Matches(labels.Set{"kubernetes.io/metadata.name": r.ns}) {
			continue
		}
		cidrs, _, _ := unstructured.NestedStringSlice(p.Object, "spec", "cidrs")
		pl := pool{name: p.GetName()}
		for _, c := range cidrs {
			if pf, err := netip.ParsePrefix(c); err == nil {
				pl.cidrs = append(pl.cidrs, pf)
			}
		}
		out = append(out, pl)
	}
	return out, nil
}

func runtimeDefault(m map[string]any, into *metav1.LabelSelector) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(m, into)
}

// freeAddress is an address of the pools (IPv6 first) no AddressClaim
// holds: the last of a CIDR, stepping down.
func (r *run) freeAddress(ctx context.Context, pools []pool) (netip.Addr, error) {
	list, err := r.o.Dynamic.Resource(claimsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list AddressClaims: %w", err)
	}
	held := map[netip.Addr]bool{}
	for _, c := range list.Items {
		ip, _, _ := unstructured.NestedString(c.Object, "spec", "ip")
		if a, err := netip.ParseAddr(ip); err == nil {
			held[a] = true
		}
	}
	for _, v6 := range []bool{true, false} {
		for _, p := range pools {
			for _, c := range p.cidrs {
				if c.Addr().Is6() != v6 {
					continue
				}
				// From a point of this check's own (its namespace's
				// name): two checks at once do not pick the same.
				a := lastAddr(c)
				for range spread(r.ns, c) {
					if a.Prev().IsValid() && c.Contains(a.Prev()) {
						a = a.Prev()
					}
				}
				for range 256 {
					if !c.Contains(a) {
						break
					}
					if !held[a] && !r.picked[a] && a != c.Addr() {
						if r.picked == nil {
							r.picked = map[netip.Addr]bool{}
						}
						r.picked[a] = true
						return a, nil
					}
					a = a.Prev()
				}
			}
		}
	}
	return netip.Addr{}, errors.New("every address tried is claimed")
}

// spread is how far below its CIDR's last address a check starts
// looking: from its namespace's name, at most 64 or a quarter of the CIDR.
func spread(ns string, c netip.Prefix) int {
	h := fnv.New32a()
	h.Write([]byte(ns))
	size := 64
	if bits := c.Addr().BitLen() - c.Bits(); bits < 8 {
		size = max(1, (1<<bits)/4)
	}
	return int(h.Sum32() % uint32(size))
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// probePod is a probe pod on node: serving, or connecting to targets
// wanting a verdict (its outcome is its termination message).
func (r *run) probePod(name, node string, labels, annotations map[string]string, args ...string) *corev1.Pod {
	never := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.ns, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &never,
			TerminationGracePeriodSeconds: func() *int64 {
				v := int64(1)
				return &v
			}(),
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "probe", Image: r.o.Image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:                  append([]string{"/usr/local/bin/flockctl", "check-probe"}, args...),
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}},
		},
	}
}

// server starts a serving probe pod on node and returns its IPs.
func (r *run) server(ctx context.Context, name, node string, ann map[string]string) ([]netip.Addr, error) {
	p := r.probePod(name, node, map[string]string{roleLabel: "server", "name": name}, ann, "serve", "--port", strconv.Itoa(port))
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}}, PeriodSeconds: 1}
	if _, err := r.o.Client.CoreV1().Pods(r.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", r.ns, name, err)
	}
	var ips []netip.Addr
	err := r.wait(ctx, "pod "+name+" Ready on "+node, func() (bool, error) {
		got, err := r.o.Client.CoreV1().Pods(r.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if !podReady(got) {
			return false, nil
		}
		ips = nil
		for _, ip := range got.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				ips = append(ips, a)
			}
		}
		return true, nil
	})
	return ips, err
}

// probe runs a connecting probe pod on node and returns its outcomes.
func (r *run) probe(ctx context.Context, name, node string, labels map[string]string, want Verdict, targets []string) ([]Outcome, error) {
	args := append([]string{"connect", "--want", string(want)}, targets...)
	p := r.probePod(name, node, labels, nil, args...)
	if _, err := r.o.Client.CoreV1().Pods(r.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", r.ns, name, err)
	}
	var msg string
	err := r.wait(ctx, "probe "+name+" on "+node+" to finish", func() (bool, error) {
		got, err := r.o.Client.CoreV1().Pods(r.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, s := range got.Status.ContainerStatuses {
			if t := s.State.Terminated; t != nil {
				msg = t.Message
				if t.ExitCode != 0 && msg == "" {
					return false, fmt.Errorf("probe exited %d: %s", t.ExitCode, t.Reason)
				}
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	return ReadOutcomes(msg)
}

// target is host:port of an address.
func target(a netip.Addr) string { return netip.AddrPortFrom(a, port).String() }

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// traffic runs the probe pods: servers on two nodes (one on each, or one
// node twice), a client on the first probing the other's, an `addresses`
// and an anycast IP where a pool lets the check's namespace have one, a
// LoadBalancer address where a pool does, and a NetworkPolicy.
func (r *run) traffic(ctx context.Context, nodes []string) {
	a, b := nodes[0], nodes[0]
	across := "pod → pod across nodes (" + a + " → %s, %s)"
	if len(nodes) > 1 {
		b = nodes[1]
	} else {
		r.add("pod → pod across nodes", Skip, "one node runs flock", "")
		across = "pod → pod on one node (%s, %s)"
	}
	why := func(pod string) string {
		return "kubectl -n " + r.ns + " describe pod " + pod + " (the check keeps nothing: run it again and look while it runs)"
	}

	// Extra IPs for server B: an `addresses` IP, and anycast on both.
	ann := map[string]string{}
	var extras []struct {
		kind string
		ip   netip.Addr
	}
	for _, kind := range []string{"addresses", "anycast"} {
		pools, err := r.pools(ctx, kind)
		if err != nil || len(pools) == 0 {
			r.add("pod → "+kind+" IP", Skip, fmt.Sprintf("no AddressPool of use %s for checks (one selecting namespaces labelled %s=true, and not every namespace)", kind, Label), "")
			continue
		}
		ip, err := r.freeAddress(ctx, pools)
		if err != nil {
			r.add("pod → "+kind+" IP", Skip, err.Error(), "kubectl get addressclaims")
			continue
		}
		ann["flock.fritzlab.net/"+kind] = ip.String()
		extras = append(extras, struct {
			kind string
			ip   netip.Addr
		}{kind, ip})
	}
	r.say("server pods on %s and %s", a, b)
	if _, err := r.server(ctx, "server-a", a, nil); err != nil {
		r.add("probe pods run", Fail, err.Error(), why("server-a"))
		return
	}
	ipsB, err := r.server(ctx, "server-b", b, ann)
	if err != nil {
		r.add("probe pods run", Fail, err.Error(), why("server-b"))
		return
	}
	r.add("probe pods run", Pass, "servers on "+a+" and "+b, "")

	var targets []string
	for _, ip := range ipsB {
		targets = append(targets, target(ip))
	}
	for _, x := range extras {
		targets = append(targets, target(x.ip))
	}
	r.say("client on %s → %v", a, targets)
	out, err := r.probe(ctx, "client", a, map[string]string{roleLabel: "client"}, Answered, targets)
	if err != nil {
		r.add(fmt.Sprintf(across, b, "all"), Fail, err.Error(), why("client"))
		return
	}
	for i, o := range out {
		name := fmt.Sprintf(across, b, family(ipsOf(targets[i])))
		if i >= len(ipsB) {
			name = "pod → " + extras[i-len(ipsB)].kind + " IP " + extras[i-len(ipsB)].ip.String()
		}
		r.outcome(name, o, "flockctl routes and flockctl pods on "+b+"; the ToR's route to "+o.To)
	}

	r.loadBalancer(ctx, a, why)
	r.policy(ctx, a, ipsB, why)
}

func ipsOf(t string) netip.Addr {
	ap, _ := netip.ParseAddrPort(t)
	return ap.Addr()
}

func (r *run) outcome(name string, o Outcome, why string) {
	if o.OK {
		r.add(name, Pass, fmt.Sprintf("%s %s (%s)", o.To, o.Got, o.Detail), "")
		return
	}
	r.add(name, Fail, fmt.Sprintf("%s: %s, want %s (%s)", o.To, o.Got, o.Want, o.Detail), why)
}

// loadBalancer checks a LoadBalancer address flock assigns, from a pod
// (the address is reachable inside the cluster through kube-proxy).
func (r *run) loadBalancer(ctx context.Context, from string, why func(string) string) {
	const check = "LoadBalancer address"
	pools, err := r.pools(ctx, "loadBalancer")
	if err != nil || len(pools) == 0 {
		r.add(check, Skip, fmt.Sprintf("no AddressPool of use loadBalancer selects namespaces labelled %s=true", Label), "")
		return
	}
	class := lbClass
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lb", Namespace: r.ns},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Selector: map[string]string{roleLabel: "server"},
			Ports:    []corev1.ServicePort{{Name: "probe", Port: port, TargetPort: intstr.FromInt32(port)}}},
	}
	if _, err := r.o.Client.CoreV1().Services(r.ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		r.add(check, Fail, "create Service: "+err.Error(), "")
		return
	}
	var ips []netip.Addr
	err = r.wait(ctx, "the LoadBalancer address", func() (bool, error) {
		got, err := r.o.Client.CoreV1().Services(r.ns).Get(ctx, "lb", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ips = nil
		for _, in := range got.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil {
				ips = append(ips, a)
			}
		}
		return len(ips) > 0, nil
	})
	if err != nil {
		r.add(check, Fail, err.Error(), "kubectl -n "+r.ns+" describe service lb (its events); flockctl services on a node")
		return
	}
	var targets []string
	for _, ip := range ips {
		targets = append(targets, target(ip))
	}
	out, err := r.probe(ctx, "lb-client", from, map[string]string{roleLabel: "client"}, Answered, targets)
	if err != nil {
		r.add(check, Fail, err.Error(), why("lb-client"))
		return
	}
	for _, o := range out {
		r.outcome(check+" "+family(ipsOf(o.To))+" from a pod", o, "flockctl services on each node; kubectl -n "+r.ns+" describe service lb")
	}
}

// policy checks NetworkPolicy enforcement on server B: a pod it allows
// connects, another is blocked.
func (r *run) policy(ctx context.Context, from string, ipsB []netip.Addr, why func(string) string) {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "only-allowed", Namespace: r.ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"name": "server-b"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{roleLabel: "allowed"}}}}}},
		},
	}
	if _, err := r.o.Client.NetworkingV1().NetworkPolicies(r.ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		r.add("NetworkPolicy", Fail, "create NetworkPolicy: "+err.Error(), "")
		return
	}
	var targets []string
	for _, ip := range ipsB {
		targets = append(targets, target(ip))
	}
	for _, c := range []struct {
		name, role string
		want       Verdict
		check      string
	}{
		{"allowed", "allowed", Answered, "NetworkPolicy: an allowed pod connects"},
		{"denied", "client", Blocked, "NetworkPolicy: another pod is blocked"},
	} {
		out, err := r.probe(ctx, c.name, from, map[string]string{roleLabel: c.role}, c.want, targets)
		if err != nil {
			r.add(c.check, Fail, err.Error(), why(c.name))
			continue
		}
		for _, o := range out {
			r.outcome(c.check+" ("+family(ipsOf(o.To))+")", o, "flockctl policy "+r.ns+"/server-b on the node")
		}
	}
}
