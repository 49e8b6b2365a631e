package verdicts

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// A program patched for the pod changes Dispatchable and Dispatch accept
// decides every packet as a compile of the cluster after them does.
// Random clusters, random changes of pods of either node, one after
// another: each is skipped (Classify: Unchanged), patched onto the
// program as it stands, or compiled for (anything else, or a patch
// Dispatch refuses), as flock-policy does; every patched program is
// checked against a fresh compile on every pair of the addresses there are.
func TestDispatchPatchIsSound(t *testing.T) {
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0xd15a))
	var peerPatches int
	changes, patched, refused := dispatchWorlds(r, scaled(t, 600), dispatchHooks{patched: func(was, _ *Program, ch *Change) {
		if ch.Peers() > 0 {
			peerPatches++
		}
	}, settled: func(w *world, prog *Program, last string) {
		addrs := slices.Clone(w.addrs)
		for _, p := range w.in.Pods {
			addrs = append(addrs, podIPsOf(p)...)
		}
		if k, same := differ(prog, Compile(w.in), addrs); !same {
			t.Fatalf("FLOCK_SEED=%d: after\n%s%s → %s proto %d port %d: the patched program says %v, a compile %v\n%s",
				sd, last, k.Src, k.Dst, k.Proto, k.DstPort, prog.Allows(k), !prog.Allows(k), describe(w))
		}
	}})
	t.Logf("%d changes: %d patches (%d of sets of peers), %d refused by Dispatch", changes, patched, peerPatches, refused)
	if patched == 0 || refused == 0 || peerPatches == 0 {
		t.Errorf("%d patches (%d of sets of peers), %d refused (of %d changes): want some of each", patched, peerPatches, refused, changes)
	}
}

// dispatchHooks are told what dispatchWorlds does: each program
// compiled, each patch (the program before and after, the entries), and
// each quiescent point after a patch (every change so far classified and
// followed; last are the changes since the previous one).
type dispatchHooks struct {
	compiled func(w *world, prog *Program)
	patched  func(was, prog *Program, ch *Change)
	settled  func(w *world, prog *Program, last string)
}

// dispatchWorlds runs random pod changes through worlds random clusters
// as flock-policy does: each is skipped (Classify: Unchanged), patched
// onto the program as it stands, or compiled for (anything else, or a
// patch Dispatch refuses).
func dispatchWorlds(r *rand.Rand, worlds int, h dispatchHooks) (changes, patches, refused int) {
	for range worlds {
		w := newWorld(r)
		if r.IntN(2) == 0 {
			narrowPeers(w)
		}
		var prog *Program
		var deps *Deps
		compile := func(in Input) {
			prog, deps = CompileDeps(in)
			if h.compiled != nil {
				h.compiled(w, prog)
			}
		}
		compile(w.in)
		// Addresses whose entries may be stale, patched after some
		// changes against the cluster as it is then, as flock-policy
		// patches after the events that asked for it.
		dirty := map[netip.Addr]bool{}
		var last string // the changes since the last patch
		// change classifies a pod's change, the cluster being pods after it.
		change := func(old, cur *trim.Pod, pods []*trim.Pod) {
			changes++
			last += podString(old) + " → " + podString(cur) + "\n"
			after := w.in
			after.Pods = pods
			live := liveAfter(w, pods)
			switch Classify(live, deps, old, cur) {
			case Unchanged:
			case Recompile:
				if deps.Dispatchable(live, old, cur) {
					for _, p := range []*trim.Pod{old, cur} {
						for _, ip := range podIPsOf(p) {
							dirty[ip] = true
						}
					}
					break
				}
				fallthrough
			default:
				compile(after)
				clear(dirty)
			}
			w.in = after
		}
		// patch patches the dirty entries against the cluster as pods.
		patch := func(pods []*trim.Pod) {
			es := map[netip.Addr]Entry{}
			groups := prog.GroupIndex()
			ok := true
			live := liveAfter(w, pods)
			for ip := range dirty {
				e, found := deps.Dispatch(live, prog, groups, ip)
				ok = ok && found
				es[ip] = e
			}
			clear(dirty)
			var ch *Change
			if ok {
				ch, ok = prog.Change(es)
			}
			if !ok {
				refused++
				after := w.in
				after.Pods = pods
				compile(after)
				return
			}
			patches++
			was := prog
			prog = prog.Patched(ch)
			if h.patched != nil {
				h.patched(was, prog, ch)
			}
		}
		settled := func() {
			if h.settled != nil {
				h.settled(w, prog, last)
			}
			last = ""
		}
		// Most changes are elsewhere, as in a large cluster.
		next := func() (old, cur *trim.Pod, pods []*trim.Pod) {
			old, cur, pods = randPodChange(r, w)
			for try := 0; try < 4 && (old == nil || old.Spec.NodeName == localNode) && (cur == nil || cur.Spec.NodeName == localNode); try++ {
				old, cur, pods = randPodChange(r, w)
			}
			return old, cur, pods
		}
		for range 20 {
			change(next())
			if len(dirty) == 0 || r.IntN(3) == 0 {
				continue // more changes before the patch
			}
			if r.IntN(3) == 0 {
				// The cache is ahead of the events: a change is in it,
				// not yet classified, when the patch reads it.
				old, cur, pods := next()
				patch(pods)
				change(old, cur, pods)
				if len(dirty) > 0 {
					patch(pods)
				}
				settled()
				continue
			}
			patch(w.in.Pods)
			settled()
		}
	}
	return changes, patches, refused
}

// narrowPeers makes the pod and namespace selectors of w's rules' peers
// match almost no pod: most pods elsewhere are then no peer of this
// node's pods, as in a large cluster, and their changes patchable.
func narrowPeers(w *world) {
	narrow := func(peers []networkingv1.NetworkPolicyPeer) {
		for i := range peers {
			if peers[i].PodSelector != nil || peers[i].NamespaceSelector != nil {
				peers[i].PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x", "role": "x", "tier": "x"}}
			}
		}
	}
	for i, np := range w.in.Policies {
		np = np.DeepCopy()
		for j := range np.Spec.Ingress {
			narrow(np.Spec.Ingress[j].From)
		}
		for j := range np.Spec.Egress {
			narrow(np.Spec.Egress[j].To)
		}
		w.in.Policies[i] = np
	}
}

// liveAfter is what Classify reads of w's cluster once its pods are pods.
func liveAfter(w *world, pods []*trim.Pod) Live {
	holders := func(ip string) []*trim.Pod {
		var out []*trim.Pod
		for _, p := range pods {
			if p.Spec.HostNetwork {
				continue
			}
			for _, pip := range p.Status.PodIPs {
				if pip.IP == ip {
					out = append(out, p)
				}
			}
		}
		return out
	}
	local := func(ip string) bool {
		for _, set := range [][]*trim.Pod{w.in.Pods, pods} {
			for _, p := range set {
				for _, pip := range p.Status.PodIPs {
					if p.Spec.NodeName == localNode && pip.IP == ip {
						return true
					}
				}
			}
		}
		return false
	}
	return Live{Node: localNode, ExtraPodIPs: w.in.ExtraPodIPs, PodsForIP: w.in.PodsForIP, Holders: holders, Local: local, Pod: podOf(pods)}
}

// podOf finds a pod of pods by key.
func podOf(pods []*trim.Pod) func(string) *trim.Pod {
	return func(k string) *trim.Pod {
		for _, p := range pods {
			if key(p) == k {
				return p
			}
		}
		return nil
	}
}

// podIPsOf are p's status IPs that parse (none for nil).
func podIPsOf(p *trim.Pod) []netip.Addr {
	if p == nil {
		return nil
	}
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// The kernel runs a patched program as Program.Allows says: programs
// compiled and patched as in TestDispatchPatchIsSound are loaded and
// patched into a network namespace's table, and at each quiescent point
// packets between the judged addresses and the patched ones (and any)
// get the patched program's verdict.
func TestKernelPatch(t *testing.T) {
	const table = "flock-verdicts-patch"
	l, conn, hook := patchLab(t)
	var err error
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0x9a7c4))
	var at *Loaded
	touched := map[netip.Addr]bool{}
	verdicts := map[bool]int{}
	peerPatches := 0
	_, patches, _ := dispatchWorlds(r, scaled(t, 60), dispatchHooks{
		compiled: func(w *world, prog *Program) {
			if at, err = LoadGen(conn, table, hook, prog); err != nil {
				t.Fatalf("load: %v", err)
			}
			clear(touched)
		},
		patched: func(was, prog *Program, ch *Change) {
			if err := Patch(conn, table, at, was, ch); err != nil {
				t.Fatalf("FLOCK_SEED=%d: patch: %v", sd, err)
			}
			if ch.Peers() > 0 {
				peerPatches++
			}
			for a := range ch.Entries {
				touched[a] = true
			}
		},
		settled: func(w *world, prog *Program, last string) {
			judged := sortedAddrs(prog.Selected)
			var ks []Packet
			for a := range touched {
				for range 3 {
					k := randPacket(r, w)
					if len(judged) > 0 {
						k.Src, k.Dst = pick(r, judged), a
						if r.IntN(2) == 0 {
							k.Src, k.Dst = a, k.Src
						}
					}
					ks = append(ks, k)
				}
			}
			for range 5 {
				ks = append(ks, randPacket(r, w))
			}
			for _, k := range ks {
				if k.Src.Is4() != k.Dst.Is4() || k.Src == k.Dst {
					continue
				}
				if k.Src.Is4() && k.Proto == unix.IPPROTO_ICMPV6 {
					k.Proto = unix.IPPROTO_ICMP
				}
				want := prog.Allows(k)
				verdicts[want]++
				if got := l.Allows(t, probe.Packet(k)); got != want {
					t.Fatalf("FLOCK_SEED=%d: after\n%s%s → %s proto %d port %d: kernel %v, the patched program %v", sd, last, k.Src, k.Dst, k.Proto, k.DstPort, got, want)
				}
			}
			clear(touched)
		},
	})
	t.Logf("%d patches (%d of sets of peers); packets: %d passed, %d dropped", patches, peerPatches, verdicts[true], verdicts[false])
	if patches == 0 || peerPatches == 0 || verdicts[false] == 0 || verdicts[true] == 0 {
		t.Errorf("%d patches (%d of sets of peers), %d packets passed, %d dropped: want some of each", patches, peerPatches, verdicts[true], verdicts[false])
	}
}

// patchLab is a network namespace whose output hook runs a table, and a
// connection to its nftables.
func patchLab(t *testing.T) (*probe.Lab, *nftables.Conn, Hook) {
	l := probe.New(t)
	conn, err := NewConn(int(l.NS))
	if err != nil {
		t.Fatal(err)
	}
	return l, conn, Hook{Num: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter}
}
