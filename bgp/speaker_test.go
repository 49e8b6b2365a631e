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

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/bgp/advert"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

const (
	flockASN = 64512
	torASN   = 64513
	tor2ASN  = 64514
	// waitFor bounds the waits for BGP: a session may take a connect
	// retry or two.
	waitFor = 30 * time.Second
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
	r.addNeighborConf(t, neighbor, asn, nil)
}

// addNeighborConf is addNeighbor with the peer config edited by edit.
func (r *tor) addNeighborConf(t *testing.T, neighbor string, asn uint32, edit func(*api.Peer)) {
	t.Helper()
	r.neighbor = neighbor
	var afs []*api.AfiSafi
	for _, f := range []string{"ipv4", "ipv6"} {
		afs = append(afs, &api.AfiSafi{
			Config:            &api.AfiSafiConfig{Family: apiFamily(f), Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
		})
	}
	p := &api.Peer{
		Conf:            &api.PeerConf{NeighborAddress: neighbor, PeerAsn: asn},
		Transport:       &api.Transport{PassiveMode: true},
		Timers:          &api.Timers{Config: &api.TimersConfig{HoldTime: 9, KeepaliveInterval: 3, ConnectRetry: 1}},
		GracefulRestart: &api.GracefulRestart{Enabled: true, RestartTime: 120},
		AfiSafis:        afs,
	}
	if edit != nil {
		edit(p)
	}
	if err := r.srv.AddPeer(context.Background(), &api.AddPeerRequest{Peer: p}); err != nil {
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
	testutil.EventuallyWithin(t, waitFor, fmt.Sprintf("ToR %s RIB = %v", r.addr, want), func() (bool, string) {
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

// newIdleSpeaker builds a speaker without running it.
func newIdleSpeaker(t *testing.T, opts ...speakerOpt) *Speaker {
	t.Helper()
	cfg := Config{ASN: flockASN, RouterID: "10.255.0.2", BGP: v1alpha1.BGP{ListenPort: -1}, Log: testLogger(t)}
	for _, o := range opts {
		o(&cfg)
	}
	sp, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Stop)
	return sp
}

// startRun runs sp until the test ends (or the returned stop is called,
// which waits for Run to return and checks it returned nil). Registered
// after newIdleSpeaker's cleanup, it runs before the speaker's Stop.
func startRun(t *testing.T, sp *Speaker) (stop func()) {
	t.Helper()
	_, stop = testutil.Run(t, sp.Run)
	return stop
}

func newSpeaker(t *testing.T, opts ...speakerOpt) *Speaker {
	t.Helper()
	sp := newIdleSpeaker(t, opts...)
	startRun(t, sp)
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
	testutil.EventuallyWithin(t, waitFor, "session "+key+" Established", func() (bool, string) {
		var ok bool
		n, ok = neighbor(sp, key)
		return ok && n.Established() && r.established(t), fmt.Sprintf("flock: %+v", n)
	})
	return n
}

// countAnnounces counts the paths the speaker hands to AddPath from now on.
func countAnnounces(sp *Speaker) func() int {
	var mu sync.Mutex
	n := 0
	sp.pathMu.Lock()
	sp.announceHook = func(_ netip.Prefix, p *apiutil.Path) *apiutil.Path {
		mu.Lock()
		n++
		mu.Unlock()
		return p
	}
	sp.pathMu.Unlock()
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// gobgpRIB is what the speaker's GoBGP server really originates.
func gobgpRIB(t *testing.T, sp *Speaker) map[netip.Prefix]advert.Kind {
	t.Helper()
	got, err := sp.readRIB()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func set(t *testing.T, sp *Speaker, desired map[netip.Prefix]advert.Kind, full bool) {
	t.Helper()
	if err := sp.Set(context.Background(), desired, full); err != nil {
		t.Fatal(err)
	}
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
	if n.State != Established || n.RFC5549Mismatch {
		t.Errorf("neighbour %+v", n)
	}
	// The ToR sees flock with the configured timers.
	if ht := r.peer(t).GetTimers().GetState().GetNegotiatedHoldTime(); ht != 9 {
		t.Errorf("negotiated hold time %d, want 9", ht)
	}
}

func TestSpeakerSet(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t)

	// Paths set before there is any session go out once it is up.
	first := map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod, pod4: advert.Pod}
	set(t, sp, first, true)
	if got := sp.Held(); !maps.Equal(got, first) {
		t.Fatalf("Held = %v, want %v", got, first)
	}
	if got := gobgpRIB(t, sp); !maps.Equal(got, first) {
		t.Fatalf("GoBGP holds %v, want %v", got, first)
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
	testutil.EventuallyWithin(t, waitFor, "advertised counts", func() (bool, string) {
		n, _ := neighbor(sp, "::1")
		c := familyCounts(n)
		return c["ipv4"] == 1 && c["ipv6"] == 2, fmt.Sprint(n.Families)
	})

	// The same set again, trusted or re-read: nothing is re-added, nothing
	// is sent. A session delivers in order, so what the ToR received before
	// a path announced afterwards (a barrier) is everything sent before it:
	// a first barrier puts the session's start behind the count, a second
	// one anything the no-op Sets sent.
	barrier := func(pfx netip.Prefix) uint64 {
		t.Helper()
		with := maps.Clone(first)
		with[pfx] = advert.Anycast
		set(t, sp, with, false)
		r.waitRIB(t, slices.Collect(maps.Keys(with))...)
		set(t, sp, first, false)
		r.waitRIB(t, summary6, pod6, pod4)
		return r.receivedUpdates(t)
	}
	updates := barrier(netip.MustParsePrefix("fd00:98::1/128"))
	announced := countAnnounces(sp)
	set(t, sp, first, false)
	set(t, sp, first, true)
	if n := announced(); n != 0 {
		t.Errorf("%d unchanged paths re-added", n)
	}
	// The second barrier's announce and withdrawal: two UPDATEs.
	if got := barrier(netip.MustParsePrefix("fd00:98::2/128")); got != updates+2 {
		t.Errorf("ToR received %d UPDATEs after a no-op Set", got-updates-2)
	}
	announced = countAnnounces(sp) // the barrier's announce is not counted below

	// What the set no longer has is withdrawn.
	set(t, sp, map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod4: advert.Pod}, false)
	r.waitRIB(t, summary6, pod4)
	if got := sp.Held(); !maps.Equal(got, map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod4: advert.Pod}) {
		t.Errorf("Held = %v", got)
	}

	// Added, withdrawn and left alone at once.
	want := map[netip.Prefix]advert.Kind{summary6: advert.Summary, any6: advert.Anycast}
	set(t, sp, want, false)
	r.waitRIB(t, summary6, any6)
	if got := sp.Held(); !maps.Equal(got, want) {
		t.Errorf("Held = %v", got)
	}
	if got := gobgpRIB(t, sp); !maps.Equal(got, want) {
		t.Errorf("GoBGP holds %v", got)
	}
	if n := announced(); n != 1 {
		t.Errorf("%d paths announced, want 1 (any6 only)", n)
	}
	testutil.EventuallyWithin(t, waitFor, "advertised counts after withdrawals", func() (bool, string) {
		n, _ := neighbor(sp, "::1")
		c := familyCounts(n)
		return c["ipv4"] == 0 && c["ipv6"] == 2, fmt.Sprint(n.Families)
	})

	// Everything gone.
	set(t, sp, nil, false)
	r.waitRIB(t)
	if got := sp.Held(); len(got) != 0 {
		t.Errorf("Held = %v", got)
	}
	if got := gobgpRIB(t, sp); len(got) != 0 {
		t.Errorf("GoBGP holds %v", got)
	}
}

// A full Set trusts GoBGP's RIB, not its own view: paths changed behind
// its back are repaired; a plain Set trusts its own view.
func TestSetFullRereadsGoBGP(t *testing.T) {
	sp := newIdleSpeaker(t) // Set needs no Run
	want := map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod, pod4: advert.Pod}
	set(t, sp, want, false)

	// Behind the speaker's back: pod6 withdrawn, any6 added, pod4 turned
	// into an anycast path, and a path without a marker.
	del, _ := sp.path(pod6, advert.Pod)
	if err := sp.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{del}}); err != nil {
		t.Fatal(err)
	}
	stray := netip.MustParsePrefix("fd00:77::/64")
	var add []*apiutil.Path
	for pfx, k := range map[netip.Prefix]advert.Kind{any6: advert.Anycast, pod4: advert.Anycast, stray: ""} {
		p, err := sp.path(pfx, k)
		if err != nil {
			t.Fatal(err)
		}
		add = append(add, p)
	}
	if _, err := sp.srv.AddPath(apiutil.AddPathRequest{Paths: add}); err != nil {
		t.Fatal(err)
	}
	behind := map[netip.Prefix]advert.Kind{summary6: advert.Summary, any6: advert.Anycast, pod4: advert.Anycast, stray: ""}
	if got := gobgpRIB(t, sp); !maps.Equal(got, behind) {
		t.Fatalf("GoBGP holds %v, want %v", got, behind)
	}

	set(t, sp, want, false)
	if got := gobgpRIB(t, sp); !maps.Equal(got, behind) {
		t.Errorf("a plain Set changed GoBGP: %v", got)
	}
	set(t, sp, want, true)
	if got := gobgpRIB(t, sp); !maps.Equal(got, want) {
		t.Errorf("after a full Set GoBGP holds %v, want %v", got, want)
	}
	if got := sp.Held(); !maps.Equal(got, want) {
		t.Errorf("Held = %v, want %v", got, want)
	}

	// A change behind its back that keeps the path count (one path
	// swapped for another) escapes the cheap count check of a full pass,
	// but not the periodic re-read: within rereadEvery full passes.
	if err := sp.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{del}}); err != nil {
		t.Fatal(err)
	}
	swap, _ := sp.path(stray, "")
	if _, err := sp.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{swap}}); err != nil {
		t.Fatal(err)
	}
	passes := 0
	for ; passes < rereadEvery && !maps.Equal(gobgpRIB(t, sp), want); passes++ {
		set(t, sp, want, true)
	}
	if got := gobgpRIB(t, sp); !maps.Equal(got, want) {
		t.Errorf("after %d full Sets GoBGP holds %v, want %v", passes, got, want)
	}
}

// Defect 15: GoBGP v4.8.0's AddPath returns no per-path results when one
// path of a batch fails, although it added the others. The speaker lost
// track of them and could never withdraw them; now the next Set re-reads
// GoBGP first.
func TestSetPartialBatchFailure(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t)
	if err := sp.ApplyPeers([]v1alpha1.Peer{torPeer(r)}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, sp, r, "::1")

	bad := netip.MustParsePrefix("fd00:bad::/64")
	sp.pathMu.Lock()
	sp.announceHook = func(pfx netip.Prefix, p *apiutil.Path) *apiutil.Path {
		if pfx != bad {
			return p
		}
		// No next hop: GoBGP rejects this one path.
		return &apiutil.Path{Family: p.Family, Nlri: p.Nlri, Attrs: p.Attrs[:1]}
	}
	sp.pathMu.Unlock()
	err := sp.Set(context.Background(), map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod, bad: advert.Pod}, false)
	if err == nil {
		t.Fatal("Set with a bad path: no error")
	}
	// The test is about GoBGP's behaviour: the good paths went in.
	if got := gobgpRIB(t, sp); !maps.Equal(got, map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod}) {
		t.Fatalf("GoBGP holds %v after the failed batch", got)
	}
	r.waitRIB(t, summary6, pod6)

	// The failure is gone; pod6 is no longer wanted. The next Set must
	// know that GoBGP holds it.
	sp.pathMu.Lock()
	sp.announceHook = nil
	sp.pathMu.Unlock()
	want := map[netip.Prefix]advert.Kind{summary6: advert.Summary, bad: advert.Pod, any6: advert.Anycast}
	set(t, sp, want, false)
	if got := gobgpRIB(t, sp); !maps.Equal(got, want) {
		t.Errorf("GoBGP holds %v, want %v", got, want)
	}
	if got := sp.Held(); !maps.Equal(got, want) {
		t.Errorf("Held = %v, want %v", got, want)
	}
	r.waitRIB(t, summary6, bad, any6)

	// And everything can be withdrawn, at GoBGP and at the ToR.
	set(t, sp, nil, false)
	if got := gobgpRIB(t, sp); len(got) != 0 {
		t.Errorf("GoBGP holds %v", got)
	}
	if got := sp.Held(); len(got) != 0 {
		t.Errorf("Held = %v", got)
	}
	r.waitRIB(t)
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
	set(t, sp, map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod, any6: advert.Anycast, pod4: advert.Pod}, false)
	type comms struct{ std, large string }
	check := func(what string, want map[netip.Prefix]comms) {
		t.Helper()
		var last map[netip.Prefix]comms
		testutil.EventuallyWithin(t, waitFor, what, func() (bool, string) {
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
	set(t, sp, map[netip.Prefix]advert.Kind{summary6: advert.Summary, any6: advert.Pod, pod6: advert.Anycast, pod4: advert.Pod}, false)
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
	if n := mustNeighbor(t, sp, "::1"); !n.Established() || !n.Since.Equal(since) {
		t.Errorf("flock saw a state change: %+v (since %v)", n, since)
	}

	// New timers: the session is re-created (the ToR has 9, so a shorter
	// hold time shows in the negotiated one).
	p.Timers.HoldTime, p.Timers.KeepaliveTime = 6, 2
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, waitFor, "session re-created with hold time 6", func() (bool, string) {
		tp := r.peer(t)
		n, _ := neighbor(sp, "::1")
		ok := tp.GetState().GetSessionState() == api.PeerState_SESSION_STATE_ESTABLISHED &&
			tp.GetTimers().GetState().GetNegotiatedHoldTime() == 6 &&
			r.uptime(t).After(uptime) && n.Established()
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
	testutil.EventuallyWithin(t, waitFor, "session gone at the ToR", func() (bool, string) {
		st := r.peer(t).GetState().GetSessionState()
		return st != api.PeerState_SESSION_STATE_ESTABLISHED, st.String()
	})
	r.waitRIB(t)
	if n := sp.Neighbors(context.Background()); len(n) != 0 {
		t.Errorf("Neighbors = %+v", n)
	}
	// The paths stay held for when a peer comes back.
	if got := len(sp.Held()); got != 4 {
		t.Errorf("Held has %d paths, want 4", got)
	}
}

func established(sp *Speaker) int {
	up := 0
	for _, n := range sp.Neighbors(context.Background()) {
		if n.Established() {
			up++
		}
	}
	return up
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
	set(t, sp, map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod4: advert.Pod}, false)
	r6.waitRIB(t, summary6, pod4)
	rib4 := r4.waitRIB(t, pod4)
	if nh := nextHop(rib4[pod4]); nh != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("IPv4 session: next hop %v, want 127.0.0.1", nh)
	}
	testutil.EventuallyWithin(t, waitFor, "per-peer communities", func() (bool, string) {
		std6, _ := communities(r6.rib(t)[pod4])
		std4, _ := communities(r4.rib(t)[pod4])
		return slices.Equal(std6, []string{"64512:600"}) && slices.Equal(std4, []string{"64512:400"}), fmt.Sprintf("ToR6 %v ToR4 %v", std6, std4)
	})
	if up := established(sp); up != 2 {
		t.Errorf("%d sessions established, want 2", up)
	}

	uptime4 := r4.uptime(t)
	flops4 := r4.peer(t).GetState().GetFlops()
	if err := sp.ApplyPeers([]v1alpha1.Peer{p4}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, waitFor, "IPv6 session gone", func() (bool, string) {
		st := r6.peer(t).GetState().GetSessionState()
		return st != api.PeerState_SESSION_STATE_ESTABLISHED, st.String()
	})
	r6.waitRIB(t)
	testutil.Consistently(t, "the other session stays up", time.Second, func() (bool, string) {
		tp := r4.peer(t)
		ok := tp.GetState().GetSessionState() == api.PeerState_SESSION_STATE_ESTABLISHED &&
			r4.uptime(t).Equal(uptime4) && tp.GetState().GetFlops() == flops4
		return ok, fmt.Sprintf("%v uptime %v (was %v) flops %d (was %d)", tp.GetState().GetSessionState(), r4.uptime(t), uptime4, tp.GetState().GetFlops(), flops4)
	})
	if got := prefixes(r4.rib(t)); !slices.Equal(got, []netip.Prefix{pod4}) {
		t.Errorf("remaining ToR RIB %v", got)
	}
	if n := sp.Neighbors(context.Background()); len(n) != 1 || !n[0].Established() {
		t.Errorf("Neighbors = %+v", n)
	}
	// The remaining peer still gets new routes through the rebuilt policy.
	p2 := netip.MustParsePrefix("10.20.0.6/32")
	set(t, sp, map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod4: advert.Pod, p2: advert.Pod}, false)
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
	set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod, pod4: advert.Pod}, true)
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
	if !n.RFC5549Mismatch {
		t.Errorf("neighbour %+v: no RFC 5549 mismatch", n)
	}
	r.waitRIB(t, pod6)
	testutil.Consistently(t, "IPv4 withheld", 2*time.Second, func() (bool, string) {
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
	set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod, pod4: advert.Pod, netip.MustParsePrefix("10.20.0.6/32"): advert.Pod, any6: advert.Anycast}, false)
	r.waitRIB(t, pod6, any6)
}

// ipv4OKList is the IPv4-ok set of the export policy in force.
func ipv4OKList(t *testing.T, sp *Speaker) []string {
	t.Helper()
	sp.mu.Lock()
	name := fmt.Sprintf("%s-%d", ipv4OKSet, sp.export.seq)
	sp.mu.Unlock()
	var out []string
	found := false
	err := sp.srv.ListDefinedSet(context.Background(), &api.ListDefinedSetRequest{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: name}, func(ds *api.DefinedSet) {
		if ds.Name == name {
			found = true
			out = append(out, ds.List...)
		}
	})
	if err != nil || !found {
		t.Fatalf("set %s: found %v, %v", name, found, err)
	}
	slices.Sort(out)
	return out
}

// fakePeer puts an added, enabled peer into a speaker that does not run,
// for driving handlePeerEvent with crafted events.
func fakePeer(sp *Speaker, spec v1alpha1.Peer, apiAddr string) {
	key := Key(spec)
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.want[key] = wantPeer{spec: spec, fp: "fake"}
	sp.peers[key] = &peer{key: key, spec: spec, fp: "fake", added: true, enabled: true, apiAddr: netip.MustParseAddr(apiAddr)}
}

func peerEvent(addr string, st bgp.FSMState, caps ...bgp.ParameterCapabilityInterface) *apiutil.WatchEventMessage_PeerEvent {
	a := netip.MustParseAddr(addr)
	return &apiutil.WatchEventMessage_PeerEvent{Type: apiutil.PEER_EVENT_STATE, Peer: apiutil.Peer{
		Conf:  apiutil.PeerConf{NeighborAddress: a, PeerASN: torASN},
		State: apiutil.PeerState{NeighborAddress: a, PeerASN: torASN, SessionState: st, RemoteCap: caps},
	}}
}

var (
	capMP4  = bgp.NewCapMultiProtocol(bgp.RF_IPv4_UC)
	capMP6  = bgp.NewCapMultiProtocol(bgp.RF_IPv6_UC)
	capENHE = bgp.NewCapExtendedNexthop([]*bgp.CapExtendedNexthopTuple{bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv4_UC, bgp.AFI_IP6)})
)

// TestHandlePeerEventGuard drives the guard plumbing with crafted events,
// without any session.
func TestHandlePeerEventGuard(t *testing.T) {
	statePath := filepath.Join(t.TempDir(), "bgp.json")
	sp := newIdleSpeaker(t, func(c *Config) { c.StateFile = statePath })
	const key = "fd00::1"
	fakePeer(sp, v1alpha1.Peer{Address: key, ASN: torASN}, key)
	ctx := context.Background()
	var wg sync.WaitGroup
	defer wg.Wait()
	handle := func(ev *apiutil.WatchEventMessage_PeerEvent) { sp.handlePeerEvent(ctx, &wg, ev) }
	ev := func(st bgp.FSMState, caps ...bgp.ParameterCapabilityInterface) *apiutil.WatchEventMessage_PeerEvent {
		return peerEvent(key, st, caps...)
	}
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
	check := func(what string, state SessionState, mismatch bool) {
		t.Helper()
		n := mustNeighbor(t, sp, key)
		if n.State != state || n.RFC5549Mismatch != mismatch {
			t.Errorf("%s: neighbour %+v, want %s, mismatch %v", what, n, state, mismatch)
		}
		if mismatch != (len(n.Warnings) == 1 && strings.Contains(n.Warnings[0], "extended next hop")) {
			t.Errorf("%s: warnings %q", what, n.Warnings)
		}
	}

	// Established with the capability: the peer joins the IPv4-ok set.
	handle(ev(bgp.BGP_FSM_ESTABLISHED, capMP4, capMP6, capENHE))
	if got := ipv4OKList(t, sp); !slices.Equal(got, []string{key + "/128"}) {
		t.Errorf("%s = %v", ipv4OKSet, got)
	}
	check("established", Established, false)
	if good, ok := knownGood(); !ok || !good {
		t.Errorf("state file does not remember %s as good", key)
	}

	// The session drops and comes back without it (the ToR's config
	// changed): the peer leaves the set, with a warning.
	handle(ev(bgp.BGP_FSM_IDLE))
	check("down", Idle, false)
	handle(ev(bgp.BGP_FSM_ESTABLISHED, capMP4, capMP6))
	if got := ipv4OKList(t, sp); len(got) != 0 {
		t.Errorf("%s = %v, want empty", ipv4OKSet, got)
	}
	check("established without extended next hop", Established, true)
	if good, ok := knownGood(); !ok || good {
		t.Errorf("state file still remembers %s as good", key)
	}
	// A repeated event changes nothing.
	handle(ev(bgp.BGP_FSM_ESTABLISHED, capMP4, capMP6))
	check("repeated", Established, true)

	// Down: the warning goes with the session.
	handle(ev(bgp.BGP_FSM_ACTIVE))
	check("down again", Active, false)

	// Back with the capability: in the set again.
	handle(ev(bgp.BGP_FSM_ESTABLISHED, capMP4, capMP6, capENHE))
	if got := ipv4OKList(t, sp); !slices.Equal(got, []string{key + "/128"}) {
		t.Errorf("%s = %v", ipv4OKSet, got)
	}
	check("back", Established, false)

	// An event for a peer flock does not know is ignored.
	handle(peerEvent("fd00::99", bgp.BGP_FSM_ESTABLISHED, capMP4, capMP6))
	check("other peer's event", Established, false)
	if n := sp.Neighbors(ctx); len(n) != 1 {
		t.Errorf("Neighbors = %+v", n)
	}

	// A new speaker reads the state file.
	sp2 := newIdleSpeaker(t, func(c *Config) { c.StateFile = statePath })
	sp2.mu.Lock()
	good := sp2.knownGood[key]
	sp2.mu.Unlock()
	if !good {
		t.Error("state file not loaded")
	}
}

// Defect 8: an event about one of two sessions to the same link-local
// address on different links was matched by the address without its zone,
// so it could land on the other peer.
func TestPeerEventMatchesZone(t *testing.T) {
	sp := newIdleSpeaker(t)
	// Numbered peers configured with zones, so that no event names an
	// interface; GoBGP keys them by the full address.
	fakePeer(sp, v1alpha1.Peer{Address: "fe80::1%flka", ASN: torASN}, "fe80::1%flka")
	fakePeer(sp, v1alpha1.Peer{Address: "fe80::1%flkb", ASN: torASN}, "fe80::1%flkb")
	// Unnumbered peers whose events carry no interface (they always do in
	// GoBGP v4.8.0; the address is the fallback).
	fakePeer(sp, v1alpha1.Peer{Interface: "flkc", ASN: torASN}, "fe80::2%flkc")
	fakePeer(sp, v1alpha1.Peer{Interface: "flkd", ASN: torASN}, "fe80::2%flkd")
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx := context.Background()
	sp.handlePeerEvent(ctx, &wg, peerEvent("fe80::1%flkb", bgp.BGP_FSM_ESTABLISHED, capMP4, capMP6))
	sp.handlePeerEvent(ctx, &wg, peerEvent("fe80::2%flkc", bgp.BGP_FSM_ACTIVE))
	ifaceEv := peerEvent("fe80::2%flkd", bgp.BGP_FSM_OPENSENT)
	ifaceEv.Peer.Conf.NeighborInterface = "flkd"
	sp.handlePeerEvent(ctx, &wg, ifaceEv)
	// fe80::1%flka had no event: added, no state yet, so Idle.
	want := map[string]SessionState{
		"fe80::1%flka": Idle, "fe80::1%flkb": Established,
		"interface flkc": Active, "interface flkd": OpenSent,
	}
	got := map[string]SessionState{}
	for _, n := range sp.Neighbors(ctx) {
		got[n.Peer] = n.State
	}
	if !maps.Equal(got, want) {
		t.Errorf("states %v, want %v", got, want)
	}
	if n := mustNeighbor(t, sp, "fe80::1%flkb"); !n.RFC5549Mismatch || n.Address != "fe80::1" {
		t.Errorf("neighbour %+v", n)
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
	testutil.EventuallyWithin(t, waitFor, key+" added", func() (bool, string) {
		var ok bool
		n, ok = neighbor(sp, key)
		return ok && n.State != Configuring && n.State != Resolving && n.Address != "", fmt.Sprintf("%+v", n)
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
	sp.peers["::1"].apiAddr = netip.Addr{}
	sp.mu.Unlock()
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	waitNoGoBGPPeers(t, sp)
}

// waitNoGoBGPPeers waits until Run has removed every peer from GoBGP.
func waitNoGoBGPPeers(t *testing.T, sp *Speaker) {
	t.Helper()
	testutil.EventuallyWithin(t, waitFor, "GoBGP has no peers", func() (bool, string) {
		got := gobgpPeers(t, sp)
		return len(got) == 0, fmt.Sprint(got)
	})
}

// TestInterfacePeerRemove adds an unnumbered peer on a veth whose
// neighbour table holds one (permanent) link-local neighbour, then removes
// it, also after the neighbour is gone. Needs root (CAP_NET_ADMIN); it
// creates and deletes a veth pair in the current network namespace.
func TestInterfacePeerRemove(t *testing.T) {
	needRoot(t, "needs root to create a veth pair")
	name := fmt.Sprintf("flkt%x", uint16(os.Getpid()))
	la := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name + "a"}, PeerName: name + "b"}
	if err := netlink.LinkAdd(la); err != nil {
		t.Fatalf("cannot create a veth pair: %v", err)
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
	waitNoGoBGPPeers(t, sp)

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
	waitNoGoBGPPeers(t, sp)
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
	// Changes spread over the adder's retries (100 ms, doubling): the
	// sleep places them, it waits for nothing.
	for i := range 10 {
		p.Communities.Pod = []string{fmt.Sprintf("64512:%d", i)}
		if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	testutil.Eventually(t, "the adder's error", func() (bool, string) {
		n := mustNeighbor(t, sp, "interface flk-nonexist0")
		return n.LastError != "", fmt.Sprintf("%+v", n)
	})
	if n := mustNeighbor(t, sp, "interface flk-nonexist0"); n.State != Resolving {
		t.Errorf("neighbour %+v, want Resolving", n)
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
	// Each worker changes the shared desired set and hands the speaker a
	// snapshot (a reconcile loop's passes, racing).
	var mu sync.Mutex
	desired := map[netip.Prefix]advert.Kind{}
	pass := func(full bool, change func()) {
		mu.Lock()
		change()
		snap := maps.Clone(desired)
		mu.Unlock()
		if err := sp.Set(context.Background(), snap, full); err != nil {
			t.Error(err)
		}
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 50 {
				pfx := netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 1: byte(w), 15: byte(i)}), 128)
				pass(i%10 == 0, func() { desired[pfx] = advert.Pod })
				if i%2 == 1 {
					pass(false, func() { delete(desired, pfx) })
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
		}
	})
	wg.Wait()
	// Snapshots may have been applied out of order: the next pass
	// converges.
	pass(false, func() {})
	// 4 workers × 25 prefixes kept.
	if got := len(sp.Held()); got != 100 {
		t.Fatalf("Held has %d paths, want 100", got)
	}
	testutil.EventuallyWithin(t, waitFor, "ToR has the 100 kept prefixes with the last communities", func() (bool, string) {
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
			set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod}, true)
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
				testutil.Consistently(t, "nothing imported", time.Second, func() (bool, string) {
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
			set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod}, true)
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
			testutil.EventuallyWithin(t, waitFor, "session re-created", func() (bool, string) {
				n, _ := neighbor(sp, "::1")
				return r.established(t) && r.uptime(t).After(uptime) && n.Established(), string(n.State)
			})
			if _, restarting := r.restartFlag(t); restarting {
				t.Error("re-created peer is still restarting")
			}
			r.waitRIB(t, pod6)
		})
	}
}

// announce originates prefixes at the ToR.
func (r *tor) announce(t *testing.T, pfxs ...netip.Prefix) {
	t.Helper()
	var paths []*apiutil.Path
	for _, pfx := range pfxs {
		nlri, err := bgp.NewIPAddrPrefix(pfx)
		if err != nil {
			t.Fatal(err)
		}
		attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0)}
		fam := bgp.RF_IPv4_UC
		if pfx.Addr().Is4() {
			nh, _ := bgp.NewPathAttributeNextHop(netip.IPv4Unspecified())
			attrs = append(attrs, nh)
		} else {
			fam = bgp.RF_IPv6_UC
			mp, _ := bgp.NewPathAttributeMpReachNLRI(fam, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
			attrs = append(attrs, mp)
		}
		paths = append(paths, &apiutil.Path{Family: fam, Nlri: nlri, Attrs: attrs})
	}
	if _, err := r.srv.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
		t.Fatal(err)
	}
}

// Defect 14: with importPolicy accept the export policy accepted learned
// routes too, so the node re-advertised what one ToR sent it to the other:
// a transit router. Only what the node originates may leave it.
func TestSpeakerNoTransit(t *testing.T) {
	rA := startToR(t, "::1", torASN, "10.255.0.1")
	rA.addNeighbor(t, "::1", flockASN)
	rB := startToR(t, "127.0.0.1", tor2ASN, "10.255.0.3")
	rB.addNeighbor(t, "127.0.0.1", flockASN)
	fromA6, fromA4 := netip.MustParsePrefix("fd00:aaaa::/48"), netip.MustParsePrefix("10.99.0.0/24")
	fromB4 := netip.MustParsePrefix("10.98.0.0/24")
	rA.announce(t, fromA6, fromA4)
	rB.announce(t, fromB4)

	sp := newSpeaker(t, func(c *Config) { c.BGP.ImportPolicy = "accept" })
	own := map[netip.Prefix]advert.Kind{pod6: advert.Pod, pod4: advert.Pod}
	set(t, sp, own, true)
	if err := sp.ApplyPeers([]v1alpha1.Peer{torPeer(rA), torPeer(rB)}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, sp, rA, "::1")
	waitEstablished(t, sp, rB, "127.0.0.1")
	node := &tor{srv: sp.srv, addr: "node"}
	node.waitRIB(t, pod6, pod4, fromA6, fromA4, fromB4) // imported
	rA.waitRIB(t, fromA6, fromA4, pod6, pod4)
	rB.waitRIB(t, fromB4, pod4)
	testutil.Consistently(t, "no learned route passed on", 2*time.Second, func() (bool, string) {
		a, b := prefixes(rA.rib(t)), prefixes(rB.rib(t))
		return len(a) == 4 && len(b) == 2, fmt.Sprintf("ToR A %v, ToR B %v", a, b)
	})

	// Learned paths are not the speaker's: a full Set neither claims nor
	// withdraws them.
	set(t, sp, own, true)
	if got := sp.Held(); !maps.Equal(got, own) {
		t.Errorf("Held = %v, want %v", got, own)
	}
	node.waitRIB(t, pod6, pod4, fromA6, fromA4, fromB4)
}

// Run's lifecycle: peers recorded before Run are taken on by it; paths can
// be set without it; when its context ends it returns nil, its goroutines
// have ended and GoBGP keeps its sessions (no Cease); a later Run carries
// on.
func TestRunLifecycle(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newIdleSpeaker(t)
	set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod}, true)
	missing := v1alpha1.Peer{Interface: "flk-nonexist1", ASN: torASN}
	if err := sp.ApplyPeers([]v1alpha1.Peer{torPeer(r), missing}); err != nil {
		t.Fatal(err)
	}
	if n := mustNeighbor(t, sp, "::1"); n.State != Configuring {
		t.Errorf("before Run: %+v", n)
	}
	testutil.Consistently(t, "no peer added before Run", 300*time.Millisecond, func() (bool, string) {
		got := gobgpPeers(t, sp)
		return len(got) == 0, fmt.Sprint(got)
	})

	stop := startRun(t, sp)
	waitEstablished(t, sp, r, "::1")
	r.waitRIB(t, pod6)
	if err := sp.Run(context.Background()); err == nil {
		t.Error("a second concurrent Run was not refused")
	}
	testutil.EventuallyWithin(t, waitFor, "the missing interface retried", func() (bool, string) {
		n := mustNeighbor(t, sp, "interface flk-nonexist1")
		return n.State == Resolving && n.LastError != "", fmt.Sprintf("%+v", n)
	})
	sp.mu.Lock()
	adding := sp.peers["interface flk-nonexist1"].done
	sp.mu.Unlock()
	uptime := r.uptime(t)

	stop() // checks that Run returned nil
	select {
	case <-adding:
	default:
		t.Error("the add goroutine still runs after Run returned")
	}
	testutil.Consistently(t, "GoBGP keeps the session and the routes", time.Second, func() (bool, string) {
		ok := r.established(t) && r.uptime(t).Equal(uptime) && slices.Equal(prefixes(r.rib(t)), []netip.Prefix{pod6})
		return ok, fmt.Sprintf("established %v, RIB %v", r.established(t), prefixes(r.rib(t)))
	})

	// Paths still work without Run; a new Run takes on config changes
	// made meanwhile, without resetting the session.
	set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod, any6: advert.Anycast}, false)
	r.waitRIB(t, pod6, any6)
	p := torPeer(r)
	p.Communities.Anycast = []string{"64512:7"}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	startRun(t, sp)
	testutil.EventuallyWithin(t, waitFor, "communities from the second Run", func() (bool, string) {
		std, _ := communities(r.rib(t)[any6])
		return slices.Equal(std, []string{"64512:7"}), fmt.Sprint(std)
	})
	if !r.established(t) || !r.uptime(t).Equal(uptime) {
		t.Error("session reset")
	}
	if n := mustNeighbor(t, sp, "::1"); !n.Established() {
		t.Errorf("neighbour %+v", n)
	}
	if _, ok := neighbor(sp, "interface flk-nonexist1"); ok {
		t.Error("removed peer still listed")
	}
}
