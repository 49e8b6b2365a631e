// Package policyips tells the NetworkPolicy engine which pods hold the IPs
// flock binds beside status.podIPs — `addresses` and anycast IPs — so that
// traffic to and from them obeys the holder's policies exactly like its pod
// IPs. The answer comes from flock's authority, never from a pod's
// annotations alone (a hostile pod could name another's IP):
//   - an `addresses` IP belongs to the pod incarnation its AddressClaim
//     names (claims are created only after the AddressPool check);
//   - an anycast IP belongs to a running pod whose annotation asks for it
//     and whose namespace an AddressPool with use anycast allows;
//   - on this node, what the agent actually bound (its admin API) is the
//     truth for its pods: editing the annotations after ADD changes
//     nothing there, and neither does a claim the agent never bound.
package policyips

import (
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/pods"
)

// Inputs is everything the owners are derived from.
type Inputs struct {
	// Node is this node's name.
	Node string
	Pods []*trim.Pod
	// Namespaces' labels, by name (AddressPools select by them).
	Namespaces map[string]labels.Set
	// Pools are the valid AddressPools (authz.Compile's set); nil: none.
	Pools  *authz.Set
	Claims []v1alpha1.AddressClaim
	// Local is what this node's agent bound, per pod; nil when the agent
	// did not answer (then this node's pods are judged like any other).
	Local []admin.Pod
	// Stale is the last answer of an agent that does not answer now
	// (restarting, or waiting for its NodeConfig), read only while Local
	// is nil. What it bound stays bound in the kernel until the agent
	// serves again, so it stays covered beside what claims and pools say:
	// an agent that goes away must never shrink what policy protects.
	Stale []admin.Pod
}

// Owners maps extra IPs to the pods holding them. The zero value holds
// nothing. It is immutable once computed.
type Owners struct {
	byIP  map[string][]string // IP → pod keys (namespace/name), sorted
	byPod map[string][]string // pod key → IPs, sorted
	// byName is byPod by namespace and name: ExtraPodIPs is asked of
	// every pod of the cluster at each compile, and a key built for each
	// was garbage.
	byName map[podName][]string
}

type podName struct{ namespace, name string }

// PodsForIP returns the keys (namespace/name) of the pods holding ip.
func (o *Owners) PodsForIP(ip string) []string {
	if o == nil {
		return nil
	}
	return o.byIP[canonical(ip)]
}

// ExtraPodIPs returns the IPs pod holds besides status.podIPs.
func (o *Owners) ExtraPodIPs(pod *trim.Pod) []string {
	if o == nil || pod == nil {
		return nil
	}
	return o.byName[podName{pod.Namespace, pod.Name}]
}

// Equal reports whether o and p hold the same IPs for the same pods.
func (o *Owners) Equal(p *Owners) bool {
	var a, b map[string][]string
	if o != nil {
		a = o.byPod
	}
	if p != nil {
		b = p.byPod
	}
	return maps.EqualFunc(a, b, slices.Equal)
}

// Diff tells what changed from p (nil: nothing held) to o: the IPs whose
// holders changed and the keys (namespace/name) of the pods whose extra
// IPs changed, each sorted.
func (o *Owners) Diff(p *Owners) (ips, pods []string) {
	var a, b *Owners = p, o
	if a == nil {
		a = &Owners{}
	}
	if b == nil {
		b = &Owners{}
	}
	changed := func(x, y map[string][]string, out *[]string) {
		for k, v := range x {
			if w, ok := y[k]; !ok || !slices.Equal(v, w) {
				*out = append(*out, k)
			}
		}
		for k := range y {
			if _, ok := x[k]; !ok {
				*out = append(*out, k)
			}
		}
		slices.Sort(*out)
	}
	changed(a.byIP, b.byIP, &ips)
	changed(a.byPod, b.byPod, &pods)
	return ips, pods
}

// Len is the number of extra IPs held.
func (o *Owners) Len() int {
	if o == nil {
		return 0
	}
	return len(o.byIP)
}

func canonical(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	return a.Unmap().String()
}

// Compute derives the owners from in.
func Compute(in Inputs) *Owners {
	o := &Owners{byIP: map[string][]string{}, byPod: map[string][]string{}, byName: map[podName][]string{}}
	byKey := make(map[string]*trim.Pod, len(in.Pods))
	for _, p := range in.Pods {
		byKey[p.Namespace+"/"+p.Name] = p
	}
	add := func(p *trim.Pod, ip netip.Addr) {
		key, s := p.Namespace+"/"+p.Name, ip.Unmap().String()
		if !slices.Contains(o.byPod[key], s) {
			o.byPod[key] = append(o.byPod[key], s)
			o.byIP[s] = append(o.byIP[s], key)
			o.byName[podName{p.Namespace, p.Name}] = o.byPod[key]
		}
	}
	// live is a pod the engine can judge: in the API, not finished, not
	// on the host's network (its IPs are the node's).
	live := func(p *trim.Pod) bool {
		return p != nil && !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
	}

	// This node's pods: what the agent bound, for the incarnation it
	// bound it for (while it does not answer: what it last said it bound,
	// and below, what claims and pools allow).
	agentAnswered := in.Local != nil
	bound := in.Local
	if !agentAnswered {
		bound = in.Stale
	}
	for _, r := range bound {
		p := byKey[r.Namespace+"/"+r.Name]
		if !live(p) || p.Spec.NodeName != in.Node || !pods.MetaID(&p.ObjectMeta).Same(r.ID) || r.Phase == "deleting" {
			continue
		}
		for _, s := range append(slices.Clone(r.Addresses), r.Anycast...) {
			if ip, err := netip.ParseAddr(s); err == nil {
				add(p, ip)
			}
		}
	}
	mine := func(p *trim.Pod) bool { return agentAnswered && p.Spec.NodeName == in.Node }

	// `addresses`: the incarnation each claim names.
	for _, c := range in.Claims {
		if c.Spec.Use != v1alpha1.UseAddresses || c.Spec.Pod == nil {
			continue
		}
		p := byKey[c.Spec.Pod.Namespace+"/"+c.Spec.Pod.Name]
		if !live(p) || mine(p) || p.Spec.NodeName != c.Spec.Node {
			continue
		}
		id := pods.MetaID(&p.ObjectMeta)
		// Another node's pod: from the relays, its UID's start (trim.ShortUID).
		if c.Spec.Pod.UID != "" && !trim.SameUID(types.UID(c.Spec.Pod.UID), types.UID(id.UID)) && (c.Spec.Pod.StaticUID == "" || c.Spec.Pod.StaticUID != id.StaticUID) {
			continue
		}
		if ip, err := netip.ParseAddr(c.Spec.IP); err == nil {
			add(p, ip)
		}
	}

	// anycast: a running pod that asks, in a namespace a pool allows; never
	// an IP claimed as some pod's `addresses` (one pod's, by design: naming
	// it as anycast would make its owner's traffic obey the namer's
	// policies too).
	claimed := map[netip.Addr]bool{}
	for _, c := range in.Claims {
		if ip, err := netip.ParseAddr(c.Spec.IP); err == nil && c.Spec.Use == v1alpha1.UseAddresses {
			claimed[ip.Unmap()] = true
		}
	}
	if in.Pools != nil {
		for _, p := range in.Pods {
			if !live(p) || mine(p) || p.Status.Phase != corev1.PodRunning || p.Annotations[annotations.Anycast] == "" {
				continue
			}
			req, err := annotations.Parse(map[string]string{annotations.Anycast: p.Annotations[annotations.Anycast]}, annotations.Defaults{IPv6: true, IPv4: true})
			if err != nil {
				continue
			}
			for _, ip := range req.Anycast {
				if claimed[ip.Unmap()] {
					continue
				}
				if _, err := in.Pools.Authorize(v1alpha1.UseAnycast, netip.PrefixFrom(ip, ip.BitLen()), p.Namespace, in.Namespaces[p.Namespace]); err == nil {
					add(p, ip)
				}
			}
		}
	}
	for _, keys := range o.byIP {
		slices.Sort(keys)
	}
	for _, ips := range o.byPod {
		slices.Sort(ips)
	}
	return o
}
