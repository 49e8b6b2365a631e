package bgp

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
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

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

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
