package bgp

// End-to-end tests: a flock Speaker against a "ToR" that is a second,
// plain embedded GoBGP server on loopback. Assertions are on what the ToR's
// global RIB holds and on the ToR's view of the session.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/bgp/advert"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

const (
	flockASN = 64512
	torASN   = 64513
	tor2ASN  = 64514
	waitFor  = 30 * time.Second
)

var (
	summary6 = netip.MustParsePrefix("fd00:10:0:1::/64")
	pod6     = netip.MustParsePrefix("fd00:20::5/128")
	any6     = netip.MustParsePrefix("fd00:99::1/128")
	pod4     = netip.MustParsePrefix("10.20.0.5/32")
)

// testLogger logs to t until the test ends (GoBGP goroutines may outlive it).
func testLogger(t *testing.T) *slog.Logger {
	w := &testLogWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testLogWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testLogWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

// eventually polls f until it holds or the deadline passes.
func eventually(t *testing.T, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		ok, detail := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// consistently checks that f holds for the whole period.
func consistently(t *testing.T, what string, d time.Duration, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if ok, detail := f(); !ok {
			t.Fatalf("%s: %s", what, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort(t *testing.T, addr string) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// tor is a plain GoBGP server standing in for a top-of-rack switch.
type tor struct {
	srv      *server.BgpServer
	addr     string // listen address
	port     uint16
	asn      uint32
	neighbor string // flock's address as the ToR sees it
}

func startToR(t *testing.T, addr string, asn uint32, routerID string) *tor {
	t.Helper()
	lvl := &slog.LevelVar{}
	lvl.Set(slog.LevelWarn)
	r := &tor{
		srv:  server.NewBgpServer(server.LoggerOption(testLogger(t).With("component", "tor-"+addr), lvl)),
		addr: addr, asn: asn, port: freePort(t, addr),
	}
	go r.srv.Serve()
	ctx := context.Background()
	if err := r.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: asn, RouterId: routerID, ListenPort: int32(r.port), ListenAddresses: []string{addr},
	}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.srv.Stop)
	if err := r.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_IMPORT, DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
	}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// addNeighbor configures the flock node on the ToR: passive (the node has
// no listener), both families, graceful restart.
func (r *tor) addNeighbor(t *testing.T, neighbor string, asn uint32) {
	t.Helper()
	r.neighbor = neighbor
	var afs []*api.AfiSafi
	for _, f := range []string{"ipv4", "ipv6"} {
		afs = append(afs, &api.AfiSafi{
			Config:            &api.AfiSafiConfig{Family: apiFamily(f), Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
		})
	}
	if err := r.srv.AddPeer(context.Background(), &api.AddPeerRequest{Peer: &api.Peer{
		Conf:            &api.PeerConf{NeighborAddress: neighbor, PeerAsn: asn},
		Transport:       &api.Transport{PassiveMode: true},
		Timers:          &api.Timers{Config: &api.TimersConfig{HoldTime: 9, KeepaliveInterval: 3, ConnectRetry: 1}},
		GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: 120},
		AfiSafis:        afs,
	}}); err != nil {
		t.Fatal(err)
	}
}

// peer is the ToR's view of the flock session.
func (r *tor) peer(t *testing.T) *api.Peer {
	t.Helper()
	var out *api.Peer
	if err := r.srv.ListPeer(context.Background(), &api.ListPeerRequest{Address: r.neighbor}, func(p *api.Peer) { out = p }); err != nil {
		t.Fatal(err)
	}
	if out == nil {
		t.Fatalf("ToR %s has no peer %s", r.addr, r.neighbor)
	}
	return out
}

func (r *tor) established(t *testing.T) bool {
	return r.peer(t).GetState().GetSessionState() == api.PeerState_SESSION_STATE_ESTABLISHED
}

func (r *tor) uptime(t *testing.T) time.Time {
	return r.peer(t).GetTimers().GetState().GetUptime().AsTime()
}

func (r *tor) receivedUpdates(t *testing.T) uint64 {
	return r.peer(t).GetState().GetMessages().GetReceived().GetUpdate()
}

// rib is the ToR's global RIB for both families.
func (r *tor) rib(t *testing.T) map[netip.Prefix]*apiutil.Path {
	t.Helper()
	out := map[netip.Prefix]*apiutil.Path{}
	for _, fam := range []bgp.Family{bgp.RF_IPv4_UC, bgp.RF_IPv6_UC} {
		err := r.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: fam}, func(nlri bgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				if p.Best || len(paths) == 1 {
					out[netip.MustParsePrefix(nlri.String())] = p
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func prefixes(m map[netip.Prefix]*apiutil.Path) []netip.Prefix {
	return slices.SortedFunc(maps.Keys(m), func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
}

// waitRIB waits until the ToR holds exactly want.
func (r *tor) waitRIB(t *testing.T, want ...netip.Prefix) map[netip.Prefix]*apiutil.Path {
	t.Helper()
	slices.SortFunc(want, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
	var rib map[netip.Prefix]*apiutil.Path
	eventually(t, fmt.Sprintf("ToR %s RIB = %v", r.addr, want), func() (bool, string) {
		rib = r.rib(t)
		got := prefixes(rib)
		return slices.Equal(got, want), fmt.Sprint(got)
	})
	return rib
}

func nextHop(p *apiutil.Path) netip.Addr {
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			return a.Value
		case *bgp.PathAttributeMpReachNLRI:
			return a.Nexthop
		}
	}
	return netip.Addr{}
}

func communities(p *apiutil.Path) (std, large []string) {
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeCommunities:
			for _, v := range a.Value {
				std = append(std, fmt.Sprintf("%d:%d", v>>16, v&0xffff))
			}
		case *bgp.PathAttributeLargeCommunities:
			for _, v := range a.Values {
				large = append(large, v.String())
			}
		}
	}
	return std, large
}

func asPath(p *apiutil.Path) string {
	var out []string
	for _, a := range p.Attrs {
		if a, ok := a.(*bgp.PathAttributeAsPath); ok {
			for _, seg := range a.Value {
				for _, as := range seg.GetAS() {
					out = append(out, fmt.Sprint(as))
				}
			}
		}
	}
	return strings.Join(out, " ")
}

// assertNoMarker fails if any path at the ToR carries a flock marker.
func assertNoMarker(t *testing.T, rib map[netip.Prefix]*apiutil.Path) {
	t.Helper()
	for pfx, p := range rib {
		_, large := communities(p)
		for _, l := range large {
			if strings.Contains(l, fmt.Sprintf(":%d:", markerData1)) {
				t.Errorf("%s reached the ToR with the marker %s", pfx, l)
			}
		}
	}
}

type speakerOpt func(*Config)

func newSpeaker(t *testing.T, opts ...speakerOpt) *Speaker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := Config{ASN: flockASN, RouterID: "10.255.0.2", BGP: v1alpha1.BGP{ListenPort: -1}, Log: testLogger(t)}
	for _, o := range opts {
		o(&cfg)
	}
	sp, err := New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sp.Stop()
		cancel()
	})
	return sp
}

func torPeer(r *tor) v1alpha1.Peer {
	return v1alpha1.Peer{
		Address: r.addr, Port: r.port, ASN: r.asn,
		Timers: v1alpha1.Timers{HoldTime: 9, KeepaliveTime: 3, ConnectRetry: 1},
	}
}

func neighbor(sp *Speaker, key string) (Neighbor, bool) {
	for _, n := range sp.Neighbors(context.Background()) {
		if n.Peer == key {
			return n, true
		}
	}
	return Neighbor{}, false
}

func waitEstablished(t *testing.T, sp *Speaker, r *tor, key string) Neighbor {
	t.Helper()
	var n Neighbor
	eventually(t, "session "+key+" Established", func() (bool, string) {
		var ok bool
		n, ok = neighbor(sp, key)
		return ok && n.State == "Established" && r.established(t), fmt.Sprintf("flock: %+v", n)
	})
	return n
}

func (s *Speaker) heldUUIDs() map[netip.Prefix]uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[netip.Prefix]uuid.UUID{}
	for p, h := range s.held {
		out[p] = h.uuid
	}
	return out
}

func familyCounts(n Neighbor) map[string]uint64 {
	out := map[string]uint64{}
	for _, f := range n.Families {
		out[f.Family] = f.Advertised
	}
	return out
}

func TestSpeakerEstablished(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t)
	if err := sp.ApplyPeers([]v1alpha1.Peer{torPeer(r)}); err != nil {
		t.Fatal(err)
	}
	n := waitEstablished(t, sp, r, "::1")
	if n.Address != "::1" || n.LocalASN != flockASN || n.PeerASN != torASN {
		t.Errorf("neighbour %+v", n)
	}
	if got := familyCounts(n); len(got) != 2 || got["ipv4"] != 0 || got["ipv6"] != 0 {
		t.Errorf("families %+v", n.Families)
	}
	if !strings.HasPrefix(n.GR, "negotiated") || !strings.Contains(n.GR, "2m0s") {
		t.Errorf("GR = %q, want negotiated with the ToR's 120 s", n.GR)
	}
	if n.BFD != "off" || len(n.Warnings) != 0 || n.LastError != "" || n.Since.IsZero() {
		t.Errorf("neighbour %+v", n)
	}
	if up, total := sp.Established(); up != 1 || total != 1 {
		t.Errorf("Established() = %d/%d", up, total)
	}
	if m := sp.Mismatches(); len(m) != 0 {
		t.Errorf("Mismatches() = %v", m)
	}
	// The ToR sees flock with the configured timers.
	if ht := r.peer(t).GetTimers().GetState().GetNegotiatedHoldTime(); ht != 9 {
		t.Errorf("negotiated hold time %d, want 9", ht)
	}
}

func TestSpeakerSync(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t)

	// Routes synced before there is any session go out once it is up.
	first := map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod, pod4: advert.Pod}
	if err := sp.Sync(first); err != nil {
		t.Fatal(err)
	}
	if got := sp.Held(); !maps.Equal(got, first) {
		t.Fatalf("Held = %v, want %v", got, first)
	}
	if err := sp.ApplyPeers([]v1alpha1.Peer{torPeer(r)}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, sp, r, "::1")
	rib := r.waitRIB(t, summary6, pod6, pod4)
	for pfx, p := range rib {
		if nh := nextHop(p); nh != netip.MustParseAddr("::1") {
			t.Errorf("%s: next hop %v, want ::1 (IPv6, RFC 5549 for IPv4)", pfx, nh)
		}
		if ap := asPath(p); ap != fmt.Sprint(flockASN) {
			t.Errorf("%s: AS path %q", pfx, ap)
		}
		if std, large := communities(p); len(std) != 0 || len(large) != 0 {
			t.Errorf("%s: communities %v %v, want none", pfx, std, large)
		}
	}
	assertNoMarker(t, rib)
	eventually(t, "advertised counts", func() (bool, string) {
		n, _ := neighbor(sp, "::1")
		c := familyCounts(n)
		return c["ipv4"] == 1 && c["ipv6"] == 2, fmt.Sprint(n.Families)
	})

	// The same kinds again: nothing is re-added, nothing is sent.
	eventually(t, "ToR update count to settle", func() (bool, string) {
		a := r.receivedUpdates(t)
		time.Sleep(500 * time.Millisecond)
		b := r.receivedUpdates(t)
		return a == b, fmt.Sprintf("%d then %d", a, b)
	})
	updates, ids := r.receivedUpdates(t), sp.heldUUIDs()
	if err := sp.Sync(first); err != nil {
		t.Fatal(err)
	}
	if err := sp.Resync(first); err != nil {
		t.Fatal(err)
	}
	if got := sp.heldUUIDs(); !maps.Equal(got, ids) {
		t.Errorf("held paths re-added: %v, was %v", got, ids)
	}
	time.Sleep(time.Second)
	if got := r.receivedUpdates(t); got != updates {
		t.Errorf("ToR received %d UPDATEs after a no-op Sync", got-updates)
	}

	// "" withdraws; a prefix not held withdraws nothing.
	if err := sp.Sync(map[netip.Prefix]advert.Kind{pod6: "", any6: ""}); err != nil {
		t.Fatal(err)
	}
	r.waitRIB(t, summary6, pod4)
	if got := sp.Held(); !maps.Equal(got, map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod4: advert.Pod}) {
		t.Errorf("Held = %v", got)
	}

	// Resync removes what the desired set no longer has and adds what it
	// has, leaving the rest alone.
	ids = sp.heldUUIDs()
	if err := sp.Resync(map[netip.Prefix]advert.Kind{summary6: advert.Summary, any6: advert.Anycast}); err != nil {
		t.Fatal(err)
	}
	r.waitRIB(t, summary6, any6)
	if got := sp.Held(); !maps.Equal(got, map[netip.Prefix]advert.Kind{summary6: advert.Summary, any6: advert.Anycast}) {
		t.Errorf("Held = %v", got)
	}
	if got := sp.heldUUIDs(); got[summary6] != ids[summary6] {
		t.Error("Resync re-added an unchanged path")
	}
	eventually(t, "advertised counts after withdrawals", func() (bool, string) {
		n, _ := neighbor(sp, "::1")
		c := familyCounts(n)
		return c["ipv4"] == 0 && c["ipv6"] == 2, fmt.Sprint(n.Families)
	})

	// Everything gone.
	if err := sp.Resync(nil); err != nil {
		t.Fatal(err)
	}
	r.waitRIB(t)
	if got := sp.Held(); len(got) != 0 {
		t.Errorf("Held = %v", got)
	}
}

func TestSpeakerCommunities(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t)
	p := torPeer(r)
	p.Communities = v1alpha1.KindCommunities{Pod: []string{"64512:100"}}
	p.LargeCommunities = v1alpha1.KindCommunities{Anycast: []string{"64512:1:2"}}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, sp, r, "::1")
	if err := sp.Sync(map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod, any6: advert.Anycast, pod4: advert.Pod}); err != nil {
		t.Fatal(err)
	}
	type comms struct{ std, large string }
	check := func(what string, want map[netip.Prefix]comms) {
		t.Helper()
		var last map[netip.Prefix]comms
		eventually(t, what, func() (bool, string) {
			rib := r.rib(t)
			last = map[netip.Prefix]comms{}
			for pfx, p := range rib {
				std, large := communities(p)
				last[pfx] = comms{strings.Join(std, " "), strings.Join(large, " ")}
			}
			return maps.Equal(last, want), fmt.Sprint(last)
		})
		assertNoMarker(t, r.rib(t))
	}
	check("communities per kind", map[netip.Prefix]comms{
		summary6: {},
		pod6:     {std: "64512:100"},
		pod4:     {std: "64512:100"},
		any6:     {large: "64512:1:2"},
	})

	// A kind change moves the prefix to the other kind's communities.
	if err := sp.Sync(map[netip.Prefix]advert.Kind{any6: advert.Pod, pod6: advert.Anycast}); err != nil {
		t.Fatal(err)
	}
	check("communities after a kind change", map[netip.Prefix]comms{
		summary6: {},
		pod6:     {large: "64512:1:2"},
		pod4:     {std: "64512:100"},
		any6:     {std: "64512:100"},
	})

	// New communities: the export policy changes, the session does not.
	uptime, since := r.uptime(t), mustNeighbor(t, sp, "::1").Since
	flops := r.peer(t).GetState().GetFlops()
	p.Communities = v1alpha1.KindCommunities{Pod: []string{"64512:200", "64512:201"}, Summary: []string{"64512:300"}}
	p.LargeCommunities = v1alpha1.KindCommunities{}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	check("communities after ApplyPeers", map[netip.Prefix]comms{
		summary6: {std: "64512:300"},
		pod6:     {},
		pod4:     {std: "64512:200 64512:201"},
		any6:     {std: "64512:200 64512:201"},
	})
	if !r.established(t) || !r.uptime(t).Equal(uptime) || r.peer(t).GetState().GetFlops() != flops {
		t.Errorf("session reset by a community change: uptime %v → %v, flops %d → %d", uptime, r.uptime(t), flops, r.peer(t).GetState().GetFlops())
	}
	if n := mustNeighbor(t, sp, "::1"); n.State != "Established" || !n.Since.Equal(since) {
		t.Errorf("flock saw a state change: %+v (since %v)", n, since)
	}

	// New timers: the session is re-created (the ToR has 9, so a shorter
	// hold time shows in the negotiated one).
	p.Timers.HoldTime, p.Timers.KeepaliveTime = 6, 2
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "session re-created with hold time 6", func() (bool, string) {
		tp := r.peer(t)
		n, _ := neighbor(sp, "::1")
		ok := tp.GetState().GetSessionState() == api.PeerState_SESSION_STATE_ESTABLISHED &&
			tp.GetTimers().GetState().GetNegotiatedHoldTime() == 6 &&
			r.uptime(t).After(uptime) && n.State == "Established"
		return ok, fmt.Sprintf("ToR %v hold %d; flock %s", tp.GetState().GetSessionState(), tp.GetTimers().GetState().GetNegotiatedHoldTime(), n.State)
	})
	check("communities after re-creation", map[netip.Prefix]comms{
		summary6: {std: "64512:300"},
		pod6:     {},
		pod4:     {std: "64512:200 64512:201"},
		any6:     {std: "64512:200 64512:201"},
	})

	// Removing the peer: gone at the ToR, gone from flock.
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "session gone at the ToR", func() (bool, string) {
		st := r.peer(t).GetState().GetSessionState()
		return st != api.PeerState_SESSION_STATE_ESTABLISHED, st.String()
	})
	r.waitRIB(t)
	if n := sp.Neighbors(context.Background()); len(n) != 0 {
		t.Errorf("Neighbors = %+v", n)
	}
	if up, total := sp.Established(); up != 0 || total != 0 {
		t.Errorf("Established() = %d/%d", up, total)
	}
	// The paths stay held for when a peer comes back.
	if got := len(sp.Held()); got != 4 {
		t.Errorf("Held has %d paths, want 4", got)
	}
}

func mustNeighbor(t *testing.T, sp *Speaker, key string) Neighbor {
	t.Helper()
	n, ok := neighbor(sp, key)
	if !ok {
		t.Fatalf("no neighbour %s", key)
	}
	return n
}

func TestSpeakerTwoPeers(t *testing.T) {
	r6 := startToR(t, "::1", torASN, "10.255.0.1")
	r6.addNeighbor(t, "::1", flockASN)
	r4 := startToR(t, "127.0.0.1", tor2ASN, "10.255.0.3")
	r4.addNeighbor(t, "127.0.0.1", flockASN)
	sp := newSpeaker(t)
	// Each peer its own communities for the same kind.
	p6, p4 := torPeer(r6), torPeer(r4)
	p6.Communities.Pod = []string{"64512:600"}
	p4.Communities.Pod = []string{"64512:400"}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p6, p4}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, sp, r6, "::1")
	n4 := waitEstablished(t, sp, r4, "127.0.0.1")
	if got := familyCounts(n4); len(got) != 1 {
		t.Errorf("IPv4 session families %+v, want ipv4 only", n4.Families)
	}
	if err := sp.Sync(map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod4: advert.Pod}); err != nil {
		t.Fatal(err)
	}
	r6.waitRIB(t, summary6, pod4)
	rib4 := r4.waitRIB(t, pod4)
	if nh := nextHop(rib4[pod4]); nh != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("IPv4 session: next hop %v, want 127.0.0.1", nh)
	}
	eventually(t, "per-peer communities", func() (bool, string) {
		std6, _ := communities(r6.rib(t)[pod4])
		std4, _ := communities(r4.rib(t)[pod4])
		return slices.Equal(std6, []string{"64512:600"}) && slices.Equal(std4, []string{"64512:400"}), fmt.Sprintf("ToR6 %v ToR4 %v", std6, std4)
	})
	if up, total := sp.Established(); up != 2 || total != 2 {
		t.Errorf("Established() = %d/%d", up, total)
	}

	uptime4 := r4.uptime(t)
	flops4 := r4.peer(t).GetState().GetFlops()
	if err := sp.ApplyPeers([]v1alpha1.Peer{p4}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "IPv6 session gone", func() (bool, string) {
		st := r6.peer(t).GetState().GetSessionState()
		return st != api.PeerState_SESSION_STATE_ESTABLISHED, st.String()
	})
	r6.waitRIB(t)
	consistently(t, "the other session stays up", time.Second, func() (bool, string) {
		tp := r4.peer(t)
		ok := tp.GetState().GetSessionState() == api.PeerState_SESSION_STATE_ESTABLISHED &&
			r4.uptime(t).Equal(uptime4) && tp.GetState().GetFlops() == flops4
		return ok, fmt.Sprintf("%v uptime %v (was %v) flops %d (was %d)", tp.GetState().GetSessionState(), r4.uptime(t), uptime4, tp.GetState().GetFlops(), flops4)
	})
	if got := prefixes(r4.rib(t)); !slices.Equal(got, []netip.Prefix{pod4}) {
		t.Errorf("remaining ToR RIB %v", got)
	}
	if up, total := sp.Established(); up != 1 || total != 1 {
		t.Errorf("Established() = %d/%d", up, total)
	}
	// The remaining peer still gets new routes through the rebuilt policy.
	p2 := netip.MustParsePrefix("10.20.0.6/32")
	if err := sp.Sync(map[netip.Prefix]advert.Kind{p2: advert.Pod}); err != nil {
		t.Fatal(err)
	}
	r4.waitRIB(t, pod4, p2)
}

// enheStripper proxies BGP sessions to target and removes the extended
// next hop capability from the OPEN the target sends: GoBGP always offers
// it, and this is the only way to get a GoBGP ToR that "lacks" it.
func enheStripper(t *testing.T, target string) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			d, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, d)
			mu.Unlock()
			go func() {
				_, _ = io.Copy(d, c)
				d.Close()
			}()
			go func() {
				defer c.Close()
				if err := stripENHE(d, c); err != nil {
					return
				}
				_, _ = io.Copy(c, d)
			}()
		}
	}()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// stripENHE copies one BGP message from src to dst, without the extended
// next hop capability if it is an OPEN.
func stripENHE(src io.Reader, dst io.Writer) error {
	hdr := make([]byte, bgp.BGP_HEADER_LENGTH)
	if _, err := io.ReadFull(src, hdr); err != nil {
		return err
	}
	buf := make([]byte, binary.BigEndian.Uint16(hdr[16:18]))
	copy(buf, hdr)
	if _, err := io.ReadFull(src, buf[bgp.BGP_HEADER_LENGTH:]); err != nil {
		return err
	}
	msg, err := bgp.ParseBGPMessage(buf)
	if err != nil {
		return err
	}
	if open, ok := msg.Body.(*bgp.BGPOpen); ok {
		for _, o := range open.OptParams {
			if c, ok := o.(*bgp.OptionParameterCapability); ok {
				c.Capability = slices.DeleteFunc(c.Capability, func(c bgp.ParameterCapabilityInterface) bool {
					return c.Code() == bgp.BGP_CAP_EXTENDED_NEXTHOP
				})
			}
		}
		msg.Header.Len = 0
		if buf, err = msg.Serialize(); err != nil {
			return err
		}
	}
	_, err = dst.Write(buf)
	return err
}

func TestSpeakerGuardWithoutExtendedNexthop(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	proxyPort := enheStripper(t, net.JoinHostPort("::1", fmt.Sprint(r.port)))
	// The state file says this peer negotiated RFC 5549 before: IPv4 may
	// go out at once, and must be taken back when the OPEN says otherwise.
	statePath := filepath.Join(t.TempDir(), "state", "bgp.json")
	if err := os.MkdirAll(filepath.Dir(statePath), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(statePath, []byte(`{"rfc5549":{"::1":true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	sp := newSpeaker(t, func(c *Config) { c.StateFile = statePath })
	p := torPeer(r)
	p.Port = proxyPort
	if err := sp.Sync(map[netip.Prefix]advert.Kind{pod6: advert.Pod, pod4: advert.Pod}); err != nil {
		t.Fatal(err)
	}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	n := waitEstablished(t, sp, r, "::1")
	// The ToR really did get the OPEN without the capability.
	var nh bool
	for _, c := range r.peer(t).GetState().GetLocalCap() {
		nh = nh || c.GetExtendedNexthop() != nil
	}
	if !nh {
		t.Fatal("test setup: the ToR does not offer extended next hop at all")
	}
	if len(n.Warnings) != 1 || !strings.Contains(n.Warnings[0], "extended next hop") {
		t.Errorf("warnings %q", n.Warnings)
	}
	if m := sp.Mismatches(); !slices.Equal(m, []string{"::1"}) {
		t.Errorf("Mismatches() = %v", m)
	}
	r.waitRIB(t, pod6)
	consistently(t, "IPv4 withheld", 2*time.Second, func() (bool, string) {
		got := prefixes(r.rib(t))
		return slices.Equal(got, []netip.Prefix{pod6}), fmt.Sprint(got)
	})
	if c := familyCounts(mustNeighbor(t, sp, "::1")); c["ipv4"] != 0 || c["ipv6"] != 1 {
		t.Errorf("advertised %v", c)
	}
	// The peer is out of the IPv4-ok set, and the state file says so.
	if got := ipv4OKList(t, sp); len(got) != 0 {
		t.Errorf("%s = %v, want empty", ipv4OKSet, got)
	}
	b, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil || st.RFC5549["::1"] {
		t.Errorf("state file %s (%v)", b, err)
	}
	// New IPv4 routes stay withheld too.
	if err := sp.Sync(map[netip.Prefix]advert.Kind{netip.MustParsePrefix("10.20.0.6/32"): advert.Pod, any6: advert.Anycast}); err != nil {
		t.Fatal(err)
	}
	r.waitRIB(t, pod6, any6)
}

func ipv4OKList(t *testing.T, sp *Speaker) []string {
	t.Helper()
	var out []string
	err := sp.srv.ListDefinedSet(context.Background(), &api.ListDefinedSetRequest{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: ipv4OKSet}, func(ds *api.DefinedSet) {
		if ds.Name == ipv4OKSet {
			out = append(out, ds.List...)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestHandlePeerEventGuard drives the guard plumbing with crafted events,
// without any session.
func TestHandlePeerEventGuard(t *testing.T) {
	statePath := filepath.Join(t.TempDir(), "bgp.json")
	sp := newSpeaker(t, func(c *Config) { c.StateFile = statePath })
	const key = "fd00::1"
	done := make(chan struct{})
	close(done)
	sp.mu.Lock()
	sp.peers[key] = &peer{
		spec: v1alpha1.Peer{Address: key, ASN: torASN}, addr: key, apiAddr: key,
		added: true, cancel: func() {}, done: done,
	}
	sp.mu.Unlock()
	ev := func(st bgp.FSMState, caps ...bgp.ParameterCapabilityInterface) *apiutil.WatchEventMessage_PeerEvent {
		return &apiutil.WatchEventMessage_PeerEvent{Type: apiutil.PEER_EVENT_STATE, Peer: apiutil.Peer{
			Conf:  apiutil.PeerConf{NeighborAddress: netip.MustParseAddr(key), PeerASN: torASN},
			State: apiutil.PeerState{NeighborAddress: netip.MustParseAddr(key), PeerASN: torASN, SessionState: st, RemoteCap: caps},
		}}
	}
	mp4, mp6 := bgp.NewCapMultiProtocol(bgp.RF_IPv4_UC), bgp.NewCapMultiProtocol(bgp.RF_IPv6_UC)
	enhe4 := bgp.NewCapExtendedNexthop([]*bgp.CapExtendedNexthopTuple{bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv4_UC, bgp.AFI_IP6)})
	knownGood := func() (bool, bool) {
		b, err := os.ReadFile(statePath)
		if err != nil {
			return false, false
		}
		var st stateFile
		if json.Unmarshal(b, &st) != nil {
			return false, false
		}
		v, ok := st.RFC5549[key]
		return v, ok
	}

	// Established with the capability: the peer joins the IPv4-ok set.
	sp.handlePeerEvent(ev(bgp.BGP_FSM_ESTABLISHED, mp4, mp6, enhe4))
	if got := ipv4OKList(t, sp); !slices.Equal(got, []string{key + "/128"}) {
		t.Errorf("%s = %v", ipv4OKSet, got)
	}
	if m := sp.Mismatches(); len(m) != 0 {
		t.Errorf("Mismatches() = %v", m)
	}
	if good, ok := knownGood(); !ok || !good {
		t.Errorf("state file does not remember %s as good", key)
	}
	if up, total := sp.Established(); up != 1 || total != 1 {
		t.Errorf("Established() = %d/%d", up, total)
	}

	// The session drops and comes back without it (the ToR's config
	// changed): the peer leaves the set, with a warning.
	sp.handlePeerEvent(ev(bgp.BGP_FSM_IDLE))
	if m := sp.Mismatches(); len(m) != 0 {
		t.Errorf("Mismatches() while down = %v", m)
	}
	sp.handlePeerEvent(ev(bgp.BGP_FSM_ESTABLISHED, mp4, mp6))
	if got := ipv4OKList(t, sp); len(got) != 0 {
		t.Errorf("%s = %v, want empty", ipv4OKSet, got)
	}
	sp.mu.Lock()
	inSet := sp.ipv4OK[key]
	sp.mu.Unlock()
	if inSet {
		t.Error("ipv4OK still has the peer")
	}
	if m := sp.Mismatches(); !slices.Equal(m, []string{key}) {
		t.Errorf("Mismatches() = %v", m)
	}
	n := mustNeighbor(t, sp, key)
	if n.State != "Established" || len(n.Warnings) != 1 || !strings.Contains(n.Warnings[0], "extended next hop") {
		t.Errorf("neighbour %+v", n)
	}
	if good, ok := knownGood(); !ok || good {
		t.Errorf("state file still remembers %s as good", key)
	}
	// A repeated event changes nothing.
	sp.handlePeerEvent(ev(bgp.BGP_FSM_ESTABLISHED, mp4, mp6))
	if m := sp.Mismatches(); !slices.Equal(m, []string{key}) {
		t.Errorf("Mismatches() = %v", m)
	}

	// Down: the warning goes with the session.
	sp.handlePeerEvent(ev(bgp.BGP_FSM_ACTIVE))
	if m := sp.Mismatches(); len(m) != 0 {
		t.Errorf("Mismatches() while down = %v", m)
	}
	if n := mustNeighbor(t, sp, key); n.State != "Active" || len(n.Warnings) != 0 {
		t.Errorf("neighbour %+v", n)
	}

	// Back with the capability: in the set again.
	sp.handlePeerEvent(ev(bgp.BGP_FSM_ESTABLISHED, mp4, mp6, enhe4))
	if got := ipv4OKList(t, sp); !slices.Equal(got, []string{key + "/128"}) {
		t.Errorf("%s = %v", ipv4OKSet, got)
	}
	if m := sp.Mismatches(); len(m) != 0 {
		t.Errorf("Mismatches() = %v", m)
	}

	// An event for a peer flock does not know is ignored.
	other := ev(bgp.BGP_FSM_ESTABLISHED, mp4, mp6)
	other.Peer.State.NeighborAddress = netip.MustParseAddr("fd00::99")
	other.Peer.Conf.NeighborAddress = netip.MustParseAddr("fd00::99")
	sp.handlePeerEvent(other)
	if m := sp.Mismatches(); len(m) != 0 {
		t.Errorf("Mismatches() = %v", m)
	}

	// A new speaker reads the state file.
	sp2 := newSpeaker(t, func(c *Config) { c.StateFile = statePath })
	sp2.mu.Lock()
	good := sp2.knownGood[key]
	sp2.mu.Unlock()
	if !good {
		t.Error("state file not loaded")
	}
}

// gobgpPeers lists the peers the speaker's GoBGP server holds.
func gobgpPeers(t *testing.T, sp *Speaker) []string {
	t.Helper()
	var out []string
	if err := sp.srv.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
		out = append(out, p.GetState().GetNeighborAddress())
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func waitAdded(t *testing.T, sp *Speaker, key string) Neighbor {
	t.Helper()
	var n Neighbor
	eventually(t, key+" added", func() (bool, string) {
		var ok bool
		n, ok = neighbor(sp, key)
		return ok && n.State != "Configuring" && n.State != "Resolving" && n.Address != "", fmt.Sprintf("%+v", n)
	})
	return n
}

// A peer whose GoBGP address was never learnt is still deleted (by its
// configured address): GoBGP's DeletePeer panics on an empty address.
func TestRemovePeerWithoutListedAddress(t *testing.T) {
	sp := newSpeaker(t)
	p := v1alpha1.Peer{Address: "::1", Port: freePort(t, "::1"), ASN: torASN, Timers: v1alpha1.Timers{ConnectRetry: 1}}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	waitAdded(t, sp, "::1")
	if got := gobgpPeers(t, sp); !slices.Equal(got, []string{"::1"}) {
		t.Fatalf("GoBGP peers %v", got)
	}
	sp.mu.Lock()
	sp.peers["::1"].apiAddr = ""
	sp.mu.Unlock()
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	if got := gobgpPeers(t, sp); len(got) != 0 {
		t.Fatalf("GoBGP peers after removal %v", got)
	}
}

// TestInterfacePeerRemove adds an unnumbered peer on a veth whose
// neighbour table holds one (permanent) link-local neighbour, then removes
// it, also after the neighbour is gone. Needs root (CAP_NET_ADMIN); it
// creates and deletes a veth pair in the current network namespace.
func TestInterfacePeerRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a veth pair")
	}
	name := fmt.Sprintf("flkt%x", uint16(os.Getpid()))
	la := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name + "a"}, PeerName: name + "b"}
	if err := netlink.LinkAdd(la); err != nil {
		t.Skipf("cannot create a veth pair: %v", err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(la) })
	link, err := netlink.LinkByName(la.Name)
	if err != nil {
		t.Fatal(err)
	}
	peerLink, err := netlink.LinkByName(la.PeerName)
	if err != nil {
		t.Fatal(err)
	}
	// Both ends up, so that the link-local address (which GoBGP needs as
	// the session's source) passes duplicate address detection.
	for _, l := range []netlink.Link{link, peerLink} {
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	neigh := &netlink.Neigh{
		LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("fe80::beef"), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0xbe, 0xef},
	}
	if err := netlink.NeighAdd(neigh); err != nil {
		t.Fatal(err)
	}

	sp := newSpeaker(t)
	key := "interface " + la.Name
	p := v1alpha1.Peer{Interface: la.Name, ASN: torASN, Timers: v1alpha1.Timers{ConnectRetry: 1}}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	n := waitAdded(t, sp, key)
	if n.Address != "fe80::beef" || n.LastError != "" {
		t.Errorf("neighbour %+v", n)
	}
	if got := gobgpPeers(t, sp); len(got) != 1 {
		t.Fatalf("GoBGP peers %v", got)
	}

	// Remove it (GoBGP v4.8.0 panics on a DeletePeer by interface alone).
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	if got := gobgpPeers(t, sp); len(got) != 0 {
		t.Fatalf("GoBGP peers after removal %v", got)
	}

	// Again, and it can be removed after its neighbour entry is gone.
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	if n := waitAdded(t, sp, key); n.LastError != "" {
		t.Errorf("re-added: %+v", n)
	}
	if err := netlink.NeighDel(neigh); err != nil {
		t.Fatal(err)
	}
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	if got := gobgpPeers(t, sp); len(got) != 0 {
		t.Fatalf("GoBGP peers after removal without a neighbour %v", got)
	}
}

// Community-only updates while a peer is still being added (here: an
// unnumbered peer whose interface does not exist, so adding retries) must
// not race with the add goroutine.
func TestApplyPeersWhileAdding(t *testing.T) {
	sp := newSpeaker(t)
	p := v1alpha1.Peer{Interface: "flk-nonexist0", ASN: torASN}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		p.Communities.Pod = []string{fmt.Sprintf("64512:%d", i)}
		if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	n := mustNeighbor(t, sp, "interface flk-nonexist0")
	if n.State != "Resolving" || n.LastError == "" {
		t.Errorf("neighbour %+v, want Resolving with an error", n)
	}
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	if n := sp.Neighbors(context.Background()); len(n) != 0 {
		t.Errorf("Neighbors = %+v", n)
	}
}

// Everything the agent calls, concurrently, against a live session (for
// -race); the ToR ends up with exactly the final desired set.
func TestSpeakerConcurrentUse(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t)
	p := torPeer(r)
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, sp, r, "::1")
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 50 {
				pfx := netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 1: byte(w), 15: byte(i)}), 128)
				if err := sp.Sync(map[netip.Prefix]advert.Kind{pfx: advert.Pod}); err != nil {
					t.Error(err)
				}
				if i%2 == 1 {
					if err := sp.Sync(map[netip.Prefix]advert.Kind{pfx: ""}); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 10 {
			q := p
			q.Communities.Pod = []string{fmt.Sprintf("64512:%d", i)}
			if err := sp.ApplyPeers([]v1alpha1.Peer{q}); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Go(func() {
		for range 50 {
			sp.Neighbors(context.Background())
			sp.Held()
			sp.Established()
			sp.Mismatches()
		}
	})
	wg.Wait()
	// 4 workers × 25 prefixes kept.
	if got := len(sp.Held()); got != 100 {
		t.Fatalf("Held has %d paths, want 100", got)
	}
	eventually(t, "ToR has the 100 kept prefixes with the last communities", func() (bool, string) {
		rib := r.rib(t)
		if len(rib) != 100 {
			return false, fmt.Sprintf("%d prefixes", len(rib))
		}
		for pfx, path := range rib {
			if std, _ := communities(path); !slices.Equal(std, []string{"64512:9"}) {
				return false, fmt.Sprintf("%s: %v", pfx, std)
			}
		}
		return true, ""
	})
	if !r.established(t) {
		t.Error("session lost")
	}
}

// The import policy: reject (the default) keeps what the ToR sends out of
// the node's RIB but not the node's own paths; accept takes both.
func TestSpeakerImportPolicy(t *testing.T) {
	for _, policy := range []string{"", "accept"} {
		t.Run("policy="+policy, func(t *testing.T) {
			r := startToR(t, "::1", torASN, "10.255.0.1")
			r.addNeighbor(t, "::1", flockASN)
			torRoute := netip.MustParsePrefix("fd00:aaaa::/48")
			nlri, _ := bgp.NewIPAddrPrefix(torRoute)
			mp, _ := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
			if _, err := r.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{{
				Family: bgp.RF_IPv6_UC, Nlri: nlri, Attrs: []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0), mp},
			}}}); err != nil {
				t.Fatal(err)
			}
			sp := newSpeaker(t, func(c *Config) { c.BGP.ImportPolicy = policy })
			if err := sp.Sync(map[netip.Prefix]advert.Kind{pod6: advert.Pod}); err != nil {
				t.Fatal(err)
			}
			if err := sp.ApplyPeers([]v1alpha1.Peer{torPeer(r)}); err != nil {
				t.Fatal(err)
			}
			waitEstablished(t, sp, r, "::1")
			r.waitRIB(t, pod6, torRoute)
			node := &tor{srv: sp.srv, addr: "node"}
			want := []netip.Prefix{pod6}
			if policy == "accept" {
				want = append(want, torRoute)
			}
			node.waitRIB(t, want...)
			if policy == "" {
				consistently(t, "nothing imported", time.Second, func() (bool, string) {
					got := prefixes(node.rib(t))
					return slices.Equal(got, want), fmt.Sprint(got)
				})
			}
		})
	}
}

// restartFlag is the Restart State bit of flock's GR capability as the
// ToR received it.
func (r *tor) restartFlag(t *testing.T) (gr, restarting bool) {
	t.Helper()
	caps, err := apiutil.UnmarshalCapabilities(r.peer(t).GetState().GetRemoteCap())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range caps {
		if c, ok := c.(*bgp.CapGracefulRestart); ok {
			return true, c.Flags&0x08 != 0
		}
	}
	return false, false
}

// A speaker whose state file exists restarted: its first peers come up as
// GR "restarting" (and still get their routes at once); later ones do not.
func TestSpeakerRestarting(t *testing.T) {
	statePath := filepath.Join(t.TempDir(), "bgp.json")
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprint("restart=", restart), func(t *testing.T) {
			r := startToR(t, "::1", torASN, "10.255.0.1")
			r.addNeighbor(t, "::1", flockASN)
			_, statErr := os.Stat(statePath)
			if exists := statErr == nil; exists != restart {
				t.Fatalf("state file exists = %v", exists)
			}
			sp := newSpeaker(t, func(c *Config) { c.StateFile = statePath })
			if err := sp.Sync(map[netip.Prefix]advert.Kind{pod6: advert.Pod}); err != nil {
				t.Fatal(err)
			}
			p := torPeer(r)
			if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
				t.Fatal(err)
			}
			waitEstablished(t, sp, r, "::1")
			if gr, restarting := r.restartFlag(t); !gr || restarting != restart {
				t.Errorf("ToR sees GR %v restarting %v, want restarting %v", gr, restarting, restart)
			}
			r.waitRIB(t, pod6)
			// Re-created later (new timers): never restarting again.
			uptime := r.uptime(t)
			p.Timers.HoldTime, p.Timers.KeepaliveTime = 6, 2
			if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "session re-created", func() (bool, string) {
				n, _ := neighbor(sp, "::1")
				return r.established(t) && r.uptime(t).After(uptime) && n.State == "Established", n.State
			})
			if _, restarting := r.restartFlag(t); restarting {
				t.Error("re-created peer is still restarting")
			}
			r.waitRIB(t, pod6)
		})
	}
}
