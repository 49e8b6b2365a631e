package netpol

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/policyapi"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// PodView is a pod and the NetworkPolicies that isolate it (the admin
// API's row; its type lives in policyapi so that flockctl links no
// client-go).
type PodView = policyapi.PodView

// PodViews tells, for each pod, which NetworkPolicies select it and
// isolate it in each direction, by the API's policyTypes semantics: a
// policy without policyTypes isolates ingress, and egress only if it has
// egress rules. Pods on the host's network are left out: the engine never
// attributes a packet to them, so no policy applies. Rows are sorted by
// namespace/name, policies by name.
func PodViews(pods []*trim.Pod, policies []*networkingv1.NetworkPolicy, extraIPs func(*trim.Pod) []string) []PodView {
	type compiled struct {
		key             string
		namespace       string
		sel             labels.Selector
		ingress, egress bool
	}
	cs := make([]compiled, 0, len(policies))
	for _, p := range policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			// The engine skips it too; the API server refuses such a
			// selector, so this is a cache of something odd.
			continue
		}
		in, eg := isolates(p.Spec)
		cs = append(cs, compiled{key: p.Namespace + "/" + p.Name, namespace: p.Namespace, sel: sel, ingress: in, egress: eg})
	}
	views := make([]PodView, 0, len(pods))
	for _, pod := range pods {
		if pod.Spec.HostNetwork {
			continue
		}
		v := PodView{Namespace: pod.Namespace, Name: pod.Name, Node: pod.Spec.NodeName,
			IPs: podIPs(pod, extraIPs), Ingress: []string{}, Egress: []string{}}
		set := labels.Set(pod.Labels)
		for _, c := range cs {
			if c.namespace != pod.Namespace || !c.sel.Matches(set) {
				continue
			}
			if c.ingress {
				v.Ingress = append(v.Ingress, c.key)
			}
			if c.egress {
				v.Egress = append(v.Egress, c.key)
			}
		}
		slices.Sort(v.Ingress)
		slices.Sort(v.Egress)
		views = append(views, v)
	}
	slices.SortFunc(views, func(a, b PodView) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return views
}

// isolates reads policyTypes; the API server fills them in on create, but
// a policy read from elsewhere (a test, an old object) may lack them.
func isolates(spec networkingv1.NetworkPolicySpec) (ingress, egress bool) {
	if len(spec.PolicyTypes) == 0 {
		return true, len(spec.Egress) > 0
	}
	for _, t := range spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// podIPs is status.podIPs, then the extra IPs not already among them.
func podIPs(pod *trim.Pod, extraIPs func(*trim.Pod) []string) []string {
	ips := make([]string, 0, len(pod.Status.PodIPs))
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if extraIPs != nil {
		for _, ip := range extraIPs(pod) {
			if !slices.Contains(ips, ip) {
				ips = append(ips, ip)
			}
		}
	}
	return ips
}

// View serves PodViews from the engine's own informer caches (what the
// engine decides from), for flock-policy's admin API. Run attaches the
// caches (Config.View); until they have synced, and after Run returned,
// the view answers errNotSynced.
type View struct {
	src atomic.Pointer[viewSource]
}

type viewSource struct {
	node     string
	pods     trim.PodLister
	policies networkinglisters.NetworkPolicyLister
	extraIPs func(*trim.Pod) []string
	synced   []cache.InformerSynced
}

var errNotSynced = errors.New("the policy engine's caches have not synced yet")

func (v *View) attach(src *viewSource) { v.src.Store(src) }

func (v *View) source() (*viewSource, error) {
	src := v.src.Load()
	if src == nil {
		return nil, errNotSynced
	}
	for _, s := range src.synced {
		if !s() {
			return nil, errNotSynced
		}
	}
	return src, nil
}

// requestError is a question the view cannot answer (a malformed pod
// name, a pod it does not hold), with the HTTP status that says so.
type requestError struct {
	status int
	msg    string
}

func (e requestError) Error() string { return e.msg }

// Pods returns the views of the pods on this node, or with pod
// ("namespace/name") of that pod wherever it runs.
func (v *View) Pods(pod string) ([]PodView, error) {
	src, err := v.source()
	if err != nil {
		return nil, err
	}
	if pod == "" {
		all, err := src.pods.List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		local := make([]*trim.Pod, 0, len(all))
		for _, p := range all {
			if p.Spec.NodeName == src.node {
				local = append(local, p)
			}
		}
		policies, err := src.policies.List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("list network policies: %w", err)
		}
		return PodViews(local, policies, src.extraIPs), nil
	}
	ns, name, ok := strings.Cut(pod, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, requestError{http.StatusBadRequest, fmt.Sprintf("pod %q: want NAMESPACE/NAME", pod)}
	}
	p, err := src.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// From the relays, another node's pod comes with its addresses.
		return nil, requestError{http.StatusNotFound, fmt.Sprintf("pod %s not found (of other nodes' pods, those with addresses are known here)", pod)}
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s: %w", pod, err)
	}
	if p.Spec.HostNetwork {
		return nil, requestError{http.StatusNotFound, fmt.Sprintf("pod %s is on the host's network: NetworkPolicy does not apply to it", pod)}
	}
	policies, err := src.policies.NetworkPolicies(ns).List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list network policies of %s: %w", ns, err)
	}
	return PodViews([]*trim.Pod{p}, policies, src.extraIPs), nil
}

// Handler serves GET /v1/policies[?pod=NAMESPACE/NAME].
func (v *View) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+policyapi.PoliciesPath, func(w http.ResponseWriter, r *http.Request) {
		views, err := v.Pods(r.URL.Query().Get("pod"))
		var re requestError
		switch {
		case errors.Is(err, errNotSynced):
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		case errors.As(err, &re):
			http.Error(w, err.Error(), re.status)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(views); err != nil {
			slog.Warn("policy admin: write response", "path", r.URL.Path, "err", err)
		}
	})
	return mux
}
