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
