// Package bgp owns flock's embedded GoBGP speaker: its lifecycle, the peers
// from NodeConfig (added, removed and updated live), the export policy
// (RFC 5549 guard, per-peer communities per advertisement kind, nothing
// but locally originated paths), the paths it originates (Set: a
// level-triggered diff against the full desired set) and the session state
// that flockctl and the metrics show.
package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/bgp/bfd"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// Config of a Speaker.
type Config struct {
	ASN       uint32
	RouterID  string
	BGP       v1alpha1.BGP
	Passwords PasswordSource
	Log       *slog.Logger
	// StateFile remembers which peers negotiated RFC 5549, so that after a
	// restart IPv4 routes go out in the first UPDATEs instead of after a
	// re-check (an End-of-RIB without them would flush them at a GR peer).
	StateFile string
	// BFDPort is the BFD Control port listened on and sent to (default
	// 3784; tests running several speakers on one host set their own).
	BFDPort, BFDPeerPort int
	// Neighbours is the kernel's neighbour table for unnumbered peers
	// (relink.go); nil: the real one.
	Neighbours Neighbours
	// Links reports the carrier of the unnumbered peers' links
	// (carrier.go); nil: the kernel's.
	Links Links
}

// Restarting tells whether this node ran a speaker before (its state file
// exists): then the first peers are added as graceful-restart "restarting"
// so the ToR keeps our routes until our End-of-RIB.
func (c Config) Restarting() bool {
	if c.StateFile == "" {
		return false
	}
	_, err := os.Stat(c.StateFile)
	return err == nil
}

// Back-off of Run's retries (a failed export policy install) and of adding
// a peer.
const (
	minRetry = 100 * time.Millisecond
	maxRetry = 5 * time.Second
)

// ribFamilies are GoBGP's numbers (oc.AfiSafiTypeToIntMap) of IPv4 and
// IPv6 unicast.
var ribFamilies = []uint32{0, 1}

// Speaker is one embedded GoBGP server.
type Speaker struct {
	log       *slog.Logger
	srv       *server.BgpServer
	asn       uint32
	passwords PasswordSource
	stateFile string
	changed   chan struct{} // see Changed
	neigh     Neighbours    // the kernel's neighbour table (unnumbered peers)
	links     Links         // carrier changes (unnumbered peers)
	linkUp    linkUp        // wakes the unnumbered peers' add goroutines
	// fastRelink: until when each link whose carrier came back is looked
	// at by relink without delay (under mu).
	fastRelink map[string]time.Time
	// linkDown: the links whose carrier was last seen lost (under mu).
	linkDown map[string]bool
	wake     chan struct{} // coalesced: the desired peers changed, or Run should retry
	running  atomic.Bool

	// Paths (Set, Held).
	pathMu sync.Mutex
	held   map[netip.Prefix]advert.Path
	// reread: an earlier Set failed, so GoBGP may hold paths held does not
	// know about (AddPath reports nothing per path when one of a batch
	// fails); the next Set re-reads the RIB first.
	reread bool
	// fullPasses counts full Sets (see Set: when GoBGP is re-read).
	fullPasses int
	// announceHook, if set (tests), may replace a path before it is added.
	announceHook func(netip.Prefix, *apiutil.Path) *apiutil.Path

	// BFD (bfd.go): flock's own, a session per peer with BFD enabled; it
	// runs for the speaker's lifetime (Stop ends it), not Run's.
	bfd        *bfd.Manager
	bfdEvents  chan bfd.Event
	bfdCtx     context.Context
	bfdStop    context.CancelFunc
	bfdStarted bool // guarded by mu

	// Peers.
	mu         sync.Mutex
	want       map[string]wantPeer // desired peers (ApplyPeers)
	peers      map[string]*peer    // the peers Run has taken on
	knownGood  map[string]bool     // peer keys that negotiated RFC 5549 before
	export     exportState
	restarting bool // the next ApplyPeers is the first one
}

// wantPeer is one desired peer, its password already read.
type wantPeer struct {
	spec       v1alpha1.Peer
	password   string
	fp         string
	restarting bool
}

type peer struct {
	key        string
	spec       v1alpha1.Peer // communities may change in place; the rest is fp
	fp         string
	password   string
	restarting bool // added as GR "restarting" (the agent restarted)

	cancel  context.CancelFunc // ends the add goroutine (nil: none started)
	done    chan struct{}      // closed when the add goroutine has ended
	gone    chan struct{}      // closed when the peer is removed
	added   bool               // AddPeer succeeded
	enabled bool               // EnablePeer succeeded
	apiAddr netip.Addr         // the address GoBGP keys the peer by (zone for a link-local one)
	local   netip.Addr         // the session's local address, without zone
	state   bgp.FSMState
	since   time.Time
	guard   Guard
	ipv4OK  bool // the RFC 5549 guard lets IPv4 through
	// exported is what the export policy in force gives the peer;
	// policyWarning says when that is not what it is configured for.
	exported      string
	policyWarning string
	ipv4Held      bool // the policy holds IPv4 back although the guard allows it
	lastErr       string
	// Max-prefix (maxprefix.go): why GoBGP tore the session down ("" once
	// a session is up again), the trips in a row (the back-off exponent)
	// and until when the peer is held admin-down.
	maxPfx    string
	pfxTrips  int
	holdUntil time.Time
	// BFD downs seen (bfd.go): failures (the BGP session was reset) and
	// planned stops (the remote sent AdminDown).
	bfdFailures, bfdPlanned int
	// bfdReset: a BFD-triggered ResetPeer is in flight. GoBGP queues the
	// reset's NOTIFICATION for the established session; if that session
	// ends some other way first (the ToR's own NOTIFICATION racing our
	// BFD Down), the NOTIFICATION stays queued and would tear down the
	// next session the moment it is established.
	bfdReset bool
	// bfdArmed: the BGP session has been established since the peer was
	// added; its BFD session runs from then on (bfd.go).
	bfdArmed bool
}

// adding tells whether the peer's add goroutine is running.
func (p *peer) adding() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// New builds a GoBGP server with flock's global config and policies. Paths
// can be Set at once; peers are recorded by ApplyPeers and taken on by Run.
func New(cfg Config) (*Speaker, error) {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	lvl := &slog.LevelVar{}
	lvl.Set(slog.LevelWarn) // GoBGP is chatty at info
	s := &Speaker{
		log: log, asn: cfg.ASN, passwords: cfg.Passwords, stateFile: cfg.StateFile, changed: make(chan struct{}, 1),
		srv:  server.NewBgpServer(server.LoggerOption(slog.New(levelFilter{log.With("component", "gobgp").Handler(), lvl}), lvl)),
		wake: make(chan struct{}, 1),
		held: map[netip.Prefix]advert.Path{},
		want: map[string]wantPeer{}, peers: map[string]*peer{}, knownGood: map[string]bool{},
		fastRelink: map[string]time.Time{}, linkDown: map[string]bool{},
	}
	if s.passwords == nil {
		s.passwords = FilePasswords
	}
	s.neigh = cfg.Neighbours
	if s.neigh == nil {
		s.neigh = kernelNeighbours{}
	}
	s.links = cfg.Links
	if s.links == nil {
		s.links = kernelLinks{}
	}
	s.bfdEvents = make(chan bfd.Event, 64)
	s.bfdCtx, s.bfdStop = context.WithCancel(context.Background())
	s.bfd = &bfd.Manager{Port: cfg.BFDPort, PeerPort: cfg.BFDPeerPort, Log: log, OnChange: s.onBFD}
	go s.srv.Serve()
	if err := s.setup(context.Background(), cfg); err != nil {
		s.bfdStop()
		s.srv.Stop()
		return nil, err
	}
	s.restarting = cfg.Restarting()
	s.loadState()
	s.saveStateLocked() // marks the node as having run a speaker
	return s, nil
}

func (s *Speaker) setup(ctx context.Context, cfg Config) error {
	port := cfg.BGP.ListenPort
	if port == 0 {
		port = 179
	}
	// Only the families flock speaks: left empty, GoBGP builds a RIB for
	// each of the ~30 it knows, twice (global and route-server), each with
	// 2,048 preallocated shards — 12 MB of an idle agent's heap.
	global := &api.Global{Asn: cfg.ASN, RouterId: cfg.RouterID, ListenPort: port, Families: ribFamilies}
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		return fmt.Errorf("bgp: start: %w", err)
	}
	importDefault := api.RouteAction_ROUTE_ACTION_REJECT
	if cfg.BGP.ImportPolicy == "accept" {
		importDefault = api.RouteAction_ROUTE_ACTION_ACCEPT
	}
	// GoBGP runs locally originated paths through the global import policy
	// too: without this statement a reject-by-default import would turn
	// every path we add into a withdrawal.
	if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{Name: "flock-import", Statements: []*api.Statement{{
		Name:       "flock-accept-local",
		Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
		Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT},
	}}}}); err != nil {
		return fmt.Errorf("bgp: import policy: %w", err)
	}
	if err := s.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_IMPORT,
		Policies: []*api.Policy{{Name: "flock-import"}}, DefaultAction: importDefault,
	}}); err != nil {
		return fmt.Errorf("bgp: import policy: %w", err)
	}
	if err := s.installBaseSets(ctx); err != nil {
		return err
	}
	_, err := s.installExport(ctx, nil)
	return err
}

// Stop shuts the server down, sending Cease to every peer (which withdraws
// our routes there); call it after Run has returned. The agent does not
// call it: it just exits, and graceful restart keeps the routes at the ToR.
func (s *Speaker) Stop() {
	s.bfdStop()
	s.srv.Stop()
}

// Run takes on the desired peers and follows their sessions until ctx
// ends: it adds peers (retrying with back-off), removes and re-creates
// them, keeps the export policy in step and applies the RFC 5549 guard. It
// then returns nil, leaving the GoBGP server and its sessions as they are
// (no Cease: graceful restart keeps our routes at the ToR while the agent
// restarts). Every goroutine Run starts has ended when it returns.
func (s *Speaker) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("bgp: Run is already running")
	}
	defer s.running.Store(false)
	events := make(chan *apiutil.WatchEventMessage_PeerEvent, 256)
	// GoBGP's watcher goroutine ends with ctx.
	if err := s.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
			if ev.Type != apiutil.PEER_EVENT_STATE && ev.Type != apiutil.PEER_EVENT_INIT {
				return
			}
			select {
			case events <- ev:
			default:
				s.log.Warn("bgp: peer event queue full; state will catch up at the next event")
			}
		},
	}, server.WatchPeer()); err != nil {
		return fmt.Errorf("bgp: watch peer events: %w", err)
	}
	var wg sync.WaitGroup // add goroutines and soft resets
	defer s.stopPeers(&wg)
	// Carrier changes; without them (no netlink), the hold timer and
	// relink find a dead link, only later.
	wctx, stopWatch := context.WithCancel(ctx)
	carrier, err := s.links.Watch(wctx)
	if err != nil {
		s.log.Warn("bgp: link carrier not watched (unnumbered peers notice a lost link by the hold timer)", "err", err)
	}
	watched := carrier // carrier is set to nil once closed
	defer func() {
		stopWatch()
		if watched != nil {
			for range watched { // the watch has ended once it is closed
			}
		}
	}()

	var retry <-chan time.Time
	// hold ends the first max-prefix back-off: apply then enables the peer.
	var hold <-chan time.Time
	armHold := func() {
		hold = nil
		if d, ok := s.nextRelease(); ok {
			hold = time.After(d)
		}
	}
	backoff := minRetry
	apply := func() {
		if err := s.syncPeers(ctx, &wg); err != nil {
			s.log.Error("bgp: peers; retrying", "err", err, "in", backoff)
			retry = time.After(backoff)
			backoff = min(backoff*2, maxRetry)
		} else {
			retry, backoff = nil, minRetry
		}
		armHold()
		s.notify()
	}
	apply()
	relink := time.NewTicker(relinkEvery)
	defer relink.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-relink.C:
			s.relink(ctx, now)
			if !s.relinkingFast(now) {
				relink.Reset(relinkEvery)
			}
		case c, ok := <-carrier:
			if !ok {
				if ctx.Err() == nil {
					s.log.Warn("bgp: link carrier watch ended (unnumbered peers notice a lost link by the hold timer)")
				}
				carrier = nil
				continue
			}
			s.log.Debug("bgp: carrier", "interface", c.Iface, "up", c.Up)
			now := time.Now()
			s.handleCarrier(ctx, c, now)
			if s.relinkingFast(now) {
				relink.Reset(relinkFastEvery)
			}
			s.notify()
		case ev := <-events:
			s.handlePeerEvent(ctx, &wg, ev)
			armHold()
			s.notify()
		case <-s.wake:
			apply()
		case <-retry:
			apply()
		case <-hold:
			apply()
		case e := <-s.bfdEvents:
			s.handleBFDEvent(ctx, e)
			s.notify()
		}
	}
}

// stopPeers ends the goroutines Run started; peers whose add did not
// finish are picked up again by a later Run.
func (s *Speaker) stopPeers(wg *sync.WaitGroup) {
	s.mu.Lock()
	for _, p := range s.peers {
		if p.cancel != nil {
			p.cancel()
		}
	}
	s.mu.Unlock()
	wg.Wait()
	s.mu.Lock()
	for _, p := range s.peers {
		p.cancel, p.done = nil, nil
	}
	s.mu.Unlock()
}

// kick makes Run look at the peers again (a new desired set, or something
// to retry).
func (s *Speaker) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Speaker) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Changed receives a value (coalesced) when session state may have
// changed: Neighbors tells what it is now.
func (s *Speaker) Changed() <-chan struct{} { return s.changed }
