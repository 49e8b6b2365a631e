package verdicts

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	worlds, changes, patched, refused := scaled(t, 600), 0, 0, 0
	for wi := range worlds {
		w := newWorld(r)
		if r.IntN(2) == 0 {
			narrowPeers(w)
		}
		prog, deps := CompileDeps(w.in)
		// Addresses whose entries may be stale, patched after some
		// changes against the cluster as it is then, as flock-policy
		// patches after the events that asked for it.
		dirty := map[netip.Addr]bool{}
		var last string // the changes since the last check
		// change classifies a pod's change, the cluster being pods after it.
		change := func(old, cur *corev1.Pod, pods []*corev1.Pod) {
			changes++
			last += podString(old) + " → " + podString(cur) + "\n"
			after := w.in
			after.Pods = pods
			live := liveAfter(w, pods)
			switch Classify(live, deps, old, cur) {
			case Unchanged:
			case Recompile:
				if deps.Dispatchable(live, old, cur) {
					for _, p := range []*corev1.Pod{old, cur} {
						for _, ip := range podIPsOf(p) {
							dirty[ip] = true
						}
					}
					break
				}
				fallthrough
			default:
				prog, deps = CompileDeps(after)
				clear(dirty)
			}
			w.in = after
		}
		// patch patches the dirty entries against the cluster as pods.
		patch := func(pods []*corev1.Pod) {
			es := map[netip.Addr]Entry{}
			groups := prog.GroupIndex()
			ok := true
			live := liveAfter(w, pods)
			for ip := range dirty {
				e, found := deps.Dispatch(live, groups, ip)
				ok = ok && found
				es[ip] = e
			}
			clear(dirty)
			if !ok {
				refused++
				after := w.in
				after.Pods = pods
				prog, deps = CompileDeps(after)
				return
			}
			patched++
			prog = prog.Patched(es)
		}
		// Most changes are elsewhere, as in a large cluster.
		next := func() (old, cur *corev1.Pod, pods []*corev1.Pod) {
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
			} else {
				patch(w.in.Pods)
			}
			addrs := slices.Clone(w.addrs)
			for _, p := range w.in.Pods {
				addrs = append(addrs, podIPsOf(p)...)
			}
			if k, same := differ(prog, Compile(w.in), addrs); !same {
				t.Fatalf("FLOCK_SEED=%d world %d: after\n%s%s → %s proto %d port %d: the patched program says %v, a compile %v\n%s",
					sd, wi, last, k.Src, k.Dst, k.Proto, k.DstPort, prog.Allows(k), !prog.Allows(k), describe(w))
			}
			last = ""
		}
	}
	t.Logf("%d changes: %d patches, %d refused by Dispatch", changes, patched, refused)
	if patched == 0 || refused == 0 {
		t.Errorf("%d patches, %d refused (of %d changes): want some of each", patched, refused, changes)
	}
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
func liveAfter(w *world, pods []*corev1.Pod) Live {
	holders := func(ip string) []*corev1.Pod {
		var out []*corev1.Pod
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
		for _, set := range [][]*corev1.Pod{w.in.Pods, pods} {
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
	return Live{Node: localNode, ExtraPodIPs: w.in.ExtraPodIPs, PodsForIP: w.in.PodsForIP, Holders: holders, Local: local}
}

// podIPsOf are p's status IPs that parse (none for nil).
func podIPsOf(p *corev1.Pod) []netip.Addr {
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
