package bgp

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// fakeNeighbours is a neighbour table for relink's decisions.
type fakeNeighbours struct {
	mu        sync.Mutex
	table     []Neighbour
	answers   map[netip.Addr]bool
	solicited int
	asked     []netip.Addr
	forgotten []netip.Addr
}

func (f *fakeNeighbours) Solicit(string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.solicited++
	return nil
}

func (f *fakeNeighbours) LinkLocal(string) ([]Neighbour, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Neighbour(nil), f.table...), nil
}

func (f *fakeNeighbours) Answers(_ string, a netip.Addr, _ time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, a)
	return f.answers[a]
}

func (f *fakeNeighbours) Forget(_ string, a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = append(f.forgotten, a)
	return nil
}

// relink re-peers only when the resolved neighbour is dead and another one
// answers on the link, and only after the session has been down a while.
func TestRelinkDecisions(t *testing.T) {
	old, newer := netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fe80::2")
	cases := []struct {
		name          string
		table         []Neighbour
		answers       bool // the old neighbour answers a ping
		downFor       time.Duration
		established   bool
		wantRepeer    bool
		wantSolicit   bool
		wantAskedOld  bool
		wantForgotten bool
	}{
		{name: "down briefly", table: []Neighbour{{Addr: newer}}, downFor: time.Second},
		{name: "established", table: []Neighbour{{Addr: newer}}, downFor: time.Minute, established: true},
		{name: "nobody else on the link", table: []Neighbour{{Addr: old, Failed: true}}, downFor: time.Minute, wantSolicit: true},
		{name: "old reachable", table: []Neighbour{{Addr: old, Reachable: true}, {Addr: newer}}, downFor: time.Minute},
		{name: "old stale but answers", table: []Neighbour{{Addr: old}, {Addr: newer}}, answers: true, downFor: time.Minute, wantAskedOld: true},
		{name: "other failed too", table: []Neighbour{{Addr: old, Failed: true}, {Addr: newer, Failed: true}}, downFor: time.Minute, wantSolicit: true},
		{name: "replaced", table: []Neighbour{{Addr: old}, {Addr: newer}}, downFor: time.Minute, wantAskedOld: true, wantRepeer: true},
		{name: "replaced, old gone", table: []Neighbour{{Addr: newer, Reachable: true}}, downFor: time.Minute, wantAskedOld: true, wantRepeer: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fn := &fakeNeighbours{table: c.table, answers: map[netip.Addr]bool{old: c.answers}}
			sp := newIdleSpeaker(t, func(cfg *Config) { cfg.Neighbours = fn })
			now := time.Now()
			st := bgp.BGP_FSM_ACTIVE
			if c.established {
				st = bgp.BGP_FSM_ESTABLISHED
			}
			p := &peer{key: "interface eth9", spec: v1alpha1.Peer{Interface: "eth9", ASN: 64513}, added: true,
				apiAddr: old.WithZone("eth9"), state: st, since: now.Add(-c.downFor)}
			sp.mu.Lock()
			sp.peers[p.key] = p
			sp.mu.Unlock()
			sp.relink(context.Background(), now)
			// GoBGP has no such peer, so DeletePeer fails and the peer stays
			// added; what relink decided shows in Forget.
			forgot := len(fn.forgotten) == 1 && fn.forgotten[0] == old
			if forgot != c.wantRepeer {
				t.Errorf("forgot the old neighbour: %v, want %v (%v)", forgot, c.wantRepeer, fn.forgotten)
			}
			if (fn.solicited > 0) != c.wantSolicit {
				t.Errorf("solicited %d times, want solicit %v", fn.solicited, c.wantSolicit)
			}
			if asked := len(fn.asked) > 0; asked != c.wantAskedOld {
				t.Errorf("asked the old neighbour: %v, want %v", asked, c.wantAskedOld)
			}
		})
	}
}
