package policyips

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

const node = "n1"

func pod(ns, name, uid, nodeName string, phase corev1.PodPhase, anycast string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: nodeName}, Status: corev1.PodStatus{Phase: phase}}
	if anycast != "" {
		p.Annotations = map[string]string{annotations.Anycast: anycast}
	}
	return p
}

// cached is ps as flock-policy's pod cache holds them (trim.Transform):
// what Compute reads.
func cached(ps ...*corev1.Pod) []*trim.Pod {
	out := make([]*trim.Pod, len(ps))
	for i, p := range ps {
		out[i] = trim.NewPod(p)
	}
	return out
}

func claim(ip, ns, name, uid, nodeName string) v1alpha1.AddressClaim {
	return v1alpha1.AddressClaim{Spec: v1alpha1.AddressClaimSpec{IP: ip, Use: v1alpha1.UseAddresses, Node: nodeName,
		Pod: &v1alpha1.ClaimPod{Namespace: ns, Name: name, UID: uid}}}
}

func anycastPool(t *testing.T, namespaces ...string) *authz.Set {
	t.Helper()
	s, err := authz.Compile([]v1alpha1.AddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "any"},
		Spec: v1alpha1.AddressPoolSpec{CIDRs: []string{"2001:db8:a::/64", "203.0.113.0/24"}, Use: []string{v1alpha1.UseAnycast}, Namespaces: namespaces}}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func record(p *corev1.Pod, addrs, anycast []string) admin.Pod {
	return admin.Pod{ID: pods.ID(p), Phase: "committed", Addresses: addrs, Anycast: anycast}
}

func TestCompute(t *testing.T) {
	web := pod("prod", "web", "u1", "n2", corev1.PodRunning, "")
	webNew := pod("prod", "web", "u2", "n2", corev1.PodRunning, "")
	dns := pod("prod", "dns", "u3", "n2", corev1.PodRunning, "2001:db8:a::53,203.0.113.53")
	evil := pod("dev", "evil", "u4", "n2", corev1.PodRunning, "2001:db8:a::53")
	pending := pod("prod", "dns2", "u5", "n2", corev1.PodPending, "2001:db8:a::53")
	done := pod("prod", "job", "u6", "n2", corev1.PodSucceeded, "")
	local := pod("prod", "local", "u7", node, corev1.PodRunning, "2001:db8:a::53")
	hostNet := pod("prod", "host", "u8", "n2", corev1.PodRunning, "2001:db8:a::53")
	hostNet.Spec.HostNetwork = true

	for _, tc := range []struct {
		name  string
		in    Inputs
		want  map[string][]string // IP → holders
		other map[string][]string // pod → IPs, checked too when set
	}{
		{name: "claim names the incarnation", in: Inputs{Pods: cached(web), Claims: []v1alpha1.AddressClaim{claim("2001:db8:b::10", "prod", "web", "u1", "n2")}},
			want: map[string][]string{"2001:db8:b::10": {"prod/web"}}},
		{name: "claim of an old incarnation holds nothing", in: Inputs{Pods: cached(webNew), Claims: []v1alpha1.AddressClaim{claim("2001:db8:b::10", "prod", "web", "u1", "n2")}},
			want: map[string][]string{}},
		{name: "claim for another node holds nothing", in: Inputs{Pods: cached(web), Claims: []v1alpha1.AddressClaim{claim("2001:db8:b::10", "prod", "web", "u1", "n3")}},
			want: map[string][]string{}},
		{name: "claim of a finished pod holds nothing", in: Inputs{Pods: cached(done), Claims: []v1alpha1.AddressClaim{claim("198.51.100.7", "prod", "job", "u6", "n2")}},
			want: map[string][]string{}},
		{name: "anycast allowed, several holders; hostile and pending pods excluded", in: Inputs{Pods: cached(dns, evil, pending, hostNet, pod("prod", "dns3", "u9", "n3", corev1.PodRunning, "2001:db8:a::53")),
			Pools: anycastPool(t, "prod")},
			want: map[string][]string{"2001:db8:a::53": {"prod/dns", "prod/dns3"}, "203.0.113.53": {"prod/dns"}}},
		{name: "anycast naming a claimed addresses IP holds nothing (only its claim does)", in: Inputs{
			Pods:   cached(web, pod("prod", "grab", "u10", "n2", corev1.PodRunning, "2001:db8:a::99")),
			Claims: []v1alpha1.AddressClaim{claim("2001:db8:a::99", "prod", "web", "u1", "n2")}, Pools: anycastPool(t, "prod")},
			want: map[string][]string{"2001:db8:a::99": {"prod/web"}}},
		// A Service's claim (a LoadBalancer address) names no pod: no pod
		// holds its IP through it, whatever pod shares the Service's name.
		{name: "a Service's claim holds nothing for pods", in: Inputs{Pods: cached(web), Claims: []v1alpha1.AddressClaim{{Spec: v1alpha1.AddressClaimSpec{
			IP: "2001:db8:b::50", Use: v1alpha1.UseLoadBalancer, Service: &v1alpha1.ClaimService{Namespace: "prod", Name: "web", UID: "s1"}}}}},
			want: map[string][]string{}},
		{name: "anycast without a pool holds nothing", in: Inputs{Pods: cached(dns)}, want: map[string][]string{}},
		{name: "anycast of a namespace the pool does not allow", in: Inputs{Pods: cached(dns), Pools: anycastPool(t, "other")}, want: map[string][]string{}},
		{name: "anycast by namespace label", in: Inputs{Pods: cached(evil), Namespaces: map[string]labels.Set{"dev": {"anycast": "yes"}},
			Pools: func() *authz.Set {
				s, _ := authz.Compile([]v1alpha1.AddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "sel"}, Spec: v1alpha1.AddressPoolSpec{CIDRs: []string{"2001:db8:a::/64"},
					Use: []string{v1alpha1.UseAnycast}, NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"anycast": "yes"}}}}})
				return s
			}()},
			want: map[string][]string{"2001:db8:a::53": {"dev/evil"}}},
		{name: "local pod: the agent's bindings, not its annotation", in: Inputs{Node: node, Pods: cached(local), Pools: anycastPool(t, "prod"),
			Local: []admin.Pod{record(local, []string{"2001:db8:b::20"}, nil)}},
			want: map[string][]string{"2001:db8:b::20": {"prod/local"}}},
		{name: "local pod: a claim the agent never bound holds nothing", in: Inputs{Node: node, Pods: cached(local),
			Claims: []v1alpha1.AddressClaim{claim("2001:db8:b::30", "prod", "local", "u7", node)}, Local: []admin.Pod{}},
			want: map[string][]string{}},
		{name: "local pod, agent silent: judged by claims and pools", in: Inputs{Node: node, Pods: cached(local), Pools: anycastPool(t, "prod"),
			Claims: []v1alpha1.AddressClaim{claim("2001:db8:b::30", "prod", "local", "u7", node)}},
			want: map[string][]string{"2001:db8:b::30": {"prod/local"}, "2001:db8:a::53": {"prod/local"}}},
		// The agent restarted and waits (or crashed): what it last said it
		// bound stays covered, with what claims and pools allow, even
		// where the annotation asks for something else now.
		{name: "local pod, agent gone: its last answer and claims and pools", in: Inputs{Node: node, Pods: cached(local), Pools: anycastPool(t, "prod"),
			Claims: []v1alpha1.AddressClaim{claim("2001:db8:b::30", "prod", "local", "u7", node)},
			Stale:  []admin.Pod{record(local, []string{"2001:db8:b::20"}, []string{"203.0.113.77"})}},
			want: map[string][]string{"2001:db8:b::20": {"prod/local"}, "203.0.113.77": {"prod/local"}, "2001:db8:b::30": {"prod/local"}, "2001:db8:a::53": {"prod/local"}}},
		{name: "the last answer is not read while the agent answers", in: Inputs{Node: node, Pods: cached(local),
			Local: []admin.Pod{}, Stale: []admin.Pod{record(local, []string{"2001:db8:b::20"}, nil)}},
			want: map[string][]string{}},
		{name: "the last answer for an old incarnation holds nothing", in: Inputs{Node: node, Pods: cached(local),
			Stale: []admin.Pod{{ID: podmeta.ID{Namespace: "prod", Name: "local", UID: "old"}, Phase: "committed", Addresses: []string{"2001:db8:b::20"}}}},
			want: map[string][]string{}},
		{name: "agent record of an old incarnation", in: Inputs{Node: node, Pods: cached(local),
			Local: []admin.Pod{{ID: podmeta.ID{Namespace: "prod", Name: "local", UID: "old"}, Phase: "committed", Addresses: []string{"2001:db8:b::20"}}}},
			want: map[string][]string{}},
		{name: "agent record of a pod on another node", in: Inputs{Node: node, Pods: cached(web), Local: []admin.Pod{record(web, []string{"2001:db8:b::20"}, nil)}},
			want: map[string][]string{}},
		{name: "agent record being deleted", in: Inputs{Node: node, Pods: cached(local),
			Local: []admin.Pod{{ID: pods.ID(local), Phase: "deleting", Anycast: []string{"2001:db8:a::53"}}}},
			want: map[string][]string{}},
		{name: "static pod: the claim's static UID matches a re-created mirror", in: Inputs{Pods: cached(func() *corev1.Pod {
			p := pod("kube-system", "s", "mirror-2", "n2", corev1.PodRunning, "")
			p.Annotations = map[string]string{pods.MirrorAnnotation: "static-1"}
			return p
		}()), Claims: []v1alpha1.AddressClaim{func() v1alpha1.AddressClaim {
			c := claim("2001:db8:b::40", "kube-system", "s", "mirror-1", "n2")
			c.Spec.Pod.StaticUID = "static-1"
			return c
		}()}},
			want: map[string][]string{"2001:db8:b::40": {"kube-system/s"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Compute(tc.in)
			got := map[string][]string{}
			for ip, keys := range o.byIP {
				got[ip] = keys
			}
			if len(got) != len(tc.want) {
				t.Fatalf("owners %v, want %v", got, tc.want)
			}
			for ip, keys := range tc.want {
				if !slices.Equal(o.PodsForIP(ip), keys) {
					t.Errorf("PodsForIP(%s) = %v, want %v", ip, o.PodsForIP(ip), keys)
				}
				for _, k := range keys {
					for _, p := range tc.in.Pods {
						if p.Namespace+"/"+p.Name == k && !slices.Contains(o.ExtraPodIPs(p), ip) {
							t.Errorf("ExtraPodIPs(%s) = %v, lacks %s", k, o.ExtraPodIPs(p), ip)
						}
					}
				}
			}
		})
	}
}

func TestOwnersNilSafe(t *testing.T) {
	var o *Owners
	if o.PodsForIP("2001:db8::1") != nil || o.ExtraPodIPs(&trim.Pod{}) != nil || o.Len() != 0 || !o.Equal(&Owners{}) {
		t.Fatal("nil Owners must hold nothing")
	}
	a := Compute(Inputs{Pods: cached(pod("a", "b", "u", "n", corev1.PodRunning, "")),
		Claims: []v1alpha1.AddressClaim{claim("::ffff:192.0.2.1", "a", "b", "u", "n")}})
	if !slices.Equal(a.PodsForIP("192.0.2.1"), []string{"a/b"}) {
		t.Fatalf("an IPv4-mapped claim is held as IPv4: %v", a.byIP)
	}
	if a.Equal(o) || !a.Equal(Compute(Inputs{Pods: cached(pod("a", "b", "u", "n", corev1.PodRunning, "")),
		Claims: []v1alpha1.AddressClaim{claim("192.0.2.1", "a", "b", "u", "n")}})) {
		t.Fatal("Equal")
	}
}

// Diff names exactly the IPs whose holders changed and the pods whose
// extra IPs changed between two random answers (either one nil too).
func TestOwnersDiff(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 0xd1ff))
	pool := anycastPool(t)
	ips := []string{"2001:db8:a::1", "2001:db8:a::2", "203.0.113.3", "2001:db8:b::4"}
	random := func() *Owners {
		if r.IntN(10) == 0 {
			return nil
		}
		in := Inputs{Node: node, Pools: pool, Namespaces: map[string]labels.Set{}}
		for i := range 6 {
			name := fmt.Sprintf("p%d", i)
			var any []string
			for _, ip := range ips[:3] {
				if r.IntN(3) == 0 {
					any = append(any, ip)
				}
			}
			in.Pods = append(in.Pods, trim.NewPod(pod("ns", name, "u"+name, "n2", corev1.PodRunning, strings.Join(any, ","))))
			if r.IntN(4) == 0 {
				in.Claims = append(in.Claims, claim(ips[3], "ns", name, "u"+name, "n2"))
			}
		}
		return Compute(in)
	}
	for range 500 {
		a, b := random(), random()
		var wantIPs, wantPods []string
		for _, ip := range ips {
			if !slices.Equal(a.PodsForIP(ip), b.PodsForIP(ip)) {
				wantIPs = append(wantIPs, ip)
			}
		}
		for i := range 6 {
			p := trim.NewPod(pod("ns", fmt.Sprintf("p%d", i), "", "", "", ""))
			if !slices.Equal(a.ExtraPodIPs(p), b.ExtraPodIPs(p)) {
				wantPods = append(wantPods, podKey(p))
			}
		}
		slices.Sort(wantIPs)
		gotIPs, gotPods := b.Diff(a)
		if !slices.Equal(gotIPs, wantIPs) || !slices.Equal(gotPods, wantPods) {
			t.Fatalf("%v → %v: Diff %v %v, want %v %v", a, b, gotIPs, gotPods, wantIPs, wantPods)
		}
		if (len(gotIPs) == 0) != a.Equal(b) {
			t.Fatalf("Diff %v but Equal %v", gotIPs, a.Equal(b))
		}
	}
}

// Another node's pod from the relays holds the start of its UID
// (trim.ShortUID): an `addresses` claim names the pod by its whole UID,
// and is its if that UID starts so, whatever the pod's annotations say
// now (its owner may edit them; the claim is the agent's); a claim of
// another incarnation is not.
func TestClaimsMatchShortUIDs(t *testing.T) {
	const uid, other = "0b5e6c1a-2f3d-4e5f-8a9b-0c1d2e3f4a5b", "7c1d2e3f-2f3d-4e5f-8a9b-0c1d2e3f4a5b"
	pod := func(held types.UID) *trim.Pod {
		return &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "holder", UID: held},
			Spec: trim.PodSpec{NodeName: "n2"}, Status: trim.PodStatus{Phase: corev1.PodRunning}}
	}
	claim := v1alpha1.AddressClaim{Spec: v1alpha1.AddressClaimSpec{IP: "2001:db8::a", Use: v1alpha1.UseAddresses, Node: "n2",
		Pod: &v1alpha1.ClaimPod{Namespace: "ns", Name: "holder", UID: uid}}}
	for _, c := range []struct {
		held types.UID
		owns bool
	}{{uid, true}, {trim.ShortUID(uid), true}, {other, false}, {trim.ShortUID(other), false}, {"", false}} {
		got := Compute(Inputs{Node: "n1", Pods: []*trim.Pod{pod(c.held)}, Claims: []v1alpha1.AddressClaim{claim}}).PodsForIP("2001:db8::a")
		if owns := len(got) == 1; owns != c.owns {
			t.Errorf("pod holding UID %q: owners %v, want the claim's: %t", c.held, got, c.owns)
		}
	}
}
