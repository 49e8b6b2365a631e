package verdicts

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// flock-policy's loop with the informer's delivery delayed (the cache
// far ahead of the handler): pod changes, policy updates and extra-IP
// changes reach the cache at once and their handler later, and handling,
// patches and loads interleave at random. Once every event is handled and
// followed, the program decides every packet as a fresh compile does.
func TestAsyncDeliveryFollows(t *testing.T) {
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0xa5a5))
	type event struct {
		old, cur     *trim.Pod
		npOld, npCur *networkingv1.NetworkPolicy
		extra        bool
		ips, keys    []string
	}
	worlds, patches := scaled(t, 400), 0
	for wi := range worlds {
		w := newWorld(r)
		if r.IntN(4) != 0 {
			narrowPeers(w)
		}
		cache := slices.Clone(w.in.Pods)
		local := map[string][]string{}
		for _, p := range cache {
			if p.Spec.NodeName == localNode {
				local[key(p)] = canon(p)
			}
		}
		live := func() Live {
			l := liveAfter(w, cache)
			l.Local = func(ip string) bool {
				for _, ips := range local {
					if slices.Contains(ips, ip) {
						return true
					}
				}
				return false
			}
			return l
		}
		inNow := func() Input { in := w.in; in.Pods = slices.Clone(cache); return in }
		prog, deps := CompileDeps(inNow())
		valid, needLoad := true, false
		dirty := map[netip.Addr]bool{}
		var queue []event
		var log string
		load := func() {
			clear(dirty)
			prog, deps = CompileDeps(inNow())
			valid, needLoad = true, false
			log += "load\n"
		}
		handle := func() {
			e := queue[0]
			queue = queue[1:]
			if e.npCur != nil {
				var d *Deps
				if valid {
					d = deps
				}
				if ClassifyPolicy(d, e.npOld, e.npCur) == Unchanged {
					log += "handle policy " + e.npCur.Name + ": unchanged\n"
					return
				}
				log += "handle policy " + e.npCur.Name + ": new context\n"
				valid, needLoad = false, true
				return
			}
			if e.extra {
				isLocal := false
				for _, k := range e.keys {
					if _, ok := local[k]; ok {
						isLocal = true
					}
					for _, p := range cache {
						if key(p) == k && p.Spec.NodeName == localNode {
							isLocal = true
						}
					}
				}
				var d *Deps
				if valid {
					d = deps
				}
				if ClassifyExtra(live(), d, e.ips, isLocal) == Recompile {
					log += "handle extra " + strings.Join(e.ips, ",") + " " + strings.Join(e.keys, ",") + ": recompile\n"
					needLoad = true
					return
				}
				log += "handle extra " + strings.Join(e.ips, ",") + " " + strings.Join(e.keys, ",") + ": new context\n"
				valid, needLoad = false, true
				return
			}
			for _, p := range []*trim.Pod{e.old, e.cur} {
				if p == nil || p.Spec.NodeName != localNode {
					continue
				}
				if p == e.cur {
					local[key(p)] = canon(p)
				} else {
					delete(local, key(p))
				}
			}
			var d *Deps
			if valid {
				d = deps
			}
			l := live()
			eff := Classify(l, d, e.old, e.cur)
			log += "handle " + podString(e.old) + " → " + podString(e.cur)
			switch eff {
			case Unchanged:
				log += ": unchanged\n"
			case Recompile:
				if d.Dispatchable(l, e.old, e.cur) {
					for _, p := range []*trim.Pod{e.old, e.cur} {
						for _, a := range podIPsOf(p) {
							dirty[a] = true
						}
					}
					log += ": dirty\n"
					return
				}
				log += ": recompile\n"
				needLoad = true
			default:
				log += ": new context\n"
				valid, needLoad = false, true
			}
		}
		patch := func() {
			if len(dirty) == 0 {
				return
			}
			if needLoad || !valid {
				return // a load is asked for
			}
			l := live()
			groups := prog.GroupIndex()
			es := map[netip.Addr]Entry{}
			for a := range dirty {
				e, ok := deps.Dispatch(l, prog, groups, a)
				if !ok {
					clear(dirty)
					needLoad = true
					log += "patch refused\n"
					return
				}
				es[a] = e
			}
			clear(dirty)
			ch, ok := prog.Change(es)
			if !ok {
				needLoad = true
				log += "patch refused (a family new to a set of peers)\n"
				return
			}
			prog = prog.Patched(ch)
			patches++
			log += "patched\n"
		}
		for range 40 {
			switch n := r.IntN(10); {
			case n < 1 && r.IntN(2) == 0:
				i := r.IntN(len(w.in.Policies))
				old := w.in.Policies[i]
				cur := randPolicyChange(r, old)
				w.in.Policies = slices.Clone(w.in.Policies)
				w.in.Policies[i] = cur
				queue = append(queue, event{npOld: old, npCur: cur})
				log += "cache policy " + cur.Name + "\n"
			case n < 1:
				w.in.Pods = cache
				after, ip, p := randExtraChange(r, w)
				after.in.Pods = cache
				w = after
				queue = append(queue, event{extra: true, ips: []string{ip}, keys: []string{key(p)}})
				log += "cache extra " + ip + " " + key(p) + "\n"
			case n < 4:
				w.in.Pods = cache
				old, cur, pods := randPodChange(r, w)
				for try := 0; try < 4 && (old == nil || old.Spec.NodeName == localNode) && (cur == nil || cur.Spec.NodeName == localNode); try++ {
					old, cur, pods = randPodChange(r, w)
				}
				if old == nil && cur == nil {
					continue
				}
				cache = pods
				queue = append(queue, event{old: old, cur: cur})
				log += "cache " + podString(old) + " → " + podString(cur) + "\n"
			case n < 7:
				if len(queue) > 0 {
					handle()
				}
			case n < 9:
				patch()
			default:
				if needLoad || r.IntN(3) == 0 {
					load()
				}
			}
		}
		for len(queue) > 0 {
			handle()
		}
		patch()
		if needLoad {
			load()
		}
		w.in.Pods = cache
		addrs := slices.Clone(w.addrs)
		for _, p := range cache {
			addrs = append(addrs, podIPsOf(p)...)
		}
		if k, same := differ(prog, Compile(w.in), addrs); !same {
			t.Fatalf("FLOCK_SEED=%d world %d: %s → %s proto %d port %d: program %v, compile %v\n%s\n%s", sd, wi, k.Src, k.Dst, k.Proto, k.DstPort, prog.Allows(k), !prog.Allows(k), log, describe(w))
		}
	}
	t.Logf("%d patches", patches)
	if patches == 0 {
		t.Error("no patch made: the model tests the loads alone")
	}
}

// canon are p's status IPs as the compile keys them (as flock-policy
// records this node's pods').
func canon(p *trim.Pod) []string {
	var out []string
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.String())
		} else {
			out = append(out, ip.IP)
		}
	}
	return out
}
