package advert

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
)

var (
	pfxSummary = netip.MustParsePrefix("fd00:10:0:1::/64")
	pfxPod     = netip.MustParsePrefix("fd00:20::5/128")
	pfxPod4    = netip.MustParsePrefix("10.20.0.5/32")
	pfxAny     = netip.MustParsePrefix("fd00:99::1/128")
	pfxAddr    = netip.MustParsePrefix("fd00:98::7/128")
)

// op is one SetOwner call.
type op struct {
	owner  string
	claims []Claim
}

func c(p netip.Prefix, k Kind) Claim { return Claim{Prefix: p, Kind: k} }

// signalled drains Changed and tells whether it was signalled.
func signalled(s *Set) bool {
	select {
	case <-s.Changed():
		return true
	default:
		return false
	}
}

func TestSetOwner(t *testing.T) {
	type step struct {
		op          op
		wantDirty   map[netip.Prefix]Kind // TakeDirty after this step
		wantSignal  bool
		wantDesired map[netip.Prefix]Kind
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "add then withdraw",
			steps: []step{
				{
					op:          op{NodeOwner, []Claim{c(pfxSummary, Summary)}},
					wantDirty:   map[netip.Prefix]Kind{pfxSummary: Summary},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxSummary: Summary},
				},
				{
					op:          op{"pod-a", []Claim{c(pfxPod, Pod), c(pfxPod4, Pod)}},
					wantDirty:   map[netip.Prefix]Kind{pfxPod: Pod, pfxPod4: Pod},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxSummary: Summary, pfxPod: Pod, pfxPod4: Pod},
				},
				{
					op:          op{"pod-a", nil},
					wantDirty:   map[netip.Prefix]Kind{pfxPod: "", pfxPod4: ""},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxSummary: Summary},
				},
			},
		},
		{
			name: "partial replacement marks only what changed",
			steps: []step{
				{
					op:          op{"pod-a", []Claim{c(pfxPod, Pod), c(pfxAny, Anycast)}},
					wantDirty:   map[netip.Prefix]Kind{pfxPod: Pod, pfxAny: Anycast},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxPod: Pod, pfxAny: Anycast},
				},
				{
					op:          op{"pod-a", []Claim{c(pfxPod, Pod), c(pfxAddr, Address)}},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: "", pfxAddr: Address},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxPod: Pod, pfxAddr: Address},
				},
			},
		},
		{
			name: "ECMP replicas: desired until the last owner goes",
			steps: []step{
				{
					op:          op{"pod-a", []Claim{c(pfxAny, Anycast)}},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: Anycast},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Anycast},
				},
				{
					// Nothing changes for BGP: not dirty, no signal.
					op:          op{"pod-b", []Claim{c(pfxAny, Anycast)}},
					wantDirty:   map[netip.Prefix]Kind{},
					wantSignal:  false,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Anycast},
				},
				{
					op:          op{"pod-a", nil},
					wantDirty:   map[netip.Prefix]Kind{},
					wantSignal:  false,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Anycast},
				},
				{
					op:          op{"pod-b", []Claim{}},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: ""},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{},
				},
			},
		},
		{
			name: "identical claims are a no-op",
			steps: []step{
				{
					op:          op{"pod-a", []Claim{c(pfxPod, Pod), c(pfxAny, Anycast)}},
					wantDirty:   map[netip.Prefix]Kind{pfxPod: Pod, pfxAny: Anycast},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxPod: Pod, pfxAny: Anycast},
				},
				{
					op:          op{"pod-a", []Claim{c(pfxPod, Pod), c(pfxAny, Anycast)}},
					wantDirty:   map[netip.Prefix]Kind{},
					wantDesired: map[netip.Prefix]Kind{pfxPod: Pod, pfxAny: Anycast},
				},
				{
					// Same claims in another order: still nothing for BGP.
					op:          op{"pod-a", []Claim{c(pfxAny, Anycast), c(pfxPod, Pod)}},
					wantDirty:   map[netip.Prefix]Kind{},
					wantDesired: map[netip.Prefix]Kind{pfxPod: Pod, pfxAny: Anycast},
				},
				{
					// Removing an owner that never existed.
					op:          op{"ghost", nil},
					wantDirty:   map[netip.Prefix]Kind{},
					wantDesired: map[netip.Prefix]Kind{pfxPod: Pod, pfxAny: Anycast},
				},
			},
		},
		{
			name: "kind change marks dirty",
			steps: []step{
				{
					op:          op{"pod-a", []Claim{c(pfxAddr, Anycast)}},
					wantDirty:   map[netip.Prefix]Kind{pfxAddr: Anycast},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAddr: Anycast},
				},
				{
					op:          op{"pod-a", []Claim{c(pfxAddr, Address)}},
					wantDirty:   map[netip.Prefix]Kind{pfxAddr: Address},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAddr: Address},
				},
			},
		},
		{
			name: "kind precedence across owners",
			steps: []step{
				{
					op:          op{"pod-a", []Claim{c(pfxAny, Anycast)}},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: Anycast},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Anycast},
				},
				{
					// Pod outranks Anycast: the prefix changes kind.
					op:          op{"pod-b", []Claim{c(pfxAny, Pod)}},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: Pod},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Pod},
				},
				{
					// Summary outranks everything.
					op:          op{NodeOwner, []Claim{c(pfxAny, Summary)}},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: Summary},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Summary},
				},
				{
					// A lower-ranked claim added under Summary changes nothing.
					op:          op{"pod-c", []Claim{c(pfxAny, Address)}},
					wantDirty:   map[netip.Prefix]Kind{},
					wantDesired: map[netip.Prefix]Kind{pfxAny: Summary},
				},
				{
					op:          op{NodeOwner, nil},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: Pod},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Pod},
				},
				{
					// Address outranks Anycast.
					op:          op{"pod-b", nil},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: Address},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Address},
				},
				{
					op:          op{"pod-c", nil},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: Anycast},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Anycast},
				},
			},
		},
		{
			name: "kind precedence within one owner does not depend on claim order",
			steps: []step{
				{
					op:          op{"pod-a", []Claim{c(pfxAny, Pod), c(pfxAny, Anycast)}},
					wantDirty:   map[netip.Prefix]Kind{pfxAny: Pod},
					wantSignal:  true,
					wantDesired: map[netip.Prefix]Kind{pfxAny: Pod},
				},
				{
					op:          op{"pod-a", []Claim{c(pfxAny, Anycast), c(pfxAny, Pod)}},
					wantDirty:   map[netip.Prefix]Kind{},
					wantDesired: map[netip.Prefix]Kind{pfxAny: Pod},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSet()
			for i, st := range tt.steps {
				s.SetOwner(st.op.owner, st.op.claims)
				if got := signalled(s); got != st.wantSignal {
					t.Errorf("step %d: Changed signalled = %v, want %v", i, got, st.wantSignal)
				}
				if got := s.TakeDirty(); !maps.Equal(got, st.wantDirty) {
					t.Errorf("step %d: TakeDirty = %v, want %v", i, got, st.wantDirty)
				}
				if got := s.TakeDirty(); len(got) != 0 {
					t.Errorf("step %d: second TakeDirty = %v, want empty", i, got)
				}
				if got := s.Desired(); !maps.Equal(got, st.wantDesired) {
					t.Errorf("step %d: Desired = %v, want %v", i, got, st.wantDesired)
				}
			}
		})
	}
}

func TestDirtyAccumulatesUntilTaken(t *testing.T) {
	s := NewSet()
	s.SetOwner("pod-a", []Claim{c(pfxPod, Pod)})
	s.SetOwner("pod-a", nil) // gone again before anyone looked
	s.SetOwner("pod-b", []Claim{c(pfxAny, Anycast)})
	want := map[netip.Prefix]Kind{pfxPod: "", pfxAny: Anycast}
	if got := s.TakeDirty(); !maps.Equal(got, want) {
		t.Fatalf("TakeDirty = %v, want %v", got, want)
	}
}

func TestChangedIsCoalesced(t *testing.T) {
	s := NewSet()
	for i := range 100 {
		s.SetOwner(fmt.Sprintf("pod-%d", i), []Claim{c(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 32), Pod)})
	}
	if !signalled(s) {
		t.Fatal("Changed not signalled")
	}
	if signalled(s) {
		t.Fatal("Changed signalled twice for one batch of changes")
	}
	if got := len(s.TakeDirty()); got != 100 {
		t.Fatalf("TakeDirty returned %d prefixes, want 100", got)
	}
	// A change after the signal was consumed signals again.
	s.SetOwner("pod-0", nil)
	if !signalled(s) {
		t.Fatal("Changed not signalled after a new change")
	}
}

func TestRoutes(t *testing.T) {
	s := NewSet()
	p24 := netip.MustParsePrefix("10.0.0.0/24")
	p32 := netip.MustParsePrefix("10.0.0.0/32")
	s.SetOwner(NodeOwner, []Claim{c(pfxSummary, Summary), c(p24, Summary)})
	s.SetOwner("pod-b", []Claim{c(pfxAny, Anycast), c(p32, Pod)})
	s.SetOwner("pod-a", []Claim{c(pfxAny, Anycast)})
	want := []Route{
		{Prefix: p24, Kind: Summary, Owners: []string{NodeOwner}},
		{Prefix: p32, Kind: Pod, Owners: []string{"pod-b"}},
		{Prefix: pfxSummary, Kind: Summary, Owners: []string{NodeOwner}},
		{Prefix: pfxAny, Kind: Anycast, Owners: []string{"pod-a", "pod-b"}},
	}
	// Map iteration order varies: check several times.
	for range 20 {
		got := s.Routes()
		if !slices.EqualFunc(got, want, func(a, b Route) bool {
			return a.Prefix == b.Prefix && a.Kind == b.Kind && slices.Equal(a.Owners, b.Owners)
		}) {
			t.Fatalf("Routes =\n%v\nwant\n%v", got, want)
		}
	}
}

func TestDiff(t *testing.T) {
	a := netip.MustParsePrefix("fd00::a/128")
	b := netip.MustParsePrefix("fd00::b/128")
	v4 := netip.MustParsePrefix("10.0.0.1/32")
	v4net := netip.MustParsePrefix("10.0.0.0/24")
	tests := []struct {
		name         string
		desired      map[netip.Prefix]Kind
		held         map[netip.Prefix]Kind
		wantAnnounce map[netip.Prefix]Kind
		wantWithdraw []netip.Prefix
	}{
		{
			name:         "empty",
			wantAnnounce: map[netip.Prefix]Kind{},
		},
		{
			name:         "announce new",
			desired:      map[netip.Prefix]Kind{a: Pod, v4: Pod},
			held:         map[netip.Prefix]Kind{},
			wantAnnounce: map[netip.Prefix]Kind{a: Pod, v4: Pod},
		},
		{
			name:         "re-announce on kind change",
			desired:      map[netip.Prefix]Kind{a: Anycast, b: Pod},
			held:         map[netip.Prefix]Kind{a: Pod, b: Pod},
			wantAnnounce: map[netip.Prefix]Kind{a: Anycast},
		},
		{
			name:         "withdraw what is no longer desired",
			desired:      map[netip.Prefix]Kind{a: Pod},
			held:         map[netip.Prefix]Kind{a: Pod, b: Pod, v4: Pod},
			wantAnnounce: map[netip.Prefix]Kind{},
			wantWithdraw: []netip.Prefix{v4, b}, // IPv4 sorts before IPv6
		},
		{
			name:         "explicit empty kind withdraws",
			desired:      map[netip.Prefix]Kind{a: "", b: ""},
			held:         map[netip.Prefix]Kind{a: Pod},
			wantAnnounce: map[netip.Prefix]Kind{},
			wantWithdraw: []netip.Prefix{a},
		},
		{
			name:         "unchanged: nothing",
			desired:      map[netip.Prefix]Kind{a: Pod, b: Anycast, v4: Summary},
			held:         map[netip.Prefix]Kind{a: Pod, b: Anycast, v4: Summary},
			wantAnnounce: map[netip.Prefix]Kind{},
		},
		{
			name:         "withdraw is sorted, same address different length too",
			desired:      map[netip.Prefix]Kind{},
			held:         map[netip.Prefix]Kind{b: Pod, v4: Pod, a: Pod, netip.MustParsePrefix("10.0.0.0/32"): Pod, v4net: Summary},
			wantAnnounce: map[netip.Prefix]Kind{},
			wantWithdraw: []netip.Prefix{v4net, netip.MustParsePrefix("10.0.0.0/32"), v4, a, b},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 10 { // map order varies between runs
				ann, wd := Diff(tt.desired, tt.held)
				if !maps.Equal(ann, tt.wantAnnounce) {
					t.Fatalf("announce = %v, want %v", ann, tt.wantAnnounce)
				}
				if !slices.Equal(wd, tt.wantWithdraw) {
					t.Fatalf("withdraw = %v, want %v", wd, tt.wantWithdraw)
				}
			}
		})
	}
}

func TestConcurrentSetOwner(t *testing.T) {
	s := NewSet()
	const owners = 16
	const rounds = 200
	anycast := netip.MustParsePrefix("fd00:99::42/128")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// A reader draining changes the way the reconciler does.
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-s.Changed():
				s.TakeDirty()
				s.Desired()
				s.Routes()
			}
		}
	})
	for o := range owners {
		wg.Go(func() {
			owner := fmt.Sprintf("pod-%d", o)
			own := netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(o)}), 128)
			for r := range rounds {
				if r%2 == 0 {
					s.SetOwner(owner, []Claim{c(own, Pod), c(anycast, Anycast)})
				} else {
					s.SetOwner(owner, []Claim{c(own, Pod)})
				}
			}
			// Final state: every owner keeps its pod and claims the anycast.
			s.SetOwner(owner, []Claim{c(own, Pod), c(anycast, Anycast)})
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	d := s.Desired()
	if len(d) != owners+1 || d[anycast] != Anycast {
		t.Fatalf("Desired has %d prefixes (anycast %q), want %d with the anycast", len(d), d[anycast], owners+1)
	}
	var ac Route
	for _, r := range s.Routes() {
		if r.Prefix == anycast {
			ac = r
		}
	}
	if len(ac.Owners) != owners {
		t.Fatalf("anycast has %d owners, want %d", len(ac.Owners), owners)
	}
	// Every owner leaves: the anycast is withdrawn exactly when the last goes.
	s.TakeDirty()
	for o := range owners {
		s.SetOwner(fmt.Sprintf("pod-%d", o), nil)
	}
	if len(s.Desired()) != 0 {
		t.Fatalf("Desired not empty after every owner left: %v", s.Desired())
	}
	if got := s.TakeDirty(); len(got) != owners+1 || got[anycast] != "" {
		t.Fatalf("TakeDirty after all left = %v", got)
	}
}
