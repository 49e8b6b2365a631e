package advert

import (
	"maps"
	"net/netip"
	"slices"
	"testing"
)

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

func TestRank(t *testing.T) {
	for i, k := range Kinds {
		if Rank(k) != i {
			t.Errorf("Rank(%s) = %d, want %d", k, Rank(k), i)
		}
	}
	if Rank("bogus") != len(Kinds) {
		t.Errorf("Rank of an unknown kind = %d, want %d", Rank("bogus"), len(Kinds))
	}
}

// A Service route's drain and weight are part of what was sent: a change
// of either re-announces, the same Path never does.
func TestDiffPaths(t *testing.T) {
	a := netip.MustParsePrefix("2001:db8:1b::1/128")
	b := netip.MustParsePrefix("198.51.100.7/32")
	held := map[netip.Prefix]Path{a: {Kind: Service, Weight: 2}, b: {Kind: Service}}
	for _, tc := range []struct {
		name     string
		desired  map[netip.Prefix]Path
		announce map[netip.Prefix]Path
		withdraw []netip.Prefix
	}{
		{"unchanged", map[netip.Prefix]Path{a: {Kind: Service, Weight: 2}, b: {Kind: Service}}, map[netip.Prefix]Path{}, nil},
		{"weight changes", map[netip.Prefix]Path{a: {Kind: Service, Weight: 3}, b: {Kind: Service}}, map[netip.Prefix]Path{a: {Kind: Service, Weight: 3}}, nil},
		{"starts draining", map[netip.Prefix]Path{a: {Kind: Service, Weight: 2}, b: {Kind: Service, Drain: true}}, map[netip.Prefix]Path{b: {Kind: Service, Drain: true}}, nil},
		{"zero Path withdraws", map[netip.Prefix]Path{a: {Kind: Service, Weight: 2}, b: {}}, map[netip.Prefix]Path{}, []netip.Prefix{b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann, wd := Diff(tc.desired, held)
			if !maps.Equal(ann, tc.announce) || !slices.Equal(wd, tc.withdraw) {
				t.Errorf("Diff = %v, %v; want %v, %v", ann, wd, tc.announce, tc.withdraw)
			}
		})
	}
	if got := Paths(map[netip.Prefix]Kind{a: Pod}); !maps.Equal(got, map[netip.Prefix]Path{a: {Kind: Pod}}) {
		t.Errorf("Paths = %v", got)
	}
	// Marker numbers are positions in Kinds: the kinds before Service keep
	// theirs (paths a running agent holds are recovered by them).
	if !slices.Equal(Kinds[:4], []Kind{Summary, Pod, Address, Anycast}) || Kinds[4] != Service {
		t.Errorf("Kinds = %v: an existing kind moved", Kinds)
	}
}
