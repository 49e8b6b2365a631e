package verdicts

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	npav1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// Input is the cluster as the engine sees it on one node.
type Input struct {
	Node       string
	Pods       []*trim.Pod
	Namespaces []*corev1.Namespace
	Policies   []*networkingv1.NetworkPolicy
	// ExtraPodIPs are the IPs a pod holds besides status.podIPs;
	// PodsForIP the holders ("namespace/name") of an IP that is in no
	// status.podIPs. Nil: none (the engine's Config fields of the same
	// names).
	ExtraPodIPs func(*trim.Pod) []string
	PodsForIP   func(ip string) []string
	// Admin: AdminNetworkPolicy or BaselineAdminNetworkPolicy is on (the
	// engine's Config fields of those names), and AdminSubjects are the
	// subjects of the policies of the APIs that are on. The engine then
	// judges every packet, and the admin policies decide only packets
	// from or to a pod one of them applies to: those go to the engine
	// (Program.Queued), and the program decides the rest.
	Admin         bool
	AdminSubjects []npav1alpha1.AdminNetworkPolicySubject
}

type compiler struct {
	in Input
	// pods are in.Pods; held are the addresses pods hold (hold), sorted
	// by compareAddrs, each with its holders as indexes into pods: one
	// sorted slice, where maps of every address were most of a large
	// cluster's compile and of its garbage. s is the working memory.
	pods []*trim.Pod
	held []heldAddr
	s    *scratch
	// nsOf is each pod's namespace as an index into nsNames and
	// nsPolicies (that namespace's policies): a pod's namespace is hashed
	// once a compile, not at each of its addresses and each lookup.
	nsOf       []int32
	nsNames    []string
	nsPolicies [][]*networkingv1.NetworkPolicy
	ns         map[string]labels.Set
	policies   map[string][]*networkingv1.NetworkPolicy // by namespace
	peers      map[string]*Addrs
	// from are the rules each peer set of the groups built for every
	// peer is of (Program.peerFrom).
	from   map[*Addrs][]peerSource
	prog   *Program
	groups map[string]int
	// known caches groups by the policies they are of (same policies,
	// same key): the key is built once per group, not once per pod.
	known map[groupKnown]int
	// single and several are the held addresses (indexes into held, so
	// sorted) by whether one pod or several hold them; singleNS are the
	// single ones by their pod's namespace (sorted too), so a peer's
	// selectors look only at the namespaces they can match.
	single, several []int32
	singleNS        map[string][]int32
	sels            map[*metav1.LabelSelector]parsed
	// nsMatch caches the namespaces (of singleNS) a namespace selector
	// matches.
	nsMatch map[*metav1.LabelSelector][]string
	// blocks caches each ipBlock's ranges.
	blocks map[*networkingv1.IPBlock][]Range
	// judged are the addresses the program judges, sorted (nil with the
	// admin policies on: every isolated address is judged then), and
	// judgedSingle, judgedSeveral those of them (indexes into held) one
	// pod, several pods hold.
	judged                      []netip.Addr
	judgedSingle, judgedSeveral []int32
	allSingle                   *Addrs
	// full are the policies of the groups built for every peer (of the
	// judged addresses), whose rules' peers Deps follows.
	full map[*networkingv1.NetworkPolicy]bool
	// frozen: the compile is done and the selectors parsed are all there
	// are (Deps reads them from several goroutines).
	frozen bool
}

// scratch is a compile's working memory, kept for the next one (none of
// it outlives a compile): at the full envelope it is some 35 MB a compile
// that the collector would otherwise reclaim, scanning the heap for it.
type scratch struct {
	pairs  []pair
	held   []heldAddr
	picks  []int32
	nsOf   []int32
	memo   []podGroups
	single []int32
	byNS   []int32 // singleNS's lists, one array
	count  []int32
	// egress and ingress are the sizes of the last program's maps: the
	// next one's are made that large, not grown to it.
	egress, ingress int
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// pair is an address a pod holds, sorted by hold.
type pair struct {
	k addrKey
	a netip.Addr
	p int32 // a status holder's index in pods; -1: none
}

// strAt is where a string is: two strings at the same place, of the same
// length, are the same (strings are immutable).
type strAt struct {
	p *byte
	n int
}

// selectingKey is a namespace (nsOf's id) and a labels map by where it
// is: within a compile every pod is held, so two maps at one place are
// one map, and a cached pod's never changes (trim.Pod shares one between
// the replicas of a workload).
type selectingKey struct {
	ns     int32
	labels unsafe.Pointer
}

// podGroups are a pod's groups (-1: none), found once a compile.
type podGroups struct {
	set, remote bool
	eg, in      int32
}

// heldAddr is an address and the pods hold finds at it (indexes into
// compiler.pods, never empty).
type heldAddr struct {
	a netip.Addr
	h []int32
}

// first is the (first) pod at held[k].
func (c *compiler) first(k int32) *trim.Pod { return c.pods[c.held[k].h[0]] }

// find is a's index in held.
func (c *compiler) find(a netip.Addr) (int32, bool) {
	ka := keyOf(a)
	k, ok := slices.BinarySearchFunc(c.held, a, func(e heldAddr, a netip.Addr) int { return compareAddrs(keyOf(e.a), ka, e.a, a) })
	return int32(k), ok
}

// addrKey is an address's 16 bytes (an IPv4 one mapped) as two numbers.
type addrKey struct{ hi, lo uint64 }

func keyOf(a netip.Addr) addrKey {
	b := a.As16()
	return addrKey{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// compareAddrs orders held: by the addresses' 16 bytes, then (an IPv4
// address and its IPv4-mapped IPv6 twin, zones) as netip does. Not
// netip's order (which puts every IPv4 address first), but a total one,
// and the compile's largest sort compares two numbers where netip's
// Compare takes several steps.
func compareAddrs(x, y addrKey, a, b netip.Addr) int {
	if x.hi != y.hi {
		return cmp.Compare(x.hi, y.hi)
	}
	if x.lo != y.lo {
		return cmp.Compare(x.lo, y.lo)
	}
	return a.Compare(b)
}

// parsed is a selector compiled once per Compile.
type parsed struct {
	sel labels.Selector
	err error
}

func (c *compiler) selector(ls *metav1.LabelSelector) (labels.Selector, error) {
	if p, ok := c.sels[ls]; ok {
		return p.sel, p.err
	}
	if c.frozen {
		return nil, errNotParsed
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	c.sels[ls] = parsed{sel, err}
	return sel, err
}

// Compile builds the program for in.
func Compile(in Input) *Program {
	p, _ := CompileDeps(in)
	return p
}

// CompileDeps builds the program for in, and what it depends on of the
// pods of other nodes (Deps.Affects).
func CompileDeps(in Input) (*Program, *Deps) {
	s := scratches.Get().(*scratch)
	defer scratches.Put(s)
	c := &compiler{in: in, pods: in.Pods, s: s,
		ns: map[string]labels.Set{}, policies: map[string][]*networkingv1.NetworkPolicy{},
		peers: map[string]*Addrs{}, from: map[*Addrs][]peerSource{}, groups: map[string]int{}, known: map[groupKnown]int{}, sels: map[*metav1.LabelSelector]parsed{},
		full:     map[*networkingv1.NetworkPolicy]bool{},
		singleNS: map[string][]int32{}, nsMatch: map[*metav1.LabelSelector][]string{}, blocks: map[*networkingv1.IPBlock][]Range{},
		prog: &Program{Selected: map[netip.Addr]bool{}, Egress: make(map[netip.Addr][]int, s.egress), Ingress: make(map[netip.Addr][]int, s.ingress)}}
	defer func() { s.egress, s.ingress = len(c.prog.Egress), len(c.prog.Ingress) }()
	pods := in.Pods
	for _, n := range in.Namespaces {
		c.ns[n.Name] = labels.Set(n.Labels)
	}
	for _, np := range in.Policies {
		c.policies[np.Namespace] = append(c.policies[np.Namespace], np)
	}
	c.hold()
	// single, and by namespace (a counting sort into one array, each
	// namespace's in held's order); the arrays are the scratch's.
	c.single = slices.Grow(s.single[:0], len(c.held))
	count := slices.Grow(s.count[:0], len(c.nsNames)+1)[:len(c.nsNames)+1]
	clear(count)
	for k, e := range c.held {
		if len(e.h) == 1 {
			c.single = append(c.single, int32(k))
			count[c.nsOf[e.h[0]]+1]++
		} else {
			c.several = append(c.several, int32(k))
		}
	}
	for id := range c.nsNames {
		count[id+1] += count[id] // count[id]: where namespace id's start
	}
	byNS := slices.Grow(s.byNS[:0], len(c.single))[:len(c.single)]
	next := slices.Clone(count[:len(c.nsNames)])
	for _, k := range c.single {
		id := c.nsOf[c.held[k].h[0]]
		byNS[next[id]] = k
		next[id]++
	}
	for id, name := range c.nsNames {
		if ks := byNS[count[id]:count[id+1]:count[id+1]]; len(ks) > 0 {
			c.singleNS[name] = ks
		}
	}
	s.single, s.byNS, s.count = c.single, byNS, count
	// Selected: this node's pods some policy selects, hostNetwork ones
	// too (getLocalPodsForNetworkPolicy does not skip them).
	for _, p := range pods {
		if p.Spec.NodeName != in.Node {
			continue
		}
		for _, np := range c.policies[p.Namespace] {
			if c.selects(np, p) {
				for _, s := range c.podIPs(p) {
					if a, err := netip.ParseAddr(s); err == nil {
						c.prog.Selected[a] = true
					}
				}
				break
			}
		}
	}
	// A packet is judged only if one of its ends is judged, so the groups
	// of an address that is not judged only ever meet judged peers: they
	// are built for those alone (a program of this node's size, not the
	// cluster's). With the admin policies on, every isolated address is
	// judged.
	if !in.Admin {
		c.judged = sortedAddrs(c.prog.Selected)
		for _, a := range c.judged {
			k, ok := c.find(a)
			switch {
			case !ok:
			case len(c.held[k].h) == 1:
				c.judgedSingle = append(c.judgedSingle, k)
			default:
				c.judgedSeveral = append(c.judgedSeveral, k)
			}
		}
	}
	// A pod's groups are the same at each of its addresses (for the same
	// remote): found once a pod, not once an address. An address one pod
	// holds gets its group's list of one (cap 1: an append copies), shared.
	memo := slices.Grow(c.s.memo[:0], len(pods))[:len(pods)]
	clear(memo)
	c.s.memo = memo
	var ones [][]int
	one := func(g int) []int {
		for len(ones) <= g {
			ones = append(ones, []int{len(ones)})
		}
		return ones[g]
	}
	selected := map[selectingKey][]*networkingv1.NetworkPolicy{}
	for _, e := range c.held {
		remote := !in.Admin && !c.prog.Selected[e.a]
		for _, pi := range e.h {
			m := &memo[pi]
			if !m.set || m.remote != remote {
				*m = podGroups{set: true, remote: remote, eg: -1, in: -1}
				p := pods[pi]
				var nps []*networkingv1.NetworkPolicy
				if ns := c.nsOf[pi]; len(c.nsPolicies[ns]) > 0 {
					sk := selectingKey{ns, *(*unsafe.Pointer)(unsafe.Pointer(&p.Labels))}
					var ok bool
					if nps, ok = selected[sk]; !ok {
						nps = c.selecting(p, c.nsPolicies[ns])
						selected[sk] = nps
					}
				}
				if len(nps) > 0 { // for both directions
					if g, ok := c.group(networkingv1.PolicyTypeEgress, p, nps, remote); ok {
						m.eg = int32(g)
					}
					if g, ok := c.group(networkingv1.PolicyTypeIngress, p, nps, remote); ok {
						m.in = int32(g)
					}
				}
			}
			for _, d := range []struct {
				g  int32
				by map[netip.Addr][]int
			}{{m.eg, c.prog.Egress}, {m.in, c.prog.Ingress}} {
				switch {
				case d.g < 0:
				case len(e.h) == 1:
					d.by[e.a] = one(int(d.g))
				case !slices.Contains(d.by[e.a], int(d.g)):
					d.by[e.a] = append(d.by[e.a], int(d.g))
				}
			}
		}
	}
	if in.Admin {
		c.admin(pods)
	}
	return c.prog, c.deps()
}

// admin makes the program the engine's with the admin policies on. The
// engine then queues every packet, on every node, and evaluatePacket
// asks the admin policies only of pods they apply to: for a packet
// neither of whose ends a subject holds, the AdminNetworkPolicies pass,
// the BaselineAdminNetworkPolicies allow, and the NetworkPolicies alone
// decide, as without the admin policies but on every packet. So every
// address of a subject is queued, and every address some NetworkPolicy
// isolates, on any node, is judged (a packet from or to no such address
// passes either way).
func (c *compiler) admin(pods []*trim.Pod) {
	c.prog.Queued = map[netip.Addr]bool{}
	for _, p := range pods {
		if p.Spec.HostNetwork || !c.subject(p) {
			continue // the engine resolves no address to a hostNetwork pod
		}
		for _, s := range c.podIPs(p) {
			if a, err := netip.ParseAddr(s); err == nil {
				c.prog.Queued[a] = true
			}
		}
	}
	c.prog.Selected = map[netip.Addr]bool{}
	for _, by := range []map[netip.Addr][]int{c.prog.Egress, c.prog.Ingress} {
		for a, gs := range by {
			if len(gs) > 0 {
				c.prog.Selected[a] = true
			}
		}
	}
}

// subject is getAdminNetworkPoliciesForPod's and
// getBaselineAdminNetworkPoliciesForPod's test, for any of the subjects:
// a namespace selector matches a namespace the cache holds, and a
// selector that does not parse matches nothing.
func (c *compiler) subject(p *trim.Pod) bool {
	nsLabels, ok := c.ns[p.Namespace]
	matches := func(ls *metav1.LabelSelector, set labels.Set) bool {
		sel, err := c.selector(ls)
		return err == nil && sel.Matches(set)
	}
	for i := range c.in.AdminSubjects {
		s := &c.in.AdminSubjects[i]
		if s.Namespaces != nil && ok && matches(s.Namespaces, nsLabels) {
			return true
		}
		if s.Pods != nil && ok && matches(&s.Pods.NamespaceSelector, nsLabels) && matches(&s.Pods.PodSelector, labels.Set(p.Labels)) {
			return true
		}
	}
	return false
}

func key(p *trim.Pod) string { return p.Namespace + "/" + p.Name }

// compareKeys orders a and b as strings.Compare(key(a), key(b)) does,
// without building the keys.
func compareKeys(a, b *trim.Pod) int {
	if a.Namespace == b.Namespace {
		return strings.Compare(a.Name, b.Name)
	}
	n := min(len(a.Namespace), len(b.Namespace))
	if c := strings.Compare(a.Namespace[:n], b.Namespace[:n]); c != 0 {
		return c
	}
	// One namespace is a prefix of the other: the keys differ where the
	// shorter one's "/" meets the longer one's next byte.
	if len(a.Namespace) == n {
		return cmp.Compare('/', b.Namespace[n])
	}
	return cmp.Compare(a.Namespace[n], '/')
}

// podIPs is the engine's podIPs: status.podIPs, then the extra ones.
func (c *compiler) podIPs(p *trim.Pod) []string {
	var out []string
	for _, ip := range p.Status.PodIPs {
		out = append(out, ip.IP)
	}
	if c.in.ExtraPodIPs != nil {
		out = append(out, c.in.ExtraPodIPs(p)...)
	}
	return out
}

// hold finds c.held: every address a pod holds (status.podIPs and the
// extra IPs) and the pods the engine's getPodsAssignedToIP finds at it,
// for a packet's address: the pod whose status.podIPs holds it (hostNetwork
// ones left out, and the IP written as netip prints it: the engine looks
// a packet's address up by that string, so an IP written otherwise
// ("FD00::1") holds nothing), a running one first (the engine's pick among
// several is arbitrary, this one takes the first by name); else every
// non-hostNetwork holder PodsForIP names. Addresses no pod is found at
// are left out.
func (c *compiler) hold() {
	pods := c.pods
	pairs := slices.Grow(c.s.pairs[:0], 2*len(pods)+len(pods)/16) // dual-stack, and some extra IPs
	defer func() { c.s.pairs = pairs }()
	var buf [64]byte
	c.nsOf = slices.Grow(c.s.nsOf[:0], len(pods))[:len(pods)]
	c.s.nsOf = c.nsOf
	// A namespace's id by where its name is (trim.Pod makes one copy of
	// each: hashing a string for each of 150,000 pods was a tenth of a
	// compile), by its name when that copy is new here.
	ids := map[string]int32{}
	at := map[strAt]int32{}
	for i, p := range pods {
		sa := strAt{unsafe.StringData(p.Namespace), len(p.Namespace)}
		id, ok := at[sa]
		if !ok {
			if id, ok = ids[p.Namespace]; !ok {
				id = int32(len(c.nsNames))
				ids[p.Namespace] = id
				c.nsNames = append(c.nsNames, p.Namespace)
				c.nsPolicies = append(c.nsPolicies, c.policies[p.Namespace])
			}
			at[sa] = id
		}
		c.nsOf[i] = id
		for _, ip := range p.Status.PodIPs {
			a, err := netip.ParseAddr(ip.IP)
			if err != nil {
				continue
			}
			held := int32(-1)
			if !p.Spec.HostNetwork && string(a.AppendTo(buf[:0])) == ip.IP {
				held = int32(i)
			}
			pairs = append(pairs, pair{keyOf(a), a, held})
		}
		if c.in.ExtraPodIPs != nil {
			for _, s := range c.in.ExtraPodIPs(p) {
				if a, err := netip.ParseAddr(s); err == nil {
					pairs = append(pairs, pair{keyOf(a), a, -1})
				}
			}
		}
	}
	// By address, then the status holders by key, then the rest.
	slices.SortFunc(pairs, func(x, y pair) int {
		if d := compareAddrs(x.k, y.k, x.a, y.a); d != 0 {
			return d
		}
		switch {
		case x.p == y.p:
			return 0
		case x.p < 0:
			return 1
		case y.p < 0:
			return -1
		}
		return compareKeys(pods[x.p], pods[y.p])
	})
	picks := slices.Grow(c.s.picks[:0], len(pairs)) // every one-pod holders list, one array
	c.held = slices.Grow(c.s.held[:0], len(pairs))
	defer func() { c.s.picks, c.s.held = picks, c.held }()
	var unheld []int
	for j := 0; j < len(pairs); {
		a, pick := pairs[j].a, int32(-1)
		k := j
		for ; k < len(pairs) && pairs[k].a == a; k++ {
			if p := pairs[k].p; p >= 0 && (pick < 0 || (pods[p].Status.Phase == corev1.PodRunning && pods[pick].Status.Phase != corev1.PodRunning)) {
				pick = p
			}
		}
		j = k
		switch {
		case pick >= 0:
			picks = append(picks, pick)
			c.held = append(c.held, heldAddr{a, picks[len(picks)-1 : len(picks) : len(picks)]})
		case c.in.PodsForIP != nil:
			unheld = append(unheld, len(c.held))
			c.held = append(c.held, heldAddr{a: a})
		}
	}
	if len(unheld) == 0 {
		return
	}
	c.named(unheld)
	c.held = slices.DeleteFunc(c.held, func(e heldAddr) bool { return len(e.h) == 0 })
}

// named finds the holders of held[unheld...], the addresses no status IP
// holds: the non-hostNetwork pods PodsForIP names, in its order. Only the
// pods named are looked for, once.
func (c *compiler) named(unheld []int) {
	type podKey struct{ ns, name string }
	names := make([][]podKey, len(unheld))
	wanted := map[podKey]int32{}
	wantedNS := map[string]bool{}
	for i, k := range unheld {
		for _, s := range c.in.PodsForIP(c.held[k].a.String()) {
			if ns, name, ok := strings.Cut(s, "/"); ok {
				names[i] = append(names[i], podKey{ns, name})
				wanted[podKey{ns, name}] = -1
				wantedNS[ns] = true
			}
		}
	}
	if len(wanted) == 0 {
		return
	}
	in := make([]bool, len(c.nsNames)) // by namespace index: one a wanted pod is in
	for id, ns := range c.nsNames {
		in[id] = wantedNS[ns]
	}
	for i, p := range c.pods {
		if !in[c.nsOf[i]] {
			continue
		}
		k := podKey{p.Namespace, p.Name}
		if _, ok := wanted[k]; ok {
			wanted[k] = int32(i)
		}
	}
	for i, k := range unheld {
		for _, n := range names[i] {
			if pi := wanted[n]; pi >= 0 && !c.pods[pi].Spec.HostNetwork {
				c.held[k].h = append(c.held[k].h, pi)
			}
		}
	}
}

// selects is getNetworkPoliciesForPod's test: a selector that does not
// parse selects nothing.
func (c *compiler) selects(np *networkingv1.NetworkPolicy, p *trim.Pod) bool {
	if np.Namespace != p.Namespace {
		return false
	}
	sel, err := c.selector(&np.Spec.PodSelector)
	return err == nil && sel.Matches(labels.Set(p.Labels))
}

// selecting lists the policies of nps (its namespace's) that select p,
// by name.
func (c *compiler) selecting(p *trim.Pod, nps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	for _, np := range nps {
		if c.selects(np, p) {
			out = append(out, np)
		}
	}
	slices.SortFunc(out, func(a, b *networkingv1.NetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// isolating lists the policies of selecting (a pod's) that name direction
// t in their policyTypes.
func isolating(t networkingv1.PolicyType, selecting []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	all := true
	for _, np := range selecting {
		all = all && slices.Contains(np.Spec.PolicyTypes, t)
	}
	if all {
		return selecting // read only: no copy
	}
	var out []*networkingv1.NetworkPolicy
	for _, np := range selecting {
		if slices.Contains(np.Spec.PolicyTypes, t) {
			out = append(out, np)
		}
	}
	return out
}

// rule is one ingress or egress rule, direction-neutral.
type rule struct {
	ports []networkingv1.NetworkPolicyPort
	peers []networkingv1.NetworkPolicyPeer
}

// rules are a policy's rules in direction t; all: its list is present
// but empty, which the engine reads as allowing everything (the API
// server never returns such a list: it drops it).
func rules(t networkingv1.PolicyType, np *networkingv1.NetworkPolicy) (out []rule, all bool) {
	if t == networkingv1.PolicyTypeEgress {
		if np.Spec.Egress == nil {
			return nil, false
		}
		for _, r := range np.Spec.Egress {
			out = append(out, rule{r.Ports, r.To})
		}
		return out, len(np.Spec.Egress) == 0
	}
	if np.Spec.Ingress == nil {
		return nil, false
	}
	for _, r := range np.Spec.Ingress {
		out = append(out, rule{r.Ports, r.From})
	}
	return out, len(np.Spec.Ingress) == 0
}

// group finds or builds the group for pod p in direction t, of the
// policies of selecting that isolate p in t; remote: for an address that
// is not judged, whose peers are then always judged ones (the group is
// built for those alone).
func (c *compiler) group(t networkingv1.PolicyType, p *trim.Pod, selecting []*networkingv1.NetworkPolicy, remote bool) (int, bool) {
	nps := isolating(t, selecting)
	if len(nps) == 0 {
		return 0, false
	}
	named := false
	if t == networkingv1.PolicyTypeIngress {
		for _, np := range nps {
			named = named || namedIngress(np)
		}
	}
	if !remote {
		for _, np := range nps {
			c.full[np] = true
		}
	}
	// Ingress named ports are this pod's own: they resolve on it, and
	// the group depends on the pod only through what they resolve to
	// (the replicas of a workload share one group).
	var ports string
	if named {
		ports = resolved(nps, p)
	}
	gk, cached := knownKey(t, remote, nps, ports)
	if cached {
		if i, ok := c.known[gk]; ok {
			return i, true
		}
	}
	k := groupKey(t, p.Namespace, nps, named, ports, remote)
	if i, ok := c.groups[k]; ok {
		if cached {
			c.known[gk] = i
		}
		return i, true
	}
	g := &Group{Key: k, Egress: t == networkingv1.PolicyTypeEgress}
	for _, np := range nps {
		rs, all := rules(t, np)
		if all {
			g.Terms = append(g.Terms, Term{Ports: Ports{All: true}})
		}
		for _, r := range rs {
			c.terms(g, t, np.Namespace, r, p, remote)
		}
	}
	g.Terms = mergeTerms(g.Terms, c.from)
	if !remote {
		// Sets of every peer: a patch may change them (Deps.Dispatch).
		for _, t := range g.Terms {
			if t.Peers != nil && t.Peers.id == 0 {
				c.prog.peerSets = append(c.prog.peerSets, t.Peers)
				c.prog.peerFrom = append(c.prog.peerFrom, c.from[t.Peers])
				t.Peers.id = int32(len(c.prog.peerSets))
			}
		}
	}
	// Peers several pods hold: what each pod there lets through,
	// intersected.
	several := c.several
	if remote {
		several = c.judgedSeveral
	}
	for _, k := range several {
		e := c.held[k]
		var together Ports
		for i, hi := range e.h {
			h := c.pods[hi]
			var one Ports
			for _, np := range nps {
				rs, all := rules(t, np)
				if all {
					one = Ports{All: true}
				}
				for _, r := range rs {
					if c.peerMatches(np.Namespace, r, h, e.a) {
						on := h // egress: named ports resolve on the peer
						if t == networkingv1.PolicyTypeIngress {
							on = p
						}
						one.union(c.ports(r, on))
					}
				}
			}
			if i == 0 {
				together = one
			} else {
				together = intersect(together, one)
			}
		}
		if g.Several == nil {
			g.Several = map[netip.Addr]Ports{}
		}
		g.Several[e.a] = together
	}
	c.prog.Groups = append(c.prog.Groups, g)
	i := len(c.prog.Groups) - 1
	c.groups[k] = i
	if cached {
		c.known[gk] = i
	}
	return i, true
}

// groupKey is the key of the group of policies nps (isolating, in t) for
// a pod in namespace ns whose ingress named ports resolve to ports (named:
// some do); remote: for an address that is not judged.
func groupKey(t networkingv1.PolicyType, ns string, nps []*networkingv1.NetworkPolicy, named bool, ports string, remote bool) string {
	var names []string
	for _, np := range nps {
		names = append(names, np.Name+"@"+string(np.UID)+"@"+np.ResourceVersion)
	}
	k := string(t) + " " + ns + " " + strings.Join(names, ",")
	if named {
		k += " ports " + ports
	}
	if remote {
		k += " for the judged"
	}
	return k
}

// groupKnown is what a group's key is made of, by the policies'
// identities: the same policies (the same objects: their namespace, name,
// UID and version), direction, judged peers or every peer, and resolved
// ingress named ports make the same key.
type groupKnown struct {
	t      networkingv1.PolicyType
	remote bool
	nps    [4]*networkingv1.NetworkPolicy
	ports  string
}

// knownKey is nps's groupKnown; false when there are too many policies
// to cache by (the key is built then).
func knownKey(t networkingv1.PolicyType, remote bool, nps []*networkingv1.NetworkPolicy, ports string) (groupKnown, bool) {
	k := groupKnown{t: t, remote: remote, ports: ports}
	if len(nps) > len(k.nps) {
		return k, false
	}
	copy(k.nps[:], nps)
	return k, true
}

// mergeTerms joins terms into fewer that match the same packets: those
// with the same peers into one with their ports together, then those with
// the same ports into one with their peers together. A group is a chain
// whose rules a new connection walks until one matches: unmerged, a pod
// that 100 policies select costs 100 lookups a connection. A set of peers
// joined is of the rules of those it joins (from, if not nil; none if one
// of them is of none).
func mergeTerms(ts []Term, from map[*Addrs][]peerSource) []Term {
	var byPeers []Term
	at := map[*Addrs]int{}
	for _, t := range ts {
		if t.Named != nil {
			byPeers = append(byPeers, t)
			continue
		}
		if i, ok := at[t.Peers]; ok {
			byPeers[i].Ports.union(t.Ports)
			continue
		}
		at[t.Peers] = len(byPeers)
		var own Ports // the union above must not change a Ports another term holds
		own.union(t.Ports)
		byPeers = append(byPeers, Term{Peers: t.Peers, Ports: own})
	}
	var out []Term
	same := map[string][]int{} // by ports: indexes into byPeers
	var order []string
	for i, t := range byPeers {
		if t.Named != nil {
			k := "named " + strconv.Itoa(i)
			same[k], order = []int{i}, append(order, k)
			continue
		}
		k := portsKey(t.Ports)
		if _, ok := same[k]; !ok {
			order = append(order, k)
		}
		same[k] = append(same[k], i)
	}
	for _, k := range order {
		is := same[k]
		if len(is) == 1 {
			out = append(out, byPeers[is[0]])
			continue
		}
		var b addrsBuilder
		var srcs []peerSource
		known := true
		any := false
		for _, i := range is {
			if byPeers[i].Peers == nil {
				any = true // no peers: every address
				break
			}
			b.addRanges(byPeers[i].Peers)
			f, ok := from[byPeers[i].Peers]
			known = known && ok
			srcs = append(srcs, f...)
		}
		t := Term{Ports: byPeers[is[0]].Ports}
		if !any {
			t.Peers = b.build()
			if from != nil && known {
				from[t.Peers] = srcs
			}
		}
		out = append(out, t)
	}
	return out
}

// portsKey identifies a set of ports.
func portsKey(p Ports) string {
	if p.All {
		return "all"
	}
	var b strings.Builder
	for _, proto := range Protocols {
		for _, r := range p.By[proto] {
			fmt.Fprintf(&b, "%d:%d-%d ", proto, r.First, r.Last)
		}
	}
	return b.String()
}

// namedIngress: a port of np's ingress rules is named.
func namedIngress(np *networkingv1.NetworkPolicy) bool {
	for _, r := range np.Spec.Ingress {
		for _, pp := range r.Ports {
			if pp.Port != nil && pp.Port.StrVal != "" {
				return true
			}
		}
	}
	return false
}

// resolved is what the ingress named ports of nps resolve to on p.
func resolved(nps []*networkingv1.NetworkPolicy, p *trim.Pod) string {
	var b strings.Builder
	for _, np := range nps {
		for _, r := range np.Spec.Ingress {
			for _, pp := range r.Ports {
				if pp.Port == nil || pp.Port.StrVal == "" {
					continue
				}
				b.WriteByte('[')
				for _, n := range namedPorts(p, pp) {
					b.WriteString(strconv.Itoa(int(n.proto)) + "/" + strconv.Itoa(int(n.port)) + " ")
				}
				b.WriteByte(']')
			}
		}
	}
	return b.String()
}

// terms adds rule r's terms to g; p is the pod the group is for.
func (c *compiler) terms(g *Group, t networkingv1.PolicyType, policyNS string, r rule, p *trim.Pod, remote bool) {
	var peers *Addrs
	if remote {
		peers = c.judgedPeers(policyNS, r)
	} else {
		peers = c.peerAddrs(policyNS, r)
	}
	if t == networkingv1.PolicyTypeIngress {
		if ports := c.ports(r, p); !ports.Empty() {
			g.Terms = append(g.Terms, Term{Peers: peers, Ports: ports})
		}
		return
	}
	if ports := c.ports(r, nil); !ports.Empty() {
		g.Terms = append(g.Terms, Term{Peers: peers, Ports: ports})
	}
	// Egress named ports resolve on the destination pod: one entry per
	// single-held address whose pod has the port and matches a peer.
	if !slices.ContainsFunc(r.ports, func(pp networkingv1.NetworkPolicyPort) bool { return pp.Port != nil && pp.Port.StrVal != "" }) {
		return
	}
	candidates := c.single // no peer matches every address, an ipBlock any
	switch {
	case remote:
		candidates = c.judgedSingle
	case len(r.peers) > 0 && !slices.ContainsFunc(r.peers, func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock != nil }):
		candidates = c.candidates(policyNS, r)
	}
	var named []PeerPort
	for _, k := range candidates {
		h, a := c.first(k), c.held[k].a
		if !c.peerMatches(policyNS, r, h, a) {
			continue
		}
		for _, pp := range r.ports {
			if pp.Port == nil || pp.Port.StrVal == "" {
				continue
			}
			for _, n := range namedPorts(h, pp) {
				named = append(named, PeerPort{a, n.proto, n.port})
			}
		}
	}
	if len(named) > 0 {
		g.Terms = append(g.Terms, Term{Named: named})
	}
}

// peerAddrs is the set of addresses rule r's peers match, for addresses
// held by one pod or none (several holders are Group.Several's); nil
// when it lists no peer (every address).
func (c *compiler) peerAddrs(policyNS string, r rule) *Addrs {
	if len(r.peers) == 0 {
		return nil
	}
	k, cache := peersKey(policyNS, r.peers)
	if a, ok := c.peers[k]; ok && cache {
		return a
	}
	var blocks addrsBuilder
	for _, peer := range r.peers {
		if peer.IPBlock != nil {
			blocks.r = append(blocks.r, c.ipBlockRanges(peer.IPBlock)...)
		}
	}
	src := peerSource{ns: policyNS, r: r, blocks: blocks.build().r}
	b := addrsBuilder{r: slices.Clone(src.blocks)}
	if slices.ContainsFunc(r.peers, c.matchesEveryPod) {
		b.r = append(b.r, c.everySingle().r...)
	} else {
		for _, k := range c.candidates(policyNS, r) {
			if c.selectorsMatch(policyNS, r, c.first(k)) {
				b.addAddr(c.held[k].a)
			}
		}
	}
	out := b.build()
	if cache {
		c.peers[k] = out
	}
	c.from[out] = []peerSource{src}
	return out
}

// peerSource is a rule whose peers a set holds: the addresses of its
// ipBlocks (blocks), and those its selectors match the one holder of
// (Deps.holds).
type peerSource struct {
	ns     string // the policy's
	r      rule
	blocks []Range
}

// matchesEveryPod tells whether selectorMatch accepts every pod for peer:
// a pod selector that does not parse, or one that is empty (or absent)
// beside an empty namespace selector.
func (c *compiler) matchesEveryPod(peer networkingv1.NetworkPolicyPeer) bool {
	if peer.IPBlock != nil {
		return false
	}
	if ps := peer.PodSelector; ps != nil {
		if _, err := c.selector(ps); err != nil {
			return true
		}
		if len(ps.MatchLabels)+len(ps.MatchExpressions) > 0 {
			return false
		}
	}
	ns := peer.NamespaceSelector
	return ns != nil && len(ns.MatchLabels)+len(ns.MatchExpressions) == 0
}

// everySingle is the set of every single-held address (built once).
func (c *compiler) everySingle() *Addrs {
	if c.allSingle == nil {
		var b addrsBuilder
		for _, k := range c.single {
			b.addAddr(c.held[k].a)
		}
		c.allSingle = b.build()
	}
	return c.allSingle
}

// peersKey identifies what a list of peers matches: rules of different
// policies with the same peers share one set (and one nftables set). The
// policy's namespace is part of it only where a peer reads it (a pod
// selector without a namespace selector).
func peersKey(policyNS string, peers []networkingv1.NetworkPolicyPeer) (string, bool) {
	var b strings.Builder
	for _, p := range peers {
		if p.PodSelector != nil && p.NamespaceSelector == nil {
			b.WriteString(policyNS)
			break
		}
	}
	for _, p := range peers {
		// The peer's protobuf, length-prefixed: unambiguous, where its
		// String() prints ["x y"] and ["x", "y"] alike (one selector that
		// does not parse and matches every pod, one that does).
		m, err := p.Marshal()
		if err != nil {
			return "", false // not shared (Marshal of these types does not fail)
		}
		b.WriteString(strconv.Itoa(len(m)))
		b.WriteByte(':')
		b.Write(m)
	}
	return b.String(), true
}

// judgedPeers is peerAddrs for judged addresses alone: those of them
// it holds.
func (c *compiler) judgedPeers(policyNS string, r rule) *Addrs {
	if len(r.peers) == 0 {
		return nil
	}
	k, cache := peersKey(policyNS, r.peers)
	k = "judged " + k
	if a, ok := c.peers[k]; ok && cache {
		return a
	}
	var b addrsBuilder
	for _, a := range c.judged {
		var h *trim.Pod // peerAddrs matches selectors on single-held addresses only
		if k, ok := c.find(a); ok && len(c.held[k].h) == 1 {
			h = c.first(k)
		}
		if c.peerMatches(policyNS, r, h, a) {
			b.addAddr(a)
		}
	}
	out := b.build()
	if cache {
		c.peers[k] = out
	}
	return out
}

// candidates are the single-held addresses whose pods r's selector peers
// could select: those in the namespaces the selectors can match (every
// one when a selector does not parse, or selects every namespace). A
// superset: selectorMatch still decides each.
func (c *compiler) candidates(policyNS string, r rule) []int32 {
	in := map[string]bool{}
	for _, peer := range r.peers {
		if peer.IPBlock != nil || (peer.NamespaceSelector == nil && peer.PodSelector == nil) {
			continue
		}
		if peer.PodSelector != nil {
			if _, err := c.selector(peer.PodSelector); err != nil {
				return c.single
			}
			if peer.NamespaceSelector == nil {
				if _, ok := c.singleNS[policyNS]; ok {
					in[policyNS] = true
				}
				continue
			}
		}
		ns := peer.NamespaceSelector
		if len(ns.MatchLabels)+len(ns.MatchExpressions) == 0 {
			return c.single
		}
		names, ok := c.nsMatch[ns]
		if !ok {
			sel, err := c.selector(ns)
			if err != nil {
				return c.single
			}
			for name := range c.singleNS {
				if l, ok := c.ns[name]; ok && sel.Matches(l) {
					names = append(names, name)
				}
			}
			c.nsMatch[ns] = names
		}
		for _, n := range names {
			in[n] = true
		}
	}
	if len(in) == len(c.singleNS) {
		return c.single
	}
	if len(in) == 1 {
		for n := range in {
			return c.singleNS[n]
		}
	}
	var out []int32
	for n := range in {
		out = append(out, c.singleNS[n]...)
	}
	slices.Sort(out) // held's order: the addresses'
	return out
}

// peerMatches is the engine's peer loop for pod h (nil: no pod) at
// address a.
func (c *compiler) peerMatches(policyNS string, r rule, h *trim.Pod, a netip.Addr) bool {
	if len(r.peers) == 0 {
		return true
	}
	for _, peer := range r.peers {
		if peer.IPBlock != nil {
			for _, rg := range c.ipBlockRanges(peer.IPBlock) {
				if rg.From.BitLen() == a.BitLen() && !a.Less(rg.From) && !rg.To.Less(a) {
					return true
				}
			}
			continue
		}
		if h != nil && (peer.NamespaceSelector != nil || peer.PodSelector != nil) && c.selectorMatch(peer, policyNS, h) {
			return true
		}
	}
	return false
}

// selectorsMatch tells whether one of r's selector peers selects pod h.
func (c *compiler) selectorsMatch(policyNS string, r rule, h *trim.Pod) bool {
	for _, peer := range r.peers {
		if peer.IPBlock == nil && (peer.NamespaceSelector != nil || peer.PodSelector != nil) && c.selectorMatch(peer, policyNS, h) {
			return true
		}
	}
	return false
}

// selectorMatch is the engine's evaluateSelectors: a selector that does
// not parse matches every pod.
func (c *compiler) selectorMatch(peer networkingv1.NetworkPolicyPeer, policyNS string, h *trim.Pod) bool {
	if peer.PodSelector != nil {
		sel, err := c.selector(peer.PodSelector)
		if err != nil {
			return true
		}
		if !sel.Matches(labels.Set(h.Labels)) {
			return false
		}
		if peer.NamespaceSelector == nil {
			return h.Namespace == policyNS
		}
	}
	if ns := peer.NamespaceSelector; ns != nil {
		if len(ns.MatchLabels)+len(ns.MatchExpressions) == 0 {
			return true
		}
		sel, err := c.selector(ns)
		if err != nil {
			return true
		}
		l, ok := c.ns[h.Namespace]
		return ok && sel.Matches(l)
	}
	return true
}

// ipBlockRanges is the engine's evaluateIPBlocks as ranges: the CIDR,
// less its excepts up to the first that does not parse (from there on
// the engine matches), all addresses if the CIDR does not parse. CIDRs
// are read as net.IPNet.Contains reads them: an IPv6 one whose network
// is IPv4-mapped holds IPv4 addresses.
// ipBlockRanges is ipBlockRanges, once per block.
func (c *compiler) ipBlockRanges(b *networkingv1.IPBlock) []Range {
	if rs, ok := c.blocks[b]; ok {
		return rs
	}
	rs := ipBlockRanges(b)
	c.blocks[b] = rs
	return rs
}

func ipBlockRanges(b *networkingv1.IPBlock) []Range {
	cidr, ok := containsPrefix(b.CIDR)
	if !ok {
		return []Range{prefixRange(netip.MustParsePrefix("0.0.0.0/0")), prefixRange(netip.MustParsePrefix("::/0"))}
	}
	var cut []Range
	for _, e := range b.Except {
		p, ok := containsPrefix(e)
		if !ok {
			break
		}
		cut = append(cut, prefixRange(p))
	}
	return subtract([]Range{prefixRange(cidr)}, normalize(cut))
}

// containsPrefix parses s as net.ParseCIDR does and returns the prefix
// whose addresses net.IPNet.Contains accepts.
func containsPrefix(s string) (netip.Prefix, bool) {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	if v4 := n.IP.To4(); v4 != nil {
		if len(n.Mask) == net.IPv6len {
			ones -= 96
		}
		a, _ := netip.AddrFromSlice(v4)
		return netip.PrefixFrom(a, max(ones, 0)), true
	}
	a, _ := netip.AddrFromSlice(n.IP)
	return netip.PrefixFrom(a, ones), true
}

type protoPort struct {
	proto uint8
	port  uint16
}

var protoNumbers = map[corev1.Protocol]uint8{corev1.ProtocolTCP: unix.IPPROTO_TCP, corev1.ProtocolUDP: unix.IPPROTO_UDP, corev1.ProtocolSCTP: unix.IPPROTO_SCTP}

// ports is the engine's evaluatePorts as a set, named ports resolved on
// pod on (nil: not resolved). A rule without ports matches every
// protocol and port.
func (c *compiler) ports(r rule, on *trim.Pod) Ports {
	if len(r.ports) == 0 {
		return Ports{All: true}
	}
	var out Ports
	for _, pp := range r.ports {
		proto, ok := protoNumbers[protocolOf(pp)]
		if !ok {
			continue // API validation admits TCP, UDP and SCTP only
		}
		if pp.Port == nil {
			out.add(proto, PortRange{0, 65535})
			continue
		}
		// port == Port.IntValue(): a named port's IntValue is 0.
		base := pp.Port.IntValue()
		if base >= 0 && base <= 65535 {
			out.add(proto, PortRange{uint16(base), uint16(base)})
		}
		if on != nil && pp.Port.StrVal != "" {
			for _, n := range namedPorts(on, pp) {
				out.add(n.proto, PortRange{n.port, n.port})
			}
		}
		// endPort: port > Port.IntValue() && port <= EndPort.
		if pp.EndPort != nil && int(*pp.EndPort) > base && base < 65535 {
			out.add(proto, PortRange{uint16(max(base+1, 0)), uint16(min(int(*pp.EndPort), 65535))})
		}
	}
	return out
}

func protocolOf(pp networkingv1.NetworkPolicyPort) corev1.Protocol {
	if pp.Protocol == nil {
		return corev1.ProtocolTCP // the API's default
	}
	return *pp.Protocol
}

// namedPorts resolves pp's name on pod p as the engine does: its
// containers' (not init containers') ports of that name and protocol.
func namedPorts(p *trim.Pod, pp networkingv1.NetworkPolicyPort) []protoPort {
	proto, ok := protoNumbers[protocolOf(pp)]
	if !ok {
		return nil
	}
	var out []protoPort
	for _, ctr := range p.Spec.Containers {
		for _, cp := range ctr.Ports {
			if cp.Name == pp.Port.StrVal && cp.Protocol == protocolOf(pp) && cp.ContainerPort >= 0 && cp.ContainerPort <= 65535 {
				out = append(out, protoPort{proto, uint16(cp.ContainerPort)})
			}
		}
	}
	return out
}
