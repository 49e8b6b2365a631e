package verdicts

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// ClassifyExtra is sound: a change of the extra IPs' holders it calls
// Recompile leaves the context (what the next changes are classified
// with) as it was. Random clusters, random extra IPs given or taken: an
// anycast IP several pods hold, one of a pod's own, one that is another
// pod's status IP, on pods of either node, hostNetwork ones too.
func TestClassifyExtraIsSound(t *testing.T) {
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0xe7a))
	worlds, changes, recompiled, unchanged := scaled(t, 300), 0, 0, 0
	for range worlds {
		w := newWorld(r)
		for range 20 {
			prog, deps := CompileDeps(w.in)
			after, ip, p := randExtraChange(r, w)
			local := func(ip string) bool {
				for _, q := range w.in.Pods {
					for _, pip := range q.Status.PodIPs {
						if q.Spec.NodeName == localNode && pip.IP == ip {
							return true
						}
					}
				}
				return false
			}
			live := liveAfter(after, after.in.Pods)
			live.Local = local
			changes++
			switch ClassifyExtra(live, deps, []string{ip}, p.Spec.NodeName == localNode) {
			case Recompile:
				recompiled++
				if _, d := CompileDeps(after.in); !sameContext(d, deps) {
					t.Fatalf("FLOCK_SEED=%d: %s given or taken %s called Recompile, but the context changed\nbefore:\n%s", sd, podString(p), ip, describe(w))
				}
			case Unchanged:
				unchanged++
				addrs := slices.Clone(after.addrs)
				for _, q := range after.in.Pods {
					addrs = append(addrs, podIPsOf(q)...)
				}
				if k, same := differ(prog, Compile(after.in), addrs); !same {
					t.Fatalf("FLOCK_SEED=%d: %s given or taken %s called Unchanged, but %s → %s proto %d port %d: the program says %v, a compile after %v\nbefore:\n%s",
						sd, podString(p), ip, k.Src, k.Dst, k.Proto, k.DstPort, prog.Allows(k), !prog.Allows(k), describe(w))
				}
			}
			w = after
		}
	}
	t.Logf("%d changes: %d recompiled in the same context, %d unchanged", changes, recompiled, unchanged)
	if recompiled == 0 || unchanged == 0 || recompiled+unchanged == changes {
		t.Errorf("%d of %d changes recompiled, %d unchanged: want some of each kind", recompiled, changes, unchanged)
	}
}

// randExtraChange gives one of w's pods an extra IP, or takes one it
// holds, returning the world after, the IP and the pod.
func randExtraChange(r *rand.Rand, w *world) (*world, string, *trim.Pod) {
	after := &world{in: w.in, extra: maps.Clone(w.extra), holders: maps.Clone(w.holders), addrs: w.addrs}
	after.in.ExtraPodIPs = func(p *trim.Pod) []string { return after.extra[key(p)] }
	after.in.PodsForIP = func(ip string) []string { return after.holders[ip] }
	p := pick(r, w.in.Pods)
	k := key(p)
	var ip string
	if held := after.extra[k]; len(held) > 0 && r.IntN(2) == 0 {
		ip = pick(r, held)
		after.extra[k] = slices.DeleteFunc(slices.Clone(held), func(s string) bool { return s == ip })
		after.holders[ip] = slices.DeleteFunc(slices.Clone(after.holders[ip]), func(s string) bool { return s == k })
		return after, ip, p
	}
	switch r.IntN(3) {
	case 0: // an anycast IP, maybe held already
		ip = fmt.Sprintf("2001:db8:a::%x", 1+r.IntN(3))
	case 1: // its own
		ip = fmt.Sprintf("2001:db8:c::%x", 0x100+r.IntN(0x100))
	default: // another pod's status IP
		q := pick(r, w.in.Pods)
		if len(q.Status.PodIPs) == 0 {
			return after, fmt.Sprintf("2001:db8:c::%x", 0x200+r.IntN(0x100)), p
		}
		ip = pick(r, q.Status.PodIPs).IP
	}
	if !slices.Contains(after.extra[k], ip) {
		after.extra[k] = append(slices.Clone(after.extra[k]), ip)
		after.holders[ip] = append(slices.Clone(after.holders[ip]), k)
	}
	return after, ip, p
}
