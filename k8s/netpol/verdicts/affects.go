package verdicts

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// A node's program depends on every pod of the cluster only through few
// of them: its own, those a policy selects, those a rule of its own pods'
// policies names as a peer, and those sharing an address. A pod elsewhere
// that is none of these (most of a large cluster's churn) changes nothing,
// and flock-policy need not compile for it.

// errNotParsed: a frozen compiler was asked for a selector it did not
// parse (Deps then answers as if it matched).
var errNotParsed = errors.New("selector not parsed by the compile")

// Deps is what a compiled program depends on of the pods of other nodes:
// its context (this node's pods, the policies, the namespaces' labels),
// with which Classify tells the pod changes that cannot change it. Any
// other change (a policy, a namespace, an extra IP, a pod of this node)
// changes the context: Deps is then stale, and the caller compiles.
type Deps struct {
	c *compiler // frozen: the context alone, no index of pods
	// local are the rules, in both directions, of the policies of the
	// judged addresses' groups (this node's pods', and those of the pods
	// elsewhere sharing an address with one), with their namespace.
	local []localRule
	// full are the policies local's rules are of.
	full map[*networkingv1.NetworkPolicy]bool
	// judged are the judged addresses and their holders (ClassifyPolicy
	// matches a policy's peers against them).
	judged []judgedAt
	// several are the addresses several pods hold (extra IPs: anycast),
	// each with what the compile read of its holders (holdersRead).
	several map[netip.Addr]string
}

type judgedAt struct {
	a netip.Addr
	h []*trim.Pod
}

type localRule struct {
	ns    string
	r     rule
	named bool // an egress rule with a named port (resolved on each peer)
}

// deps freezes what Classify reads of c.
func (c *compiler) deps() *Deps {
	d := &Deps{c: &compiler{in: Input{Node: c.in.Node, ExtraPodIPs: c.in.ExtraPodIPs, PodsForIP: c.in.PodsForIP, Admin: c.in.Admin},
		ns: c.ns, policies: c.policies, sels: c.sels, prog: &Program{Selected: c.prog.Selected}}, full: c.full}
	// Every policy's pod selector, parsed (selects asks for them).
	for _, nps := range c.policies {
		for _, np := range nps {
			c.selector(&np.Spec.PodSelector)
		}
	}
	for np := range c.full {
		for _, t := range []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress} {
			rs, _ := rules(t, np)
			for _, r := range rs {
				lr := localRule{ns: np.Namespace, r: r}
				for _, pp := range r.ports {
					// Ingress named ports resolve on the judged pod.
					lr.named = lr.named || (t == networkingv1.PolicyTypeEgress && pp.Port != nil && pp.Port.StrVal != "")
				}
				for _, peer := range r.peers {
					if peer.PodSelector != nil {
						c.selector(peer.PodSelector)
					}
					if peer.NamespaceSelector != nil {
						c.selector(peer.NamespaceSelector)
					}
				}
				d.local = append(d.local, lr)
			}
		}
	}
	if !c.in.Admin {
		d.several = map[netip.Addr]string{}
		for _, k := range c.several {
			e := c.held[k]
			hs := make([]*trim.Pod, len(e.h))
			for i, pi := range e.h {
				hs[i] = c.pods[pi]
			}
			d.several[e.a] = holdersRead(hs)
		}
	}
	for _, a := range c.judged {
		j := judgedAt{a: a}
		if k, ok := c.find(a); ok {
			for _, i := range c.held[k].h {
				j.h = append(j.h, c.pods[i])
			}
		}
		d.judged = append(d.judged, j)
	}
	d.c.frozen = true
	c.frozen = true // the maps are shared from here on
	return d
}

// Effect is what a pod's change does to a node's program.
type Effect int

const (
	// Unchanged: the program compiled with the Deps stays what it is.
	Unchanged Effect = iota
	// Recompile: the program may change; the Deps stay true.
	Recompile
	// NewContext: the program and the Deps may change.
	NewContext
)

// Live is what Classify reads of the cluster as it is after the change.
type Live struct {
	Node        string
	ExtraPodIPs func(*trim.Pod) []string // nil: none
	PodsForIP   func(ip string) []string // nil: none
	// Holders are the pods whose status.podIPs hold ip (hostNetwork ones
	// left out, as the engine's index does).
	Holders func(ip string) []*trim.Pod
	// Local tells whether ip is a status IP of a pod of this node (any
	// phase, hostNetwork ones too), before or after the change. It is
	// asked with ip as netip prints it, and must answer for a pod's IP
	// written otherwise ("FD00::1") too.
	Local func(ip string) bool
	// Pod is the pod of key ("namespace/name"), nil if none (nil: none
	// known, so no extra IP is found stable).
	Pod func(key string) *trim.Pod
}

// holdersRead is what a compile reads of the pods holding an address
// several hold (an anycast IP of a workload's replicas): that there are
// several, and each one's namespace, labels and container ports (which
// policies select it, which peers match it, what its named ports resolve
// to), as a set: Group.Several intersects what each lets through, and the
// address's groups in the dispatch maps are theirs together, so holders
// alike count once. "" for fewer than two.
func holdersRead(hs []*trim.Pod) string {
	if len(hs) < 2 {
		return ""
	}
	kinds := make([]string, 0, len(hs))
	for _, h := range hs {
		var b strings.Builder
		b.WriteString(strconv.Quote(h.Namespace))
		for _, k := range slices.Sorted(maps.Keys(h.Labels)) {
			b.WriteString(" " + strconv.Quote(k) + "=" + strconv.Quote(h.Labels[k]))
		}
		b.WriteString(" ports")
		for i := range h.Spec.Containers {
			for _, cp := range h.Spec.Containers[i].Ports {
				b.WriteString(" " + strconv.Quote(cp.Name) + "/" + string(cp.Protocol) + "/" + strconv.Itoa(int(cp.ContainerPort)))
			}
		}
		kinds = append(kinds, b.String())
	}
	slices.Sort(kinds)
	return strings.Join(slices.Compact(kinds), "\n")
}

// stableSeveral: ip, an extra IP of pods of other nodes that is not
// judged here, was held by several pods when d was compiled and still is,
// by pods the compile reads alike (holdersRead): a change of its holders
// (a replica of an anycast workload elsewhere coming or going) leaves the
// program as it is. As the compile finds them: no status IP holds it, and
// its holders are the pods PodsForIP names that exist, not on the host's
// network, one of which holds it as an extra IP.
func (d *Deps) stableSeveral(l Live, ip string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil || !canonical(a, ip) || l.PodsForIP == nil || l.Pod == nil || l.ExtraPodIPs == nil {
		return false
	}
	was, ok := d.several[a]
	if !ok || (l.Holders != nil && len(l.Holders(ip)) > 0) {
		return false
	}
	var hs []*trim.Pod
	listed := false
	for _, key := range l.PodsForIP(ip) {
		if !strings.Contains(key, "/") {
			continue
		}
		h := l.Pod(key)
		if h == nil || h.Spec.HostNetwork {
			continue
		}
		hs = append(hs, h)
		listed = listed || slices.Contains(l.ExtraPodIPs(h), ip)
	}
	return listed && holdersRead(hs) == was
}

// Classify tells what a pod's change from old to cur (nil: none, as for
// an add or a delete) does to the program compiled with d (nil: none
// that is current). Whether it changes the context needs no Deps, except
// for a pod of another node with extra IPs: those change it only when
// judged here (an anycast IP this node's pods hold too); that it changes
// nothing needs them.
func Classify(l Live, d *Deps, old, cur *trim.Pod) Effect {
	extra := false
	for _, p := range []*trim.Pod{old, cur} {
		if p == nil {
			continue
		}
		if changesContext(l, p) {
			return NewContext
		}
		if l.ExtraPodIPs == nil {
			continue
		}
		for _, ip := range l.ExtraPodIPs(p) {
			if d == nil || extraInContext(l, d, ip) {
				return NewContext
			}
			extra = extra || !d.stableSeveral(l, ip)
		}
	}
	if d == nil || d.c.in.Admin || extra {
		// With the admin policies on, every isolated address is judged;
		// the groups of an address held as an extra IP are not worth
		// reasoning about (anycast: held by several pods), unless its
		// holders are read alike (stableSeveral).
		return Recompile
	}
	for _, p := range []*trim.Pod{old, cur} {
		if p != nil && d.affectedBy(p, l.Holders) {
			return Recompile
		}
	}
	return Unchanged
}

// ClassifyExtra tells what a change of the extra IPs' holders does to the
// program compiled with d (nil: none that is current): ips are the IPs
// whose holders changed, local whether the extra IPs of a pod of this
// node changed. A change of other nodes' pods' extra IPs that this node
// does not judge (most anycast churn: the replicas of a workload
// elsewhere) is a Recompile: the judged addresses and their holders, and
// so the policies the judged groups are built from, stay what they were.
func ClassifyExtra(l Live, d *Deps, ips []string, local bool) Effect {
	if local || d == nil || d.c.in.Admin {
		return NewContext
	}
	stable := true
	for _, ip := range ips {
		if extraInContext(l, d, ip) {
			return NewContext
		}
		stable = stable && d.stableSeveral(l, ip)
	}
	if stable {
		return Unchanged // an anycast workload's replicas elsewhere came or went
	}
	return Recompile
}

// extraInContext: the extra IP ip is judged with d, or a status IP of this
// node's pods, or written otherwise than the compile keys it.
func extraInContext(l Live, d *Deps, ip string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil || !canonical(a, ip) {
		return true // not worth reasoning about
	}
	return d.c.prog.Selected[a] || l.Local(ip)
}

// changesContext: p is this node's, or holds an address one of this
// node's pods or an extra IP does (the judged addresses, and who holds
// them, are the context).
func changesContext(l Live, p *trim.Pod) bool {
	if p.Spec.NodeName == l.Node {
		return true
	}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err != nil || !canonical(a, ip.IP) {
			return true // the compile keys addresses as parsed: not worth reasoning about
		}
		if l.Local(ip.IP) || (l.PodsForIP != nil && len(l.PodsForIP(ip.IP)) > 0) {
			return true
		}
	}
	return false
}

// affectedBy: a change of p, a pod of another node whose addresses are
// its own or other such pods', can change the program: p has addresses,
// and a policy selects it, or another pod holds one of them, or a rule
// of the judged addresses' policies names it as a peer.
func (d *Deps) affectedBy(p *trim.Pod, holders func(ip string) []*trim.Pod) bool {
	c := d.c
	if len(p.Status.PodIPs) == 0 {
		return false // no address: in no set and no group
	}
	if p.Spec.HostNetwork {
		return false // the engine resolves no address to it
	}
	for _, ip := range p.Status.PodIPs {
		if c.prog.Selected[netip.MustParseAddr(ip.IP)] {
			return true // (parsed by changesContext)
		}
		for _, h := range holders(ip.IP) {
			if h.Namespace != p.Namespace || h.Name != p.Name {
				return true // held by several, or by another now
			}
		}
	}
	// Selected by a policy of its namespace: its addresses have groups.
	for _, np := range c.policies[p.Namespace] {
		if _, ok := c.sels[&np.Spec.PodSelector]; !ok || c.selects(np, p) {
			return true
		}
	}
	return d.peer(p)
}

// peer: p is a peer of a rule of the judged addresses' policies (its
// addresses are in their groups' peer sets, or its ports in their named
// ones).
func (d *Deps) peer(p *trim.Pod) bool {
	c := d.c
	ports := false
	for i := range p.Spec.Containers {
		ports = ports || len(p.Spec.Containers[i].Ports) > 0
	}
	for _, lr := range d.local {
		if lr.named && ports {
			return true // egress named ports resolve on each peer
		}
		if c.selectorsMatch(lr.ns, lr.r, p) {
			return true
		}
	}
	return false
}

// ClassifyPolicy tells what a NetworkPolicy's update from old to cur does
// to the program compiled with d (nil: none that is current): Unchanged
// when cur judges every packet this node judges as old did, else
// NewContext. The pods of other nodes that a policy selects have groups
// built for the judged peers alone, so a rule's peer that matches none of
// those (most of a large cluster's policy churn, seen from one node)
// changes nothing here. So an update is Unchanged when the policy selects
// the same pods, isolates them in the same directions, is none of the
// policies of the judged addresses' own groups (Deps.full: those are
// built for every peer), and its rules let the same judged peers through
// on the same ports. An add or a delete is a NewContext.
func ClassifyPolicy(d *Deps, old, cur *networkingv1.NetworkPolicy) Effect {
	if d == nil || old == nil || cur == nil || d.c.in.Admin || old.Namespace != cur.Namespace || old.Name != cur.Name {
		return NewContext
	}
	for np := range d.full {
		if np.Namespace == cur.Namespace && np.Name == cur.Name {
			return NewContext
		}
	}
	if !equality.Semantic.DeepEqual(old.Spec.PodSelector, cur.Spec.PodSelector) {
		return NewContext
	}
	// A compiler of its own: the frozen one parses no new selector, and
	// Deps is read from several goroutines.
	c := &compiler{ns: d.c.ns, sels: map[*metav1.LabelSelector]parsed{}, blocks: map[*networkingv1.IPBlock][]Range{}}
	for _, t := range []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress} {
		was, is := slices.Contains(old.Spec.PolicyTypes, t), slices.Contains(cur.Spec.PolicyTypes, t)
		if was != is {
			return NewContext
		}
		if !is {
			continue // its rules in t judge nothing
		}
		a, okA := d.judgedView(c, t, old)
		b, okB := d.judgedView(c, t, cur)
		if !okA || !okB || a != b {
			return NewContext
		}
	}
	return Unchanged
}

// judgedView is what np's rules in direction t let through for any pod np
// selects, peers being judged addresses: whether the list is present but
// empty (everything), and each rule's ports (as written: they resolve on
// the pod, or the peer) and which judged addresses, and holders of each,
// its peers match. A group built for judged peers reads nothing else of
// np's rules.
func (d *Deps) judgedView(c *compiler, t networkingv1.PolicyType, np *networkingv1.NetworkPolicy) (string, bool) {
	rs, all := rules(t, np)
	var b strings.Builder
	if all {
		b.WriteString("all;")
	}
	bit := func(ok bool) {
		if ok {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	for _, r := range rs {
		b.WriteString("ports ")
		for _, pp := range r.ports {
			m, err := pp.Marshal()
			if err != nil {
				return "", false
			}
			b.WriteString(strconv.Itoa(len(m)))
			b.WriteByte(':')
			b.Write(m)
		}
		if len(r.peers) == 0 {
			b.WriteString(" any;")
			continue
		}
		b.WriteString(" peers ")
		for _, j := range d.judged {
			if len(j.h) <= 1 {
				var h *trim.Pod // judgedPeers: a selector matches a single holder only
				if len(j.h) == 1 {
					h = j.h[0]
				}
				bit(c.peerMatches(np.Namespace, r, h, j.a))
				continue
			}
			b.WriteByte('[') // Group.Several: each holder
			for _, h := range j.h {
				bit(c.peerMatches(np.Namespace, r, h, j.a))
			}
			b.WriteByte(']')
		}
		b.WriteByte(';')
	}
	return b.String(), true
}

// canonical: s is a as the compile keys it (its String), compared without
// making the string (every pod change of the cluster comes through here).
func canonical(a netip.Addr, s string) bool {
	var buf [64]byte
	return string(a.AppendTo(buf[:0])) == s
}
