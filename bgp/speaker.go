// Package bgp owns flock's embedded GoBGP speaker: its lifecycle, the peers
// from NodeConfig (added, removed and updated live), the export policy
// (RFC 5549 guard, per-peer communities per advertisement kind, nothing
// but locally originated paths), the paths it originates (Set: a
// level-triggered diff against the full desired set) and the session state
// that flockctl and the metrics show.
package bgp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"code.fritzlab.net/fritzlab/flock/bgp/advert"
	"code.fritzlab.net/fritzlab/flock/bgp/bfd"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// Config of a Speaker.
type Config struct {
	ASN       uint32
	RouterID  string
	BGP       v1alpha1.BGP
	Passwords PasswordReader
	Log       *slog.Logger
	// StateFile remembers which peers negotiated RFC 5549, so that after a
	// restart IPv4 routes go out in the first UPDATEs instead of after a
	// re-check (an End-of-RIB without them would flush them at a GR peer).
	StateFile string
	// OnChange is called from Run's goroutine, with no lock held, when
	// session state may have changed.
	OnChange func()
	// BFDPort is the BFD Control port listened on and sent to (default
	// 3784; tests running several speakers on one host set their own).
	BFDPort, BFDPeerPort int
	// Neighbours is the kernel's neighbour table for unnumbered peers
	// (relink.go); nil: the real one.
	Neighbours Neighbours
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
	passwords PasswordReader
	stateFile string
	onChange  func()
	neigh     Neighbours    // the kernel's neighbour table (unnumbered peers)
	wake      chan struct{} // coalesced: the desired peers changed, or Run should retry
	running   atomic.Bool

	// Paths (Set, Held).
	pathMu sync.Mutex
	held   map[netip.Prefix]advert.Kind
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
		log: log, asn: cfg.ASN, passwords: cfg.Passwords, stateFile: cfg.StateFile, onChange: cfg.OnChange,
		srv:  server.NewBgpServer(server.LoggerOption(slog.New(levelFilter{log.With("component", "gobgp").Handler(), lvl}), lvl)),
		wake: make(chan struct{}, 1),
		held: map[netip.Prefix]advert.Kind{},
		want: map[string]wantPeer{}, peers: map[string]*peer{}, knownGood: map[string]bool{},
	}
	if s.passwords == nil {
		s.passwords = FilePasswords
	}
	s.neigh = cfg.Neighbours
	if s.neigh == nil {
		s.neigh = kernelNeighbours{}
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

// levelFilter drops records below min. GoBGP does not filter by the
// LevelVar it is given (it only changes it on a SetLogLevel call), so
// without this GoBGP logged at the agent's level, debug included.
type levelFilter struct {
	slog.Handler
	min slog.Leveler
}

func (h levelFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min.Level() && h.Handler.Enabled(ctx, l)
}

// demoted are GoBGP warnings logged at info instead. A max-prefix trip
// makes GoBGP log "prefix limit reached" for every UPDATE over the limit
// (naming neither limit nor count), and each of those asks for the PFX_CT
// admin state again, which it reports as a request "still remaining" or a
// change "to the same state"; flock logs the trip once, with the limit and
// the count (maxPrefixTripLocked). flock itself never has two admin state
// requests for a peer outstanding (one EnablePeer after an admin-down add),
// so those two warnings only ever come from the repeats.
var demoted = map[string]bool{
	"prefix limit reached": true,
	"previous setting admin state request is still remaining": true,
	"cannot change to the same state":                         true,
}

// closedConn tells whether a record is GoBGP's "failed to send" on a
// connection it closed itself: its sender racing its own teardown (a
// NOTIFICATION it sent, max-prefix), not a network failure.
func closedConn(r slog.Record) bool {
	if r.Message != "failed to send" {
		return false
	}
	closed := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, net.ErrClosed) {
			closed = true
		}
		return !closed
	})
	return closed
}

// Handle logs the demoted GoBGP warnings at info.
func (h levelFilter) Handle(ctx context.Context, r slog.Record) error {
	if (demoted[r.Message] || closedConn(r)) && r.Level > slog.LevelInfo {
		r.Level = slog.LevelInfo
		if !h.Enabled(ctx, r.Level) {
			return nil
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h levelFilter) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFilter{h.Handler.WithAttrs(a), h.min}
}

func (h levelFilter) WithGroup(name string) slog.Handler {
	return levelFilter{h.Handler.WithGroup(name), h.min}
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
	if s.onChange != nil {
		s.onChange()
	}
}

// ApplyPeers records the configured peers; Run makes the sessions match:
// new ones are added, removed ones deleted, changed ones re-created,
// untouched sessions are left alone, and community changes only rebuild
// the export policy (no session reset). It may be called before Run
// starts. Passwords are read here: a peer whose password cannot be read
// keeps its running session (or is not added), and the error is returned.
func (s *Speaker) ApplyPeers(peers []v1alpha1.Peer) error {
	type read struct {
		spec v1alpha1.Peer
		pw   string
		err  error
	}
	reads := make([]read, 0, len(peers))
	for _, p := range peers {
		pw, err := s.passwords(p)
		reads = append(reads, read{p, pw, err})
	}
	var errs []error
	s.mu.Lock()
	want := make(map[string]wantPeer, len(peers))
	for _, r := range reads {
		key := Key(r.spec)
		old, had := s.want[key]
		if r.err != nil {
			errs = append(errs, r.err)
			if had {
				want[key] = old // keep the running session rather than break it
			}
			continue
		}
		w := wantPeer{spec: r.spec, password: r.pw, fp: sessionFingerprint(r.spec, r.pw), restarting: s.restarting}
		if had && old.fp == w.fp {
			w.restarting = old.restarting
		}
		want[key] = w
	}
	// Only the peers of the first ApplyPeers come up as GR "restarting".
	s.want, s.restarting = want, false
	s.mu.Unlock()
	s.kick()
	return errors.Join(errs...)
}

// syncPeers makes the peers match the desired ones and the export policy
// match the peers. Run's goroutine only.
func (s *Speaker) syncPeers(ctx context.Context, wg *sync.WaitGroup) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.peers))
	for k := range s.peers {
		keys = append(keys, k)
	}
	for _, key := range keys {
		p := s.peers[key]
		if w, ok := s.want[key]; ok && w.fp == p.fp {
			p.spec = w.spec // communities may differ
			continue
		}
		s.removePeerLocked(ctx, key, p)
	}
	for key, w := range s.want {
		p := s.peers[key]
		if p == nil {
			p = &peer{key: key, spec: w.spec, fp: w.fp, password: w.password, restarting: w.restarting, gone: make(chan struct{})}
			s.peers[key] = p
		}
		switch {
		case p.adding():
		case !p.added:
			s.startAddLocked(ctx, wg, p)
		case !p.enabled:
			// Added while an earlier Run was ending, or EnablePeer failed.
			s.enableLocked(ctx, wg, p)
		}
	}
	s.syncBFDLocked()
	return s.updateExportLocked(ctx, wg)
}

// readdLocked deletes an added peer from GoBGP for syncPeers to add it
// again (Run's next apply): a fresh FSM, nothing the peer sent kept, an
// unnumbered peer's address resolved anew. The agent has not restarted,
// and BFD waits for the next session. On a delete error the peer stays
// added (and is enabled again).
func (s *Speaker) readdLocked(ctx context.Context, key string, p *peer) error {
	var err error
	if p.added && p.apiAddr.IsValid() {
		if err = s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: p.apiAddr.String()}); err != nil {
			err = fmt.Errorf("delete peer %s: %w", key, err)
		} else {
			p.added = false
		}
	}
	p.enabled, p.restarting, p.bfdArmed = false, false, false
	s.kick()
	return err
}

// removePeerLocked deletes a peer, waiting for its add goroutine first.
func (s *Speaker) removePeerLocked(ctx context.Context, key string, p *peer) {
	if p.cancel != nil {
		p.cancel()
		s.mu.Unlock()
		<-p.done // the add goroutine takes s.mu too
		s.mu.Lock()
	}
	if p.added {
		// Delete by the address GoBGP keys the peer by (with its zone for
		// an unnumbered peer), never by Interface: GoBGP v4.8.0's
		// DeletePeer runs netip.MustParseAddr on Address, so an empty one
		// panics inside its server goroutine (the whole agent dies), and
		// with Interface set it re-resolves the link-local neighbour, which
		// fails once the neighbour is gone.
		addr := p.apiAddr
		if !addr.IsValid() {
			addr, _ = s.lookupPeer(ctx, p.spec)
		}
		if !addr.IsValid() && p.spec.Interface == "" {
			addr, _ = netip.ParseAddr(Key(p.spec))
		}
		if !addr.IsValid() {
			s.log.Warn("bgp: delete peer: no neighbour address", "peer", key)
		} else if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
			s.log.Warn("bgp: delete peer", "peer", key, "err", err)
		}
	}
	if p.gone != nil {
		close(p.gone)
	}
	delete(s.peers, key)
	s.log.Info("bgp: peer removed", "peer", key)
}

// startAddLocked starts the goroutine that adds a peer.
func (s *Speaker) startAddLocked(ctx context.Context, wg *sync.WaitGroup, p *peer) {
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	p.cancel, p.done = cancel, done
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		if s.addPeer(pctx, wg, p) {
			s.kick() // Run calls OnChange
		}
	}()
}

// addPeer adds one peer, retrying until it works or ctx ends (the peer is
// removed, or Run ends): an unnumbered peer needs its link-local address in
// the neighbour table, which an all-nodes ping fills. The peer is added
// admin-down and enabled once the export policy knows its address.
func (s *Speaker) addPeer(ctx context.Context, wg *sync.WaitGroup, p *peer) bool {
	// Everything used here is covered by the fingerprint, so it cannot
	// change under us (ApplyPeers changes only communities in place).
	s.mu.Lock()
	spec, password, restarting, key := p.spec, p.password, p.restarting, p.key
	s.mu.Unlock()
	backoff := minRetry
	for {
		err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: apiPeer(spec, password, true, restarting)})
		if err == nil {
			break
		}
		s.mu.Lock()
		p.lastErr = err.Error()
		s.mu.Unlock()
		if spec.Interface != "" && strings.Contains(err.Error(), "link-local") {
			if serr := SolicitNeighbors(spec.Interface); serr != nil {
				s.log.Debug("bgp: soliciting link-local neighbours", "interface", spec.Interface, "err", serr)
			}
		} else {
			s.log.Warn("bgp: add peer", "peer", key, "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxRetry)
	}
	// Even if ctx ended meanwhile: the address is needed to delete it.
	addr, local := s.lookupPeer(ctx, spec)
	s.mu.Lock()
	defer s.mu.Unlock()
	p.added, p.apiAddr, p.local, p.lastErr = true, addr, local, ""
	ipv4 := slices.Contains(Families(spec), "ipv4")
	p.ipv4OK = ipv4 && (!TransportV6(spec) || s.knownGood[key])
	if ctx.Err() != nil {
		// Removed while we were adding (removePeerLocked deletes it), or
		// Run ended (the next Run enables it).
		return false
	}
	s.enableLocked(ctx, wg, p)
	if p.maxPfx == "" { // else re-added after max-prefix, already logged
		s.log.Info("bgp: peer added", "peer", key, "address", addr, "asn", spec.ASN)
	}
	return true
}

// lookupPeer returns the address GoBGP keys a peer by (for an unnumbered
// peer: the resolved link-local address with its zone) and the session's
// local address without zone (invalid when unspecified).
func (s *Speaker) lookupPeer(ctx context.Context, spec v1alpha1.Peer) (addr, local netip.Addr) {
	// ListPeer returns nothing under a cancelled context.
	_ = s.srv.ListPeer(context.WithoutCancel(ctx), &api.ListPeerRequest{Address: listKey(spec)}, func(ap *api.Peer) {
		a := ap.GetState().GetNeighborAddress()
		if a == "" {
			a = ap.GetConf().GetNeighborAddress()
		}
		addr, _ = netip.ParseAddr(a)
		if l, err := netip.ParseAddr(ap.GetTransport().GetLocalAddress()); err == nil && !l.IsUnspecified() {
			local = l.WithZone("")
		}
	})
	return addr, local
}

func listKey(p v1alpha1.Peer) string {
	if p.Interface != "" {
		return p.Interface
	}
	return Key(p)
}

// enableLocked puts an added peer into the export policy, then enables its
// session, unless the peer waits out a max-prefix back-off (Run calls it
// again when that ends).
func (s *Speaker) enableLocked(ctx context.Context, wg *sync.WaitGroup, p *peer) {
	if p.held(time.Now()) {
		return
	}
	if !p.apiAddr.IsValid() {
		p.apiAddr, p.local = s.lookupPeer(ctx, p.spec)
	}
	if !p.apiAddr.IsValid() {
		// EnablePeer with no address would enable every peer.
		s.log.Error("bgp: enable peer: added but not listed", "peer", p.key)
		p.lastErr = "added to GoBGP but not listed by it"
		return
	}
	if err := s.updateExportLocked(ctx, wg); err != nil {
		// Enable anyway: the guard fails closed, and Run retries the
		// policy (a peer whose outcome then changes gets a soft reset).
		s.log.Error("bgp: export policy", "err", err)
		s.kick()
	}
	if err := s.srv.EnablePeer(ctx, &api.EnablePeerRequest{Address: p.apiAddr.String()}); err != nil {
		s.log.Error("bgp: enable peer", "peer", p.key, "err", err)
		p.lastErr = err.Error()
		return
	}
	p.enabled = true
}

func (s *Speaker) policyPeersLocked() []policyPeer {
	keys := make([]string, 0, len(s.peers))
	for k := range s.peers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]policyPeer, 0, len(keys))
	for _, k := range keys {
		p := s.peers[k]
		out = append(out, policyPeer{
			key: k, addr: p.apiAddr.WithZone(""), local: p.local, ipv4OK: p.ipv4OK,
			comms: p.spec.Communities, large: p.spec.LargeCommunities,
		})
	}
	return out
}

// updateExportLocked installs the export policy for the peers' current
// state (if it changed) and soft-resets every enabled peer whose outcome
// changed.
func (s *Speaker) updateExportLocked(ctx context.Context, wg *sync.WaitGroup) error {
	pol, err := s.installExport(ctx, s.policyPeersLocked())
	if err != nil || pol == nil {
		return err
	}
	for key, p := range s.peers {
		o, w := pol.outcome[key], pol.warning[key]
		if o != p.exported && p.enabled && p.apiAddr.IsValid() {
			s.softResetOut(ctx, wg, p.apiAddr, p.gone)
		}
		if w != "" && w != p.policyWarning {
			s.log.Warn("bgp: "+w, "peer", key)
		}
		p.exported, p.policyWarning, p.ipv4Held = o, w, pol.ipv4Held[key]
	}
	return nil
}

// softResetOut re-sends a peer its routes through the current export
// policy. GoBGP tells watchers a session is established a moment before it
// counts it as established itself, and a soft reset of a peer it does not
// yet count as established silently does nothing: so wait for GoBGP's own
// view first (briefly, in the background). A session that comes up later
// gets the current policy anyway. It gives up when ctx ends or the peer
// is gone.
func (s *Speaker) softResetOut(ctx context.Context, wg *sync.WaitGroup, addr netip.Addr, gone <-chan struct{}) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		req := &api.ResetPeerRequest{Address: addr.String(), Soft: true, Direction: api.ResetPeerRequest_DIRECTION_OUT}
		for range 100 {
			up := false
			_ = s.srv.ListPeer(ctx, &api.ListPeerRequest{Address: addr.String()}, func(p *api.Peer) {
				up = p.State != nil && p.State.SessionState == api.PeerState_SESSION_STATE_ESTABLISHED
			})
			if up {
				if err := s.srv.ResetPeer(ctx, req); err != nil {
					s.log.Warn("bgp: soft reset out", "peer", addr, "err", err)
				}
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-gone:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		s.log.Debug("bgp: soft reset out skipped: session not established", "peer", addr)
	}()
}

// peerForEventLocked finds the peer an event is about: by interface for an
// unnumbered peer, else by the full address GoBGP reports, zone included
// (two links may lead to the same link-local address).
func (s *Speaker) peerForEventLocked(ev *apiutil.WatchEventMessage_PeerEvent) (string, *peer) {
	if iface := ev.Peer.Conf.NeighborInterface; iface != "" {
		key := Key(v1alpha1.Peer{Interface: iface})
		return key, s.peers[key]
	}
	addr := ev.Peer.State.NeighborAddress
	if !addr.IsValid() {
		addr = ev.Peer.Conf.NeighborAddress
	}
	if !addr.IsValid() {
		return "", nil
	}
	if p := s.peers[addr.String()]; p != nil && p.spec.Interface == "" {
		return addr.String(), p
	}
	for k, p := range s.peers {
		if p.apiAddr == addr {
			return k, p
		}
	}
	return "", nil
}

func (s *Speaker) handlePeerEvent(ctx context.Context, wg *sync.WaitGroup, ev *apiutil.WatchEventMessage_PeerEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, p := s.peerForEventLocked(ev)
	if p == nil {
		return
	}
	st := ev.Peer.State.SessionState
	changed := st != p.state
	// An INIT event (a new Run's view of a running session) may follow a
	// flap Run did not see: decide the guard again.
	if !changed && ev.Type != apiutil.PEER_EVENT_INIT {
		return
	}
	wasUp, upSince := p.state == bgp.BGP_FSM_ESTABLISHED, p.since
	if changed {
		p.state, p.since = st, time.Now()
	}
	// A BFD reset in flight is settled by the session's end, whichever
	// way it ended (max-prefix below deletes the peer anyway).
	bfdReset := p.bfdReset && wasUp && changed
	if wasUp && changed {
		p.bfdReset = false
	}
	switch {
	case st == bgp.BGP_FSM_IDLE && ev.Peer.State.AdminState == api.PeerState_ADMIN_STATE_PFX_CT:
		// GoBGP tore the session down for max-prefix (an INIT event: while
		// an earlier Run was ending).
		s.maxPrefixTripLocked(ctx, key, p, wasUp, upSince)
	case st == bgp.BGP_FSM_ESTABLISHED:
		p.maxPfx = "" // up again: LastError no longer applies
		if !p.bfdArmed && p.spec.BFD.Enabled {
			s.syncBFDLocked() // arms it
		}
		if l := ev.Peer.Transport.LocalAddress; l.IsValid() && !l.IsUnspecified() {
			p.local = l.WithZone("")
		}
		ipv4 := slices.Contains(Families(p.spec), "ipv4")
		g := Decide(TransportV6(p.spec), ipv4, ev.Peer.State.RemoteCap)
		if changed || g != p.guard {
			s.log.Info("bgp: session established", "peer", key, "asn", p.spec.ASN)
			if g.Warning != "" {
				s.log.Warn("bgp: "+g.Warning, "peer", key)
			}
		}
		p.guard = g
		if TransportV6(p.spec) && ipv4 {
			p.ipv4OK = g.SendIPv4
			if s.knownGood[key] != g.SendIPv4 {
				s.knownGood[key] = g.SendIPv4
				s.saveStateLocked()
			}
		}
		if err := s.updateExportLocked(ctx, wg); err != nil {
			s.log.Error("bgp: rfc5549 guard", "peer", key, "err", err)
			s.kick()
		}
	case wasUp && changed:
		s.log.Warn("bgp: session down", "peer", key, "state", st.String(), "reason", ev.Peer.State.DisconnectReason.String(), "message", ev.Peer.State.DisconnectMessage)
		if bfdReset && ev.Peer.State.DisconnectMessage != adminResetSent {
			s.dropQueuedResetLocked(ctx, key, p)
		}
	}
}

type stateFile struct {
	RFC5549 map[string]bool `json:"rfc5549"`
}

func (s *Speaker) loadState() {
	if s.stateFile == "" {
		return
	}
	b, err := os.ReadFile(s.stateFile)
	if err != nil {
		return
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		s.log.Warn("bgp: ignoring unreadable state file", "file", s.stateFile, "err", err)
		return
	}
	for k, v := range st.RFC5549 {
		if v {
			s.knownGood[k] = true
		}
	}
}

func (s *Speaker) saveStateLocked() {
	if s.stateFile == "" {
		return
	}
	b, _ := json.Marshal(stateFile{RFC5549: s.knownGood})
	tmp := s.stateFile + ".tmp"
	if err := os.MkdirAll(filepath.Dir(s.stateFile), 0o700); err == nil {
		if err := os.WriteFile(tmp, b, 0o600); err == nil {
			_ = os.Rename(tmp, s.stateFile)
			return
		}
	}
	s.log.Warn("bgp: could not save state file", "file", s.stateFile)
}
