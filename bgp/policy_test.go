package bgp

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	api "github.com/osrg/gobgp/v4/api"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

func stmtNamed(t *testing.T, pol exportPolicy, prefix string) []*api.Statement {
	t.Helper()
	var out []*api.Statement
	for _, s := range pol.stmts {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s)
		}
	}
	return out
}

func setList(pol exportPolicy, name string) []string {
	for _, ds := range pol.sets {
		if ds.Name == name {
			return ds.List
		}
	}
	return nil
}

func TestBuildExportBasics(t *testing.T) {
	pol := buildExport(flockASN, 7, []policyPeer{
		{key: "fd00::1", addr: netip.MustParseAddr("fd00::1"), ipv4OK: true, comms: v1alpha1.KindCommunities{Pod: []string{"64512:1"}}},
		{key: "fd00::2", addr: netip.MustParseAddr("fd00::2")},
		{key: "interface eth9"}, // not resolved yet: not in the policy
	})
	if got := setList(pol, "flock-ipv4-ok-7"); !slices.Equal(got, []string{"fd00::1/128"}) {
		t.Errorf("IPv4-ok set %v", got)
	}
	if s := stmtNamed(t, pol, "flock-rfc5549-except"); len(s) != 0 {
		t.Errorf("exceptions without shared addresses: %v", s)
	}
	comm := stmtNamed(t, pol, "flock-comm-")
	if len(comm) != 1 || comm[0].Conditions.NextHopInList != nil || comm[0].Conditions.LargeCommunitySet.Name != kindSet(advert.Pod) {
		t.Fatalf("community statements %v", comm)
	}
	if got := setList(pol, comm[0].Conditions.NeighborSet.Name); !slices.Equal(got, []string{"fd00::1/128"}) {
		t.Errorf("community statement's neighbour set %v", got)
	}
	// Defect 14: the last statement accepts locally originated paths only
	// (the assignment's default is reject).
	last := pol.stmts[len(pol.stmts)-1]
	if last.Conditions.GetRouteType() != api.Conditions_ROUTE_TYPE_LOCAL || last.Actions.RouteAction != api.RouteAction_ROUTE_ACTION_ACCEPT {
		t.Errorf("last statement %v", last)
	}
	for _, s := range pol.stmts[:len(pol.stmts)-1] {
		if s.Actions.RouteAction == api.RouteAction_ROUTE_ACTION_ACCEPT {
			t.Errorf("statement %s accepts", s.Name)
		}
	}
	if len(pol.warning) != 0 || len(pol.ipv4Held) != 0 {
		t.Errorf("warnings %v held %v", pol.warning, pol.ipv4Held)
	}
	if pol.outcome["fd00::1"] == pol.outcome["fd00::2"] || pol.outcome["interface eth9"] != "" {
		t.Errorf("outcomes %q", pol.outcome)
	}
}

// Defect 8: two sessions to fe80::1 on two links. GoBGP's neighbour sets
// drop the zone, so each peer is also matched by its local link-local
// address (the next hop of our paths on that session).
func TestBuildExportSharedLinkLocal(t *testing.T) {
	ll := netip.MustParseAddr("fe80::1")
	a := policyPeer{key: "interface eth1", addr: ll, local: netip.MustParseAddr("fe80::a"), ipv4OK: true,
		comms: v1alpha1.KindCommunities{Pod: []string{"64512:1"}}}
	b := policyPeer{key: "interface eth2", addr: ll, local: netip.MustParseAddr("fe80::b"),
		comms: v1alpha1.KindCommunities{Pod: []string{"64512:2"}}}
	pol := buildExport(flockASN, 1, []policyPeer{a, b})
	if got := setList(pol, "flock-ipv4-ok-1"); !slices.Equal(got, []string{"fe80::1/128"}) {
		t.Errorf("IPv4-ok set %v", got)
	}
	ex := stmtNamed(t, pol, "flock-rfc5549-except")
	if len(ex) != 1 || !slices.Equal(ex[0].Conditions.NextHopInList, []string{"fe80::b/128"}) || ex[0].Actions.RouteAction != api.RouteAction_ROUTE_ACTION_REJECT {
		t.Fatalf("exceptions %v", ex)
	}
	// The exceptions come before the guard.
	if !strings.HasPrefix(pol.stmts[0].Name, "flock-rfc5549-except") || !strings.HasPrefix(pol.stmts[1].Name, "flock-rfc5549-guard") {
		t.Errorf("statement order %s, %s", pol.stmts[0].Name, pol.stmts[1].Name)
	}
	comm := stmtNamed(t, pol, "flock-comm-")
	if len(comm) != 2 {
		t.Fatalf("community statements %v", comm)
	}
	for i, want := range []string{"fe80::a/128", "fe80::b/128"} {
		if !slices.Equal(comm[i].Conditions.NextHopInList, []string{want}) {
			t.Errorf("community statement %d next hops %v, want %s", i, comm[i].Conditions.NextHopInList, want)
		}
	}
	if len(pol.warning) != 0 || len(pol.ipv4Held) != 0 {
		t.Errorf("warnings %v held %v", pol.warning, pol.ipv4Held)
	}
	if o := pol.outcome[a.key]; !strings.Contains(o, "ipv4=true") || !strings.Contains(o, "pod=[64512:1]/[]") {
		t.Errorf("outcome A %q", o)
	}
	if o := pol.outcome[b.key]; !strings.Contains(o, "ipv4=false") || !strings.Contains(o, "pod=[64512:2]/[]") {
		t.Errorf("outcome B %q", o)
	}

	// Both ends on the same link-local addresses: the peers cannot be told
	// apart. The guard fails closed and both are warned.
	b.local = a.local
	pol = buildExport(flockASN, 2, []policyPeer{a, b})
	if got := setList(pol, "flock-ipv4-ok-2"); len(got) != 0 {
		t.Errorf("IPv4-ok set %v, want empty", got)
	}
	if !pol.ipv4Held[a.key] || pol.ipv4Held[b.key] {
		t.Errorf("held %v", pol.ipv4Held)
	}
	if !strings.Contains(pol.warning[a.key], "IPv4 withheld") || !strings.Contains(pol.warning[b.key], "communities mixed") {
		t.Errorf("warnings %q", pol.warning)
	}

	// Both allowed, same communities: nothing to tell apart, no warning.
	b.ipv4OK, b.comms = true, a.comms
	pol = buildExport(flockASN, 3, []policyPeer{a, b})
	if got := setList(pol, "flock-ipv4-ok-3"); !slices.Equal(got, []string{"fe80::1/128"}) {
		t.Errorf("IPv4-ok set %v", got)
	}
	if len(pol.warning) != 0 {
		t.Errorf("warnings %q", pol.warning)
	}

	// Local address unknown for the held-back peer: fail closed.
	b.ipv4OK, b.local = false, netip.Addr{}
	b.comms = v1alpha1.KindCommunities{}
	pol = buildExport(flockASN, 4, []policyPeer{a, b})
	if got := setList(pol, "flock-ipv4-ok-4"); len(got) != 0 {
		t.Errorf("IPv4-ok set %v, want empty", got)
	}
}

func TestMarkerKind(t *testing.T) {
	for _, k := range advert.Kinds {
		if got := markerKind(flockASN, flockASN, markerData1, kindIndex(k)); got != k {
			t.Errorf("markerKind(%s) = %q", k, got)
		}
	}
	for _, c := range [][3]uint32{{flockASN + 1, markerData1, 1}, {flockASN, markerData1 + 1, 1}, {flockASN, markerData1, 0}, {flockASN, markerData1, uint32(len(advert.Kinds) + 1)}} {
		if got := markerKind(flockASN, c[0], c[1], c[2]); got != "" {
			t.Errorf("markerKind(%v) = %q, want none", c, got)
		}
	}
}
