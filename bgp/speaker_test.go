package bgp

// End-to-end tests: a flock Speaker against a "ToR" that is a second,
// plain embedded GoBGP server on loopback. Assertions are on what the ToR's
// global RIB holds and on the ToR's view of the session.

import (
	"context"
	"fmt"
	"log/slog"
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

	"code.fritzlab.net/fritzlab/flock/advert"
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

var (
	capMP4  = bgp.NewCapMultiProtocol(bgp.RF_IPv4_UC)
	capMP6  = bgp.NewCapMultiProtocol(bgp.RF_IPv6_UC)
	capENHE = bgp.NewCapExtendedNexthop([]*bgp.CapExtendedNexthopTuple{bgp.NewCapExtendedNexthopTuple(bgp.RF_IPv4_UC, bgp.AFI_IP6)})
)

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
