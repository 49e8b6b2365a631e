package bgp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
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

// logCapture keeps every record a logger writes (text format, With
// attributes included) and passes it on to the test log.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
	out *testLogWriter
}

func (c *logCapture) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(b)
	c.mu.Unlock()
	return c.out.Write(b)
}

func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// lines returns the captured lines that contain every one of subs.
func (c *logCapture) lines(subs ...string) []string {
	var out []string
	for l := range strings.SplitSeq(c.String(), "\n") {
		ok := l != ""
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

func captureLogger(t *testing.T) (*slog.Logger, *logCapture) {
	w := &testLogWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	c := &logCapture{out: w}
	return slog.New(slog.NewTextHandler(c, &slog.HandlerOptions{Level: slog.LevelDebug})), c
}

// shortMaxPrefixBackoff makes the max-prefix back-off test-sized until the
// test ends (register it before the speaker, so it is restored after).
func shortMaxPrefixBackoff(t *testing.T, lo, hi, stable time.Duration) {
	oldMin, oldMax, oldStable := maxPrefixBackoffMin, maxPrefixBackoffMax, maxPrefixStable
	maxPrefixBackoffMin, maxPrefixBackoffMax, maxPrefixStable = lo, hi, stable
	t.Cleanup(func() { maxPrefixBackoffMin, maxPrefixBackoffMax, maxPrefixStable = oldMin, oldMax, oldStable })
}

// withdraw takes back prefixes the ToR originated.
func (r *tor) withdraw(t *testing.T, pfxs ...netip.Prefix) {
	t.Helper()
	for _, pfx := range pfxs {
		nlri, err := bgp.NewIPAddrPrefix(pfx)
		if err != nil {
			t.Fatal(err)
		}
		mp, _ := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
		if err := r.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{{
			Family: bgp.RF_IPv6_UC, Nlri: nlri, Attrs: []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0), mp},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// gobgpAdminState is the admin state of the speaker's only GoBGP peer.
func gobgpAdminState(t *testing.T, sp *Speaker) api.PeerState_AdminState {
	t.Helper()
	var st api.PeerState_AdminState
	if err := sp.srv.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) { st = p.GetState().GetAdminState() }); err != nil {
		t.Fatal(err)
	}
	return st
}

func torPrefixes(n int) []netip.Prefix {
	var out []netip.Prefix
	for i := range n {
		out = append(out, netip.MustParsePrefix(fmt.Sprintf("fd00:aaaa:%x::/48", i)))
	}
	return out
}

// The documented schedule: 30 s, doubling, at most 10 min.
func TestMaxPrefixBackoff(t *testing.T) {
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	for i, w := range want {
		if got := maxPrefixBackoff(i + 1); got != w {
			t.Errorf("trip %d: %s, want %s", i+1, got, w)
		}
	}
	if got := maxPrefixBackoff(1000); got != 10*time.Minute {
		t.Errorf("trip 1000: %s", got)
	}
	if maxPrefixStable != 10*time.Minute {
		t.Errorf("stable after %s", maxPrefixStable)
	}
}

// A ToR sending more than maxPrefixes: the session is torn down (Cease to
// the ToR), the log says so once per trip with peer, family, limit and
// count, the Neighbor says why and when it retries, nothing the ToR sent is
// kept (GoBGP would keep it all as stale under graceful restart, and count
// it against the limit again), retries back off exponentially up to the
// cap, and once the ToR sends fewer the session comes back.
func TestSpeakerMaxPrefix(t *testing.T) {
	shortMaxPrefixBackoff(t, time.Second, 2*time.Second, time.Hour)
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	flood := torPrefixes(5)
	r.announce(t, flood...)
	log, logs := captureLogger(t)
	sp := newSpeaker(t, func(c *Config) { c.BGP.ImportPolicy = "accept"; c.Log = log })
	set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod}, true)
	p := torPeer(r)
	p.MaxPrefixes = 3
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	const tripMsg = "bgp: max-prefix exceeded"
	// Held: GoBGP has the peer admin-down (no connection attempts, the
	// ToR's refused) until the back-off ends, then enables it. Checked on
	// every look while waiting, in an order that holds however late the
	// look: the end of the last trip's hold first (a trip is handled, the
	// peer deleted from GoBGP, under sp.mu), then GoBGP's state, then the
	// time. A state read before the hold's end is that hold's: down, or
	// unspecified between the delete and Run's re-add; one read after it
	// may be up, or a later trip's hold.
	held := func() api.PeerState_AdminState {
		t.Helper()
		var until time.Time
		sp.mu.Lock()
		if p := sp.peers["::1"]; p != nil {
			until = p.holdUntil
		}
		sp.mu.Unlock()
		st := gobgpAdminState(t, sp)
		if left := time.Until(until); left > 0 && st != api.PeerState_ADMIN_STATE_DOWN && st != api.PeerState_ADMIN_STATE_UNSPECIFIED {
			t.Fatalf("GoBGP has the peer %s %v before its back-off ends", st, left)
		}
		return st
	}
	var n Neighbor
	testutil.EventuallyWithin(t, waitFor, "first max-prefix trip", func() (bool, string) {
		held()
		n = mustNeighbor(t, sp, "::1")
		return len(logs.lines(tripMsg)) >= 1 && n.LastError != "", fmt.Sprintf("%+v", n)
	})
	// Seen late on a loaded machine, the hold may be over already.
	if !regexp.MustCompile(`^max-prefix 3 exceeded for ipv6 \(received 5\): session down, (retrying in [01]s|reconnecting)$`).MatchString(n.LastError) {
		t.Errorf("LastError %q", n.LastError)
	}
	if n.Established() {
		t.Errorf("state %s", n.State)
	}
	first := logs.lines(tripMsg)[0]
	for _, want := range []string{"level=WARN", "peer=::1", "family=ipv6", "limit=3", "received=5", "retry_in=1s"} {
		if !strings.Contains(first, want) {
			t.Errorf("trip log %q lacks %q", first, want)
		}
	}
	testutil.EventuallyWithin(t, waitFor, "enabled after the back-off", func() (bool, string) {
		st := held()
		return st == api.PeerState_ADMIN_STATE_UP || len(logs.lines(tripMsg)) > 1, st.String()
	})
	// The ToR was told why (Cease, maximum number of prefixes reached).
	if got := r.peer(t).GetState().GetMessages().GetReceived().GetNotification(); got == 0 {
		t.Error("the ToR received no NOTIFICATION")
	}
	// Nothing the ToR sent stays: no stale flood in the node's RIB.
	node := &tor{srv: sp.srv, addr: "node"}
	node.waitRIB(t, pod6)

	// Still too many: retried after 1 s, then 2 s, then 2 s (the cap), each
	// trip logged once (numbered in a row); never before its back-off ends.
	testutil.EventuallyWithin(t, waitFor, "three trips", func() (bool, string) {
		held()
		return len(logs.lines(tripMsg)) >= 3, fmt.Sprint(len(logs.lines(tripMsg)))
	})
	trips := logs.lines(tripMsg)
	for i, want := range []string{"retry_in=1s", "retry_in=2s", "retry_in=2s"} {
		if !strings.Contains(trips[i], want) {
			t.Errorf("trip %d: %q, want %s", i+1, trips[i], want)
		}
	}
	if n := mustNeighbor(t, sp, "::1"); !strings.HasPrefix(n.LastError, "max-prefix 3 exceeded for ipv6 (received 5): session down, ") {
		t.Errorf("LastError %q", n.LastError)
	}

	// The ToR now sends fewer: the session comes back after the back-off
	// and stays; what the ToR sends is accepted, the reason is gone.
	r.withdraw(t, flood[2:]...)
	n = waitEstablished(t, sp, r, "::1")
	node.waitRIB(t, pod6, flood[0], flood[1])
	testutil.Consistently(t, "session stays up", 2*time.Second, func() (bool, string) {
		n = mustNeighbor(t, sp, "::1")
		return n.Established() && n.LastError == "", fmt.Sprintf("%+v", n)
	})
	n = mustNeighbor(t, sp, "::1")
	for _, f := range n.Families {
		if f.Family == "ipv6" && f.Received != 2 {
			t.Errorf("ipv6 received %d, want 2", f.Received)
		}
	}
	r.waitRIB(t, pod6, flood[0], flood[1])
	// However many trips there were before the ToR sent fewer (a loaded
	// machine may take a back-off or two more to get there), each was
	// logged once.
	for i, l := range logs.lines(tripMsg) {
		if !strings.Contains(l, fmt.Sprintf("trips_in_a_row=%d ", i+1)) && !strings.HasSuffix(l, fmt.Sprintf("trips_in_a_row=%d", i+1)) {
			t.Errorf("trip log %d: %q, want trips_in_a_row=%d", i+1, l, i+1)
		}
	}
	// The trips are all the log says at warning level: no GoBGP repeats.
	if l := logs.lines("level=WARN", "component=gobgp"); len(l) != 0 {
		t.Errorf("GoBGP warnings: %q", l)
	}
	if l := logs.lines("bgp: peer added"); len(l) != 1 {
		t.Errorf("re-adding after a trip logged as a new peer: %q", l)
	}
}

// Without graceful restart GoBGP drops what the peer sent before flock
// sees the trip: the log and Neighbor name the limit without a count (and
// the family when the peer has one), and the session comes back all the
// same.
func TestSpeakerMaxPrefixNoGR(t *testing.T) {
	shortMaxPrefixBackoff(t, time.Second, 2*time.Second, time.Hour)
	r := startToR(t, "::1", torASN, "10.255.0.1")
	r.addNeighbor(t, "::1", flockASN)
	flood := torPrefixes(4)
	r.announce(t, flood...)
	log, logs := captureLogger(t)
	sp := newSpeaker(t, func(c *Config) { c.BGP.ImportPolicy = "accept"; c.Log = log })
	p := torPeer(r)
	p.MaxPrefixes, p.GracefulRestart.Disabled, p.Families = 2, true, []string{"ipv6"}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	var n Neighbor
	testutil.EventuallyWithin(t, waitFor, "max-prefix trip", func() (bool, string) {
		n = mustNeighbor(t, sp, "::1")
		return n.LastError != "", fmt.Sprintf("%+v", n)
	})
	if !strings.HasPrefix(n.LastError, "max-prefix 2 exceeded for ipv6: session down, retrying in ") {
		t.Errorf("LastError %q", n.LastError)
	}
	if l := logs.lines("bgp: max-prefix exceeded", "family=ipv6", "limit=2"); len(l) != 1 {
		t.Errorf("trip logs %q", l)
	}
	r.withdraw(t, flood[1:]...)
	waitEstablished(t, sp, r, "::1")
	(&tor{srv: sp.srv, addr: "node"}).waitRIB(t, flood[0])
	testutil.EventuallyWithin(t, waitFor, "reason cleared", func() (bool, string) {
		n = mustNeighbor(t, sp, "::1")
		return n.Established() && n.LastError == "", fmt.Sprintf("%+v", n)
	})
}

// A session that stayed up for maxPrefixStable starts the back-off again.
func TestMaxPrefixTripsReset(t *testing.T) {
	shortMaxPrefixBackoff(t, 30*time.Second, 10*time.Minute, 10*time.Minute)
	sp := newIdleSpeaker(t)
	p := &peer{key: "::1", spec: v1alpha1.Peer{Address: "::1", MaxPrefixes: 1}, pfxTrips: 3}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.peers["::1"] = p
	sp.maxPrefixTripLocked(t.Context(), "::1", p, true, time.Now().Add(-time.Minute))
	if p.pfxTrips != 4 || time.Until(p.holdUntil) < 3*time.Minute {
		t.Errorf("after a short session: trips %d, hold %s", p.pfxTrips, time.Until(p.holdUntil))
	}
	sp.maxPrefixTripLocked(t.Context(), "::1", p, true, time.Now().Add(-11*time.Minute))
	if p.pfxTrips != 1 || time.Until(p.holdUntil) > 30*time.Second {
		t.Errorf("after a stable session: trips %d, hold %s", p.pfxTrips, time.Until(p.holdUntil))
	}
	if !strings.HasPrefix(p.maxPrefixStatus(time.Now()), "max-prefix 1 exceeded: session down, retrying in ") {
		t.Errorf("status %q", p.maxPrefixStatus(time.Now()))
	}
	if got := slices.Collect(strings.SplitSeq(p.maxPrefixStatus(p.holdUntil), ": ")); got[len(got)-1] != "session down, reconnecting" {
		t.Errorf("after the hold: %q", got)
	}
}

// GoBGP's repeats around a max-prefix trip (and its sender racing its own
// close) are logged at info, so below the warning level GoBGP runs at;
// everything else it warns about still shows.
func TestLevelFilterDemotes(t *testing.T) {
	var buf bytes.Buffer
	lvl := &slog.LevelVar{}
	lvl.Set(slog.LevelWarn)
	log := slog.New(levelFilter{slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), lvl}).With("component", "gobgp")
	closed := &net.OpError{Op: "write", Net: "tcp", Err: net.ErrClosed}
	log.Warn("prefix limit reached", "Family", "ipv6-unicast")
	log.Warn("previous setting admin state request is still remaining")
	log.Warn("cannot change to the same state", "State", "BGP_FSM_IDLE")
	log.Warn("failed to send", "State", "BGP_FSM_ESTABLISHED", "Data", closed)
	log.Warn("failed to send", "State", "BGP_FSM_ESTABLISHED", "Data", errors.New("write: broken pipe"))
	log.Warn("hold timer expired")
	got := buf.String()
	for _, gone := range []string{"prefix limit reached", "still remaining", "same state", "closed network connection"} {
		if strings.Contains(got, gone) {
			t.Errorf("%q logged at warning level:\n%s", gone, got)
		}
	}
	for _, kept := range []string{"broken pipe", "hold timer expired"} {
		if !strings.Contains(got, kept) {
			t.Errorf("%q not logged:\n%s", kept, got)
		}
	}
	// At info (GoBGP's level lowered) the demoted records show, at info.
	buf.Reset()
	lvl.Set(slog.LevelInfo)
	log.Warn("prefix limit reached", "Family", "ipv6-unicast")
	if got := buf.String(); !strings.Contains(got, "level=INFO") || !strings.Contains(got, "prefix limit reached") {
		t.Errorf("at info: %q", got)
	}
}
