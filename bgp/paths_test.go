package bgp

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
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

func prefixes(m map[netip.Prefix]*apiutil.Path) []netip.Prefix {
	return slices.SortedFunc(maps.Keys(m), func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
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
// (as kinds: the pod routes these tests set carry nothing else).
func gobgpRIB(t *testing.T, sp *Speaker) map[netip.Prefix]advert.Kind {
	t.Helper()
	got, err := sp.readRIB()
	if err != nil {
		t.Fatal(err)
	}
	return kinds(got)
}

func kinds(paths map[netip.Prefix]advert.Path) map[netip.Prefix]advert.Kind {
	out := make(map[netip.Prefix]advert.Kind, len(paths))
	for p, a := range paths {
		out[p] = a.Kind
	}
	return out
}

// heldKinds is what the speaker believes it holds, as kinds.
func heldKinds(sp *Speaker) map[netip.Prefix]advert.Kind { return kinds(sp.Held()) }

func set(t *testing.T, sp *Speaker, desired map[netip.Prefix]advert.Kind, full bool) {
	t.Helper()
	if err := sp.Set(context.Background(), advert.Paths(desired), full); err != nil {
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

func TestSpeakerSet(t *testing.T) {
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	sp := newSpeaker(t)

	// Paths set before there is any session go out once it is up.
	first := map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod, pod4: advert.Pod}
	set(t, sp, first, true)
	if got := heldKinds(sp); !maps.Equal(got, first) {
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
	if got := heldKinds(sp); !maps.Equal(got, map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod4: advert.Pod}) {
		t.Errorf("Held = %v", got)
	}

	// Added, withdrawn and left alone at once.
	want := map[netip.Prefix]advert.Kind{summary6: advert.Summary, any6: advert.Anycast}
	set(t, sp, want, false)
	r.waitRIB(t, summary6, any6)
	if got := heldKinds(sp); !maps.Equal(got, want) {
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
	if got := heldKinds(sp); len(got) != 0 {
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
	del, _ := sp.path(pod6, advert.Path{Kind: advert.Pod})
	if err := sp.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{del}}); err != nil {
		t.Fatal(err)
	}
	stray := netip.MustParsePrefix("fd00:77::/64")
	var add []*apiutil.Path
	for pfx, k := range map[netip.Prefix]advert.Kind{any6: advert.Anycast, pod4: advert.Anycast, stray: ""} {
		p, err := sp.path(pfx, advert.Path{Kind: k})
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
	if got := heldKinds(sp); !maps.Equal(got, want) {
		t.Errorf("Held = %v, want %v", got, want)
	}

	// A change behind its back that keeps the path count (one path
	// swapped for another) escapes the cheap count check of a full pass,
	// but not the periodic re-read: within rereadEvery full passes.
	if err := sp.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{del}}); err != nil {
		t.Fatal(err)
	}
	swap, _ := sp.path(stray, advert.Path{})
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
	err := sp.Set(context.Background(), advert.Paths(map[netip.Prefix]advert.Kind{summary6: advert.Summary, pod6: advert.Pod, bad: advert.Pod}), false)
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
	if got := heldKinds(sp); !maps.Equal(got, want) {
		t.Errorf("Held = %v, want %v", got, want)
	}
	r.waitRIB(t, summary6, bad, any6)

	// And everything can be withdrawn, at GoBGP and at the ToR.
	set(t, sp, nil, false)
	if got := gobgpRIB(t, sp); len(got) != 0 {
		t.Errorf("GoBGP holds %v", got)
	}
	if got := heldKinds(sp); len(got) != 0 {
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
	if got := len(heldKinds(sp)); got != 4 {
		t.Errorf("Held has %d paths, want 4", got)
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
		snap := advert.Paths(desired)
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
			heldKinds(sp)
		}
	})
	wg.Wait()
	// Snapshots may have been applied out of order: the next pass
	// converges.
	pass(false, func() {})
	// 4 workers × 25 prefixes kept.
	if got := len(heldKinds(sp)); got != 100 {
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
	if got := heldKinds(sp); !maps.Equal(got, own) {
		t.Errorf("Held = %v, want %v", got, own)
	}
	node.waitRIB(t, pod6, pod4, fromA6, fromA4, fromB4)
}
