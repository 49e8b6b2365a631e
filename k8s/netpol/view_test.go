package netpol

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// testPod is a pod as flock-policy caches it (trim.NewPod).
func testPod(ns, name, node string, lbls map[string]string, ips ...string) *trim.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls}, Spec: corev1.PodSpec{NodeName: node}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return trim.NewPod(p)
}

func testPolicy(ns, name string, sel metav1.LabelSelector, types []networkingv1.PolicyType, egressRules int) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, PolicyTypes: types, Egress: make([]networkingv1.NetworkPolicyEgressRule, egressRules)}}
}

var (
	ingress     = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egress      = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	selectWeb   = metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	selectAll   = metav1.LabelSelector{}
	selectNone  = metav1.LabelSelector{MatchLabels: map[string]string{"app": "nothing"}}
	webLabels   = map[string]string{"app": "web"}
	otherLabels = map[string]string{"app": "db"}
)

func TestPodViews(t *testing.T) {
	web := testPod("a", "web", "n1", webLabels, "2001:db8::1", "192.0.2.1")
	for _, tc := range []struct {
		name     string
		pods     []*trim.Pod
		policies []*networkingv1.NetworkPolicy
		extra    func(*trim.Pod) []string
		want     []PodView // IPs, Ingress, Egress nil: empty
	}{
		{"no policies", []*trim.Pod{web}, nil, nil,
			[]PodView{{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "192.0.2.1"}}}},
		{"a policy selecting nothing", []*trim.Pod{web}, []*networkingv1.NetworkPolicy{testPolicy("a", "none", selectNone, both, 0)}, nil,
			[]PodView{{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "192.0.2.1"}}}},
		{"another namespace's policy", []*trim.Pod{web}, []*networkingv1.NetworkPolicy{testPolicy("b", "all", selectAll, both, 0)}, nil,
			[]PodView{{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "192.0.2.1"}}}},
		{"an empty podSelector selects every pod of its namespace",
			[]*trim.Pod{web, testPod("a", "db", "n1", otherLabels), testPod("a", "bare", "n1", nil)},
			[]*networkingv1.NetworkPolicy{testPolicy("a", "deny-all", selectAll, ingress, 0)}, nil,
			[]PodView{
				{Namespace: "a", Name: "bare", Node: "n1", Ingress: []string{"a/deny-all"}},
				{Namespace: "a", Name: "db", Node: "n1", Ingress: []string{"a/deny-all"}},
				{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "192.0.2.1"}, Ingress: []string{"a/deny-all"}},
			}},
		{"a label selector picks its pods", []*trim.Pod{web, testPod("a", "db", "n1", otherLabels)},
			[]*networkingv1.NetworkPolicy{testPolicy("a", "web-only", selectWeb, ingress, 0)}, nil,
			[]PodView{
				{Namespace: "a", Name: "db", Node: "n1"},
				{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "192.0.2.1"}, Ingress: []string{"a/web-only"}},
			}},
		{"policyTypes: ingress, egress, both; none: ingress, plus egress with egress rules", []*trim.Pod{web},
			[]*networkingv1.NetworkPolicy{
				testPolicy("a", "p-egress", selectWeb, egress, 0),
				testPolicy("a", "p-both", selectWeb, both, 0),
				testPolicy("a", "p-ingress", selectWeb, ingress, 3),
				testPolicy("a", "p-untyped", selectWeb, nil, 0),
				testPolicy("a", "p-untyped-egress-rules", selectWeb, nil, 1),
			}, nil,
			[]PodView{{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "192.0.2.1"},
				Ingress: []string{"a/p-both", "a/p-ingress", "a/p-untyped", "a/p-untyped-egress-rules"},
				Egress:  []string{"a/p-both", "a/p-egress", "a/p-untyped-egress-rules"}}}},
		{"extra IPs follow status.podIPs, without repeats", []*trim.Pod{web}, nil,
			func(p *trim.Pod) []string {
				if p.Name != "web" {
					return nil
				}
				return []string{"2001:db8:ff::53", "2001:db8::1", "198.51.100.7"}
			},
			[]PodView{{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "192.0.2.1", "2001:db8:ff::53", "198.51.100.7"}}}},
		{"host-network pods are left out", []*trim.Pod{web, func() *trim.Pod {
			p := testPod("a", "host", "n1", webLabels, "203.0.113.9")
			p.Spec.HostNetwork = true
			return p
		}()}, []*networkingv1.NetworkPolicy{testPolicy("a", "web-only", selectWeb, ingress, 0)}, nil,
			[]PodView{{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "192.0.2.1"}, Ingress: []string{"a/web-only"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PodViews(tc.pods, tc.policies, tc.extra)
			if !viewsEqual(got, tc.want) {
				t.Errorf("PodViews:\n got %+v\nwant %+v", got, tc.want)
			}
			// Empty lists go out as [], not null: a reader can range over them.
			for _, v := range got {
				if v.IPs == nil || v.Ingress == nil || v.Egress == nil {
					t.Errorf("%s/%s: a nil list: %+v", v.Namespace, v.Name, v)
				}
			}
		})
	}
}

func viewsEqual(a, b []PodView) bool {
	return slices.EqualFunc(a, b, func(x, y PodView) bool {
		return x.Namespace == y.Namespace && x.Name == y.Name && x.Node == y.Node &&
			slices.Equal(x.IPs, y.IPs) && slices.Equal(x.Ingress, y.Ingress) && slices.Equal(x.Egress, y.Egress)
	})
}

// The admin API answers from the caches: this node's pods, or a named pod
// anywhere; a malformed or unknown pod, or caches not synced, are errors
// with their HTTP status.
func TestViewHandler(t *testing.T) {
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	policies := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	host := testPod("a", "host", "n1", webLabels, "203.0.113.9")
	host.Spec.HostNetwork = true
	for _, p := range []*trim.Pod{testPod("a", "web", "n1", webLabels, "2001:db8::1"), testPod("a", "far", "n2", webLabels, "2001:db8::2"), host} {
		if err := pods.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := policies.Add(testPolicy("a", "web", selectWeb, both, 0)); err != nil {
		t.Fatal(err)
	}
	synced := false
	v := &View{}
	get := func(query string) (int, string) {
		rec := httptest.NewRecorder()
		v.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/policies"+query, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(""); code != http.StatusServiceUnavailable || !strings.Contains(body, "not synced") {
		t.Errorf("before Run attached the caches: %d %q, want 503", code, body)
	}
	v.attach(&viewSource{node: "n1", pods: trim.NewPodLister(pods), policies: networkinglisters.NewNetworkPolicyLister(policies),
		extraIPs: func(*trim.Pod) []string { return []string{"2001:db8:ff::1"} },
		synced:   []cache.InformerSynced{func() bool { return synced }}})
	if code, body := get(""); code != http.StatusServiceUnavailable || !strings.Contains(body, "not synced") {
		t.Errorf("caches not synced: %d %q, want 503", code, body)
	}
	synced = true
	for _, tc := range []struct {
		query string
		want  []PodView
	}{
		{"", []PodView{{Namespace: "a", Name: "web", Node: "n1", IPs: []string{"2001:db8::1", "2001:db8:ff::1"}, Ingress: []string{"a/web"}, Egress: []string{"a/web"}}}},
		{"?pod=a/far", []PodView{{Namespace: "a", Name: "far", Node: "n2", IPs: []string{"2001:db8::2", "2001:db8:ff::1"}, Ingress: []string{"a/web"}, Egress: []string{"a/web"}}}},
	} {
		code, body := get(tc.query)
		var got []PodView
		if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil || !viewsEqual(got, tc.want) {
			t.Errorf("%q: %d %s (%v), want %+v", tc.query, code, body, err, tc.want)
		}
	}
	for _, tc := range []struct {
		query string
		code  int
		want  string
	}{
		{"?pod=web", http.StatusBadRequest, `pod "web": want NAMESPACE/NAME`},
		{"?pod=a/b/c", http.StatusBadRequest, `pod "a/b/c": want NAMESPACE/NAME`},
		{"?pod=a/gone", http.StatusNotFound, "pod a/gone not found"},
		{"?pod=a/host", http.StatusNotFound, "pod a/host is on the host's network"},
	} {
		if code, body := get(tc.query); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%q: %d %q, want %d naming %q", tc.query, code, body, tc.code, tc.want)
		}
	}
	v.attach(nil)
	if code, _ := get(""); code != http.StatusServiceUnavailable {
		t.Errorf("after Run returned: %d, want 503", code)
	}
}
