package verdicts

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"
)

// ClassifyPolicy is sound: a policy update it calls Unchanged leaves every
// verdict of the program compiled after it what it was before (every
// ordered pair of the world's addresses, every protocol, a set of ports),
// and the context too. Random clusters, random updates of a policy: a peer
// added or removed (the churn a large cluster sees), its ports, its pod
// selector, its policy types or its rules changed.
func TestClassifyPolicyIsSound(t *testing.T) {
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0x9017c7))
	worlds, changes, skipped := scaled(t, 200), 0, 0
	for wi := range worlds {
		w := newWorld(r)
		for range 10 {
			prog, deps := CompileDeps(w.in)
			i := r.IntN(len(w.in.Policies))
			old := w.in.Policies[i]
			cur := randPolicyChange(r, old)
			after := w.in
			after.Policies = append([]*networkingv1.NetworkPolicy(nil), w.in.Policies...)
			after.Policies[i] = cur
			changes++
			if ClassifyPolicy(deps, old, cur) == Unchanged {
				skipped++
				got, d := CompileDeps(after)
				if k, ok := differ(prog, got, w.addrs); !ok {
					t.Fatalf("FLOCK_SEED=%d world %d: %s/%s's update called Unchanged, but %s → %s proto %d port %d went from %v to %v\nbefore: %+v\nafter: %+v\n%s",
						sd, wi, old.Namespace, old.Name, k.Src, k.Dst, k.Proto, k.DstPort, prog.Allows(k), got.Allows(k), old.Spec, cur.Spec, describe(w))
				}
				if !sameContext(d, deps) {
					t.Fatalf("FLOCK_SEED=%d world %d: %s/%s's update called Unchanged, but the context changed", sd, wi, old.Namespace, old.Name)
				}
			}
			w.in = after
		}
	}
	t.Logf("%d policy updates: %d unchanged", changes, skipped)
	if skipped == 0 || skipped == changes {
		t.Errorf("%d of %d policy updates unchanged: want some of each kind", skipped, changes)
	}
}

// An add or a delete is never Unchanged, nor is an update without a
// current program, or with the admin policies on.
func TestClassifyPolicyNeedsAnUpdateAndDeps(t *testing.T) {
	w := newWorld(rand.New(rand.NewPCG(1, 2)))
	_, deps := CompileDeps(w.in)
	np := w.in.Policies[0]
	for name, got := range map[string]Effect{
		"an add":                ClassifyPolicy(deps, nil, np),
		"a delete":              ClassifyPolicy(deps, np, nil),
		"no current program":    ClassifyPolicy(nil, np, np),
		"another policy's name": ClassifyPolicy(deps, np, renamed(np)),
	} {
		if got != NewContext {
			t.Errorf("%s: %v, want NewContext", name, got)
		}
	}
	admin := w.in
	admin.Admin = true
	_, ad := CompileDeps(admin)
	if got := ClassifyPolicy(ad, np, np); got != NewContext {
		t.Errorf("admin policies on: %v, want NewContext", got)
	}
}

func renamed(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	out := np.DeepCopy()
	out.Name += "x"
	return out
}

// randPolicyChange is old with one thing changed (old is not changed).
func randPolicyChange(r *rand.Rand, old *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	cur := old.DeepCopy()
	cur.ResourceVersion = fmt.Sprint(r.Int())
	switch r.IntN(9) {
	case 0:
		cur.Spec.PodSelector = *randSelector(r)
	case 1:
		cur.Spec.PolicyTypes = pick(r, [][]networkingv1.PolicyType{{networkingv1.PolicyTypeIngress}, {networkingv1.PolicyTypeEgress}, {networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}})
	case 2:
		np := randPolicy(r, 0, []string{cur.Namespace})
		cur.Spec.Ingress, cur.Spec.Egress = np.Spec.Ingress, np.Spec.Egress
	case 3, 4: // ports
		if len(cur.Spec.Ingress) > 0 && r.IntN(2) == 0 {
			cur.Spec.Ingress[r.IntN(len(cur.Spec.Ingress))].Ports = randPorts(r)
		} else if len(cur.Spec.Egress) > 0 {
			cur.Spec.Egress[r.IntN(len(cur.Spec.Egress))].Ports = randPorts(r)
		}
	default: // a peer added or removed
		ing := r.IntN(2) == 0
		n := len(cur.Spec.Egress)
		if ing {
			n = len(cur.Spec.Ingress)
		}
		if n == 0 {
			break
		}
		j := r.IntN(n)
		var peers *[]networkingv1.NetworkPolicyPeer
		if ing {
			peers = &cur.Spec.Ingress[j].From
		} else {
			peers = &cur.Spec.Egress[j].To
		}
		if len(*peers) > 0 && r.IntN(2) == 0 {
			k := r.IntN(len(*peers))
			*peers = append((*peers)[:k:k], (*peers)[k+1:]...)
		} else {
			*peers = append(*peers, randPeers(r)...)
		}
	}
	return cur
}

// differ finds a packet between two of addrs that a and b judge
// differently (ok: none).
func differ(a, b *Program, addrs []netip.Addr) (Packet, bool) {
	for _, src := range addrs {
		for _, dst := range addrs {
			if src == dst || src.Is4() != dst.Is4() {
				continue
			}
			for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_ICMPV6} {
				ports := []uint16{0, 53, 80, 81, 1000, 1001, 1020, 1049, 1099, 8080, 9090, 9091}
				if proto == unix.IPPROTO_ICMPV6 {
					ports = []uint16{0}
				}
				for _, dp := range ports {
					k := Packet{Src: src, Dst: dst, Proto: proto, SrcPort: 40000, DstPort: dp}
					if a.Allows(k) != b.Allows(k) {
						return k, false
					}
				}
			}
		}
	}
	return Packet{}, true
}
