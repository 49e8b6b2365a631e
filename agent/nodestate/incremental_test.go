package nodestate

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

var incSeed = flag.Uint64("incremental.seed", 0, "seed for TestIncrementalDesiredSets (0: from the clock)")

// scratch computes both desired sets from scratch (desired.go): the oracle.
func scratch(s *State) (map[netip.Prefix]advert.Path, map[netip.Prefix][]dataplane.Nexthop) {
	adv, _ := s.AdvertRoutes()
	host, _ := s.HostRoutes()
	a := map[netip.Prefix]advert.Path{}
	for _, r := range adv {
		a[r.Prefix] = r.Path()
	}
	h := map[netip.Prefix][]dataplane.Nexthop{}
	for _, r := range host {
		h[r.Prefix] = r.Nexthops
	}
	return a, h
}

// The incrementally kept desired sets equal the from-scratch ones after
// every operation of a seeded random sequence: ADDs (pods in and outside
// the summaries, overlapping anycast and `addresses` IPs of replicas),
// deletes, stuck and quarantined attachments, releases, readiness reports
// and forgotten pods, suppressed summaries, Service routes (one of them on
// an anycast IP, where the pod's route wins). Replay a failure with
// -incremental.seed.
func TestIncrementalDesiredSets(t *testing.T) {
	seed := *incSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -run IncrementalDesiredSets ./agent/nodestate/ -args -incremental.seed=%d)", seed, seed)
	rnd := rand.New(rand.NewPCG(seed, 0))
	for _, defaultReady := range []bool{true, false} {
		s := newState(t, defaultReady)
		var ids []string
		pods := []podmeta.ID{pod("a"), pod("b"), pod("c"), pod("d")}
		anycast := []netip.Addr{netip.MustParseAddr("2001:db8:a::1"), netip.MustParseAddr("2001:db8:a::2"), netip.MustParseAddr("203.0.113.1")}
		type handout struct {
			adv, advWas   map[netip.Prefix]advert.Path
			host, hostWas map[netip.Prefix][]dataplane.Nexthop
		}
		var handed []handout
		left := false
		for i := range 3000 {
			op := "?"
			switch n := rnd.IntN(100); {
			case n < 30:
				op = "add"
				id := fmt.Sprintf("c%d", i)
				p := pods[rnd.IntN(len(pods))]
				rec := store.Allocation{ContainerID: id, IfName: "eth0", Netns: "/ns/" + id, Pod: p}
				for _, ip := range anycast {
					if rnd.IntN(3) == 0 {
						rec.Anycast = append(rec.Anycast, ip)
					}
				}
				if rnd.IntN(4) == 0 {
					rec.Addresses = []netip.Addr{netip.MustParseAddr(fmt.Sprintf("2001:db8:aa::%x", i+1))}
				}
				reqs := dual()
				if rnd.IntN(3) == 0 {
					reqs[0].Range = shared // a /128 advertised
				}
				r, err := s.Reserve(rec, reqs)
				if err != nil {
					continue // a claim collision: fine, nothing changed
				}
				if rnd.IntN(5) > 0 {
					if _, err := s.Commit(r); err != nil {
						t.Fatal(err)
					}
				}
				ids = append(ids, id)
			case n < 45 && len(ids) > 0:
				op = "delete"
				s.MarkDeleting(ids[rnd.IntN(len(ids))])
			case n < 50 && len(ids) > 0:
				op = "stuck"
				s.MarkStuck(ids[rnd.IntN(len(ids))], "test")
			case n < 70 && len(ids) > 0:
				op = "release"
				k := rnd.IntN(len(ids))
				s.Release(ids[k])
				ids = slices.Delete(ids, k, k+1)
			case n < 85:
				op = "ready"
				s.SetReady(pods[rnd.IntN(len(pods))], rnd.IntN(2) == 0)
			case n < 90:
				op = "forget"
				s.ForgetPod(pods[rnd.IntN(len(pods))])
			case n < 93:
				op = "suppress"
				sup := map[netip.Prefix]string{}
				if rnd.IntN(2) == 0 {
					sup[sum6] = "test"
				}
				s.SetSuppressed(sup)
			case n < 94:
				op = "services"
				svc := map[netip.Prefix]ServiceRoute{}
				for j, ip := range []netip.Addr{netip.MustParseAddr("2001:db8:5e::1"), netip.MustParseAddr("198.51.100.1"), anycast[0]} {
					if rnd.IntN(2) == 0 {
						continue
					}
					svc[hostPrefix(ip)] = ServiceRoute{
						Path:   advert.Path{Kind: advert.Service, Drain: rnd.IntN(3) == 0, Weight: uint32(rnd.IntN(3))},
						Owners: []string{fmt.Sprintf("ns/svc%d", j)},
					}
				}
				s.SetServiceRoutes(svc)
			case n == 99 && i > 2000 && !left:
				// An uninstall: nothing advertised from here on, the
				// kernel's set still kept as before.
				op = "leave"
				s.Leave()
				left = true
			case n < 95:
				op = "quarantine"
				id := fmt.Sprintf("q%d", i)
				s.Quarantine(store.Allocation{ContainerID: id, Pod: pods[0], IPs: []netip.Addr{netip.MustParseAddr("10.1.1.200")}, Anycast: anycast[:1]}, "test")
				ids = append(ids, id)
			default:
				continue
			}
			// Read only now and then: marks pile up between reads, as
			// they do between reconcile passes.
			if rnd.IntN(3) > 0 {
				continue
			}
			wantAdv, wantHost := scratch(s)
			if left {
				wantAdv = map[netip.Prefix]advert.Path{}
			}
			gotAdv, _ := s.Adverts()
			gotHost, _ := s.KernelRoutes()
			if !maps.Equal(gotAdv, wantAdv) {
				t.Fatalf("defaultReady=%v op %d (%s): adverts\n got %v\nwant %v", defaultReady, i, op, gotAdv, wantAdv)
			}
			if !maps.EqualFunc(gotHost, wantHost, slices.Equal[[]dataplane.Nexthop]) {
				t.Fatalf("defaultReady=%v op %d (%s): kernel routes\n got %v\nwant %v", defaultReady, i, op, gotHost, wantHost)
			}
			// The maps are handed out, not copied: every one handed out
			// earlier still holds what it held then.
			for k, h := range handed {
				if !maps.Equal(h.adv, h.advWas) || !maps.EqualFunc(h.host, h.hostWas, slices.Equal[[]dataplane.Nexthop]) {
					t.Fatalf("defaultReady=%v op %d (%s): the sets read at read %d changed since", defaultReady, i, op, k)
				}
			}
			handed = append(handed, handout{gotAdv, wantAdv, gotHost, maps.Clone(wantHost)})
		}
	}
}
