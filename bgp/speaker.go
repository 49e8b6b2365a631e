// Package bgp owns flock's embedded GoBGP speaker: its lifecycle, the peers
// from NodeConfig (added, removed and updated live), the export policy
// (RFC 5549 guard, per-peer communities per advertisement kind), the paths
// it originates (synced as a diff against a desired set) and the session
// state that flockctl and the metrics show.
package bgp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"code.fritzlab.net/fritzlab/flock/bgp/advert"
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
	// OnChange is called (from the speaker's goroutine) when session state
	// changes.
	OnChange func()
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

// Speaker is one embedded GoBGP server.
type Speaker struct {
	log       *slog.Logger
	srv       *server.BgpServer
	asn       uint32
	passwords PasswordReader
	stateFile string
	onChange  func()
	events    chan *apiutil.WatchEventMessage_PeerEvent
	ctx       context.Context

	applyMu    sync.Mutex // serialises ApplyPeers
	mu         sync.Mutex
	peers      map[string]*peer
	held       map[netip.Prefix]heldPath
	ipv4OK     map[string]bool // resolved addresses in the IPv4-ok set
	knownGood  map[string]bool // keys that negotiated RFC 5549 before
	policyGen  int
	policySets []*api.DefinedSet
	// restarting applies to the peers of the first ApplyPeers only.
	restarting bool
}

type heldPath struct {
	kind advert.Kind
	uuid uuid.UUID
}

type peer struct {
	spec     v1alpha1.Peer
	fp       string
	password string
	addr     string // resolved neighbour address, zone stripped
	apiAddr  string // the address GoBGP keys the peer by (may carry a zone)
	added    bool
	cancel   context.CancelFunc
	done     chan struct{}
	state    bgp.FSMState
	since    time.Time
	guard    Guard
	lastErr  string
	// restarting: added as GR "restarting" (the agent restarted).
	restarting bool
}

// New starts a GoBGP server with flock's global config and policies; peers
// are added by ApplyPeers. ctx bounds the speaker's background work.
func New(ctx context.Context, cfg Config) (*Speaker, error) {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	lvl := &slog.LevelVar{}
	lvl.Set(slog.LevelWarn) // GoBGP is chatty at info
	s := &Speaker{
		log: log, asn: cfg.ASN, passwords: cfg.Passwords, stateFile: cfg.StateFile, onChange: cfg.OnChange,
		srv:    server.NewBgpServer(server.LoggerOption(slog.New(levelFilter{log.With("component", "gobgp").Handler(), lvl}), lvl)),
		events: make(chan *apiutil.WatchEventMessage_PeerEvent, 256),
		ctx:    ctx,
		peers:  map[string]*peer{}, held: map[netip.Prefix]heldPath{}, ipv4OK: map[string]bool{}, knownGood: map[string]bool{},
	}
	if s.passwords == nil {
		s.passwords = FilePasswords
	}
	go s.srv.Serve()
	port := cfg.BGP.ListenPort
	if port == 0 {
		port = 179
	}
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: cfg.ASN, RouterId: cfg.RouterID, ListenPort: port}}); err != nil {
		s.srv.Stop()
		return nil, fmt.Errorf("bgp: start: %w", err)
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
		s.srv.Stop()
		return nil, fmt.Errorf("bgp: import policy: %w", err)
	}
	if err := s.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_IMPORT,
		Policies: []*api.Policy{{Name: "flock-import"}}, DefaultAction: importDefault,
	}}); err != nil {
		s.srv.Stop()
		return nil, fmt.Errorf("bgp: import policy: %w", err)
	}
	s.restarting = cfg.Restarting()
	s.loadState()
	s.saveStateLocked() // marks the node as having run a speaker
	if err := s.installBaseSets(ctx); err != nil {
		s.srv.Stop()
		return nil, err
	}
	if err := s.installExport(ctx, nil); err != nil {
		s.srv.Stop()
		return nil, err
	}
	if err := s.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
			if ev.Type == apiutil.PEER_EVENT_STATE {
				select {
				case s.events <- ev:
				default:
					s.log.Warn("bgp: peer event queue full; state will catch up at the next event")
				}
			}
		},
	}, server.WatchPeer()); err != nil {
		s.srv.Stop()
		return nil, fmt.Errorf("bgp: watch: %w", err)
	}
	go s.eventLoop()
	return s, nil
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

func (h levelFilter) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFilter{h.Handler.WithAttrs(a), h.min}
}

func (h levelFilter) WithGroup(name string) slog.Handler {
	return levelFilter{h.Handler.WithGroup(name), h.min}
}

// Stop shuts the server down, sending Cease to every peer (which withdraws
// our routes there). The agent does not call it on a restart: it just exits,
// and graceful restart keeps the routes at the ToR.
func (s *Speaker) Stop() { s.srv.Stop() }

// ApplyPeers makes the configured peers match: new ones are added, removed
// ones deleted, changed ones re-created; untouched sessions are left alone.
// Community changes only rebuild the export policy (no session reset).
func (s *Speaker) ApplyPeers(peers []v1alpha1.Peer) error {
	want := map[string]v1alpha1.Peer{}
	for _, p := range peers {
		want[Key(p)] = p
	}
	var errs []error
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.mu.Lock()
	for key, p := range s.peers {
		np, keep := want[key]
		if keep {
			pw, err := s.passwords(np)
			if err != nil {
				errs = append(errs, err)
				continue // keep the running session rather than break it
			}
			if sessionFingerprint(np, pw) == p.fp {
				p.spec = np // communities may differ
				continue
			}
		}
		s.removePeerLocked(key, p)
	}
	for key, np := range want {
		if _, ok := s.peers[key]; ok {
			continue
		}
		pw, err := s.passwords(np)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ctx, cancel := context.WithCancel(s.ctx)
		p := &peer{spec: np, fp: sessionFingerprint(np, pw), password: pw, cancel: cancel, done: make(chan struct{}), restarting: s.restarting}
		s.peers[key] = p
		go s.addPeer(ctx, key, p)
	}
	s.restarting = false
	if err := s.installExport(s.ctx, s.policyPeersLocked()); err != nil {
		errs = append(errs, err)
	}
	s.softResetOutLocked()
	s.mu.Unlock()
	s.notify()
	return errors.Join(errs...)
}

func (s *Speaker) removePeerLocked(key string, p *peer) {
	p.cancel()
	s.mu.Unlock()
	<-p.done // the add goroutine takes s.mu too
	s.mu.Lock()
	if p.added {
		// Delete by the address GoBGP keys the peer by (with its zone for
		// an unnumbered peer), never by Interface: GoBGP v4.8.0's
		// DeletePeer runs netip.MustParseAddr on Address, so an empty one
		// panics inside its server goroutine (the whole agent dies), and
		// with Interface set it re-resolves the link-local neighbour, which
		// fails once the neighbour is gone.
		addr := p.apiAddr
		if addr == "" && p.spec.Interface == "" {
			addr = Key(p.spec)
		}
		if _, err := netip.ParseAddr(addr); err != nil {
			s.log.Warn("bgp: delete peer: no neighbour address", "peer", key, "address", addr)
		} else if err := s.srv.DeletePeer(s.ctx, &api.DeletePeerRequest{Address: addr}); err != nil {
			s.log.Warn("bgp: delete peer", "peer", key, "err", err)
		}
	}
	if s.ipv4OK[p.addr] {
		_ = s.setIPv4OK(s.ctx, p.addr, false)
		delete(s.ipv4OK, p.addr)
	}
	delete(s.peers, key)
	s.log.Info("bgp: peer removed", "peer", key)
}

// addPeer adds one peer, retrying until it works or the peer is removed:
// an unnumbered peer needs its link-local address in the neighbour table,
// which an all-nodes ping fills.
func (s *Speaker) addPeer(ctx context.Context, key string, p *peer) {
	defer close(p.done)
	// ApplyPeers replaces p.spec under s.mu when only communities change;
	// what this goroutine uses cannot change that way, so read it once.
	s.mu.Lock()
	spec := p.spec
	s.mu.Unlock()
	backoff := 100 * time.Millisecond
	for {
		err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: apiPeer(spec, p.password, true, p.restarting)})
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
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	var apiAddr string
	// s.ctx, not ctx: if the peer is being removed right now, its address
	// is still needed to delete it (ListPeer returns nothing once its
	// context is cancelled).
	_ = s.srv.ListPeer(s.ctx, &api.ListPeerRequest{Address: listKey(spec)}, func(ap *api.Peer) {
		if ap.State != nil && ap.State.NeighborAddress != "" {
			apiAddr = ap.State.NeighborAddress
		} else if ap.Conf != nil {
			apiAddr = ap.Conf.NeighborAddress
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		// Removed while we were adding: removePeerLocked deletes it.
		p.added, p.apiAddr = true, apiAddr
		return
	}
	p.added, p.apiAddr, p.lastErr = true, apiAddr, ""
	if a, err := netip.ParseAddr(apiAddr); err == nil {
		p.addr = a.WithZone("").String()
	}
	ipv4 := slices.Contains(Families(p.spec), "ipv4")
	if ipv4 && (!TransportV6(p.spec) || s.knownGood[key]) && p.addr != "" {
		if err := s.setIPv4OK(s.ctx, p.addr, true); err == nil {
			s.ipv4OK[p.addr] = true
		}
	}
	if err := s.installExport(s.ctx, s.policyPeersLocked()); err != nil {
		s.log.Error("bgp: export policy", "err", err)
	}
	if apiAddr == "" {
		// EnablePeer with no address would enable every peer.
		s.log.Error("bgp: enable peer: added but not listed", "peer", key)
		p.lastErr = "added to GoBGP but not listed by it"
	} else if err := s.srv.EnablePeer(s.ctx, &api.EnablePeerRequest{Address: apiAddr}); err != nil {
		s.log.Error("bgp: enable peer", "peer", key, "err", err)
		p.lastErr = err.Error()
	}
	s.log.Info("bgp: peer added", "peer", key, "address", apiAddr, "asn", p.spec.ASN)
}

func listKey(p v1alpha1.Peer) string {
	if p.Interface != "" {
		return p.Interface
	}
	return Key(p)
}

func (s *Speaker) policyPeersLocked() []policyPeer {
	keys := make([]string, 0, len(s.peers))
	for k := range s.peers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []policyPeer
	for _, k := range keys {
		p := s.peers[k]
		out = append(out, policyPeer{addr: p.addr, spec: p.spec})
	}
	return out
}

// softResetOutLocked re-sends every established peer its routes through
// the current export policy.
func (s *Speaker) softResetOutLocked() {
	for _, p := range s.peers {
		if p.state == bgp.BGP_FSM_ESTABLISHED && p.apiAddr != "" {
			s.softResetOut(p.apiAddr)
		}
	}
}

// softResetOut re-sends a peer its routes through the current export
// policy. GoBGP tells watchers a session is established a moment before it
// counts it as established itself, and a soft reset of a peer it does not
// yet count as established silently does nothing: so wait for GoBGP's own
// view first (briefly, in the background).
func (s *Speaker) softResetOut(addr string) {
	go func() {
		req := &api.ResetPeerRequest{Address: addr, Soft: true, Direction: api.ResetPeerRequest_DIRECTION_OUT}
		for range 100 {
			up := false
			_ = s.srv.ListPeer(s.ctx, &api.ListPeerRequest{Address: addr}, func(p *api.Peer) {
				up = p.State != nil && p.State.SessionState == api.PeerState_SESSION_STATE_ESTABLISHED
			})
			if up {
				if err := s.srv.ResetPeer(s.ctx, req); err != nil {
					s.log.Warn("bgp: soft reset out", "peer", addr, "err", err)
				}
				return
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		s.log.Debug("bgp: soft reset out skipped: session not established", "peer", addr)
	}()
}

func (s *Speaker) eventLoop() {
	for {
		select {
		case <-s.ctx.Done():
			return
		case ev := <-s.events:
			s.handlePeerEvent(ev)
			s.notify()
		}
	}
}

func (s *Speaker) notify() {
	if s.onChange != nil {
		s.onChange()
	}
}

func (s *Speaker) handlePeerEvent(ev *apiutil.WatchEventMessage_PeerEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var key string
	var p *peer
	if iface := ev.Peer.Conf.NeighborInterface; iface != "" {
		key = "interface " + iface
		p = s.peers[key]
	} else {
		addr := ev.Peer.State.NeighborAddress
		if !addr.IsValid() {
			addr = ev.Peer.Conf.NeighborAddress
		}
		key = addr.WithZone("").String()
		p = s.peers[key]
		if p == nil { // an unnumbered peer reported by its address
			for k, q := range s.peers {
				if q.addr == key {
					key, p = k, q
				}
			}
		}
	}
	if p == nil {
		return
	}
	st := ev.Peer.State.SessionState
	if st == p.state {
		return
	}
	wasUp := p.state == bgp.BGP_FSM_ESTABLISHED
	p.state, p.since = st, time.Now()
	ipv4 := slices.Contains(Families(p.spec), "ipv4")
	switch {
	case st == bgp.BGP_FSM_ESTABLISHED:
		g := Decide(TransportV6(p.spec), ipv4, ev.Peer.State.RemoteCap)
		p.guard = g
		s.log.Info("bgp: session established", "peer", key, "asn", p.spec.ASN)
		if g.Warning != "" {
			s.log.Warn("bgp: "+g.Warning, "peer", key)
		}
		if TransportV6(p.spec) && ipv4 && p.addr != "" {
			changed := s.ipv4OK[p.addr] != g.SendIPv4
			if changed {
				if err := s.setIPv4OK(s.ctx, p.addr, g.SendIPv4); err != nil {
					s.log.Error("bgp: rfc5549 guard", "peer", key, "err", err)
				}
				if g.SendIPv4 {
					s.ipv4OK[p.addr] = true
				} else {
					delete(s.ipv4OK, p.addr)
				}
				s.softResetOut(p.apiAddr)
			}
			if s.knownGood[key] != g.SendIPv4 {
				s.knownGood[key] = g.SendIPv4
				s.saveStateLocked()
			}
		}
	case wasUp:
		s.log.Warn("bgp: session down", "peer", key, "state", st.String(), "reason", ev.Peer.State.DisconnectReason.String(), "message", ev.Peer.State.DisconnectMessage)
	}
}

// Sync applies changes (prefix → desired kind, "" = withdraw) to what the
// speaker originates, sending only real differences.
func (s *Speaker) Sync(changes map[netip.Prefix]advert.Kind) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := make(map[netip.Prefix]advert.Kind, len(changes))
	for p := range changes {
		if h, ok := s.held[p]; ok {
			held[p] = h.kind
		}
	}
	announce, withdraw := advert.Diff(changes, held)
	return s.applyLocked(announce, withdraw)
}

// Resync compares the full desired state with everything held (the safety
// net behind the event-driven Sync).
func (s *Speaker) Resync(desired map[netip.Prefix]advert.Kind) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := make(map[netip.Prefix]advert.Kind, len(s.held))
	for p, h := range s.held {
		held[p] = h.kind
	}
	announce, withdraw := advert.Diff(desired, held)
	return s.applyLocked(announce, withdraw)
}

func (s *Speaker) applyLocked(announce map[netip.Prefix]advert.Kind, withdraw []netip.Prefix) error {
	var errs []error
	if len(withdraw) > 0 {
		ids := make([]uuid.UUID, 0, len(withdraw))
		for _, p := range withdraw {
			ids = append(ids, s.held[p].uuid)
		}
		if err := s.srv.DeletePath(apiutil.DeletePathRequest{UUIDs: ids}); err != nil {
			// One unknown UUID fails the whole batch: withdraw the paths one
			// by one, by NLRI, so a stale entry cannot block the others
			// (and is not retried forever).
			for _, p := range withdraw {
				path, perr := s.path(p, s.held[p].kind)
				if perr == nil {
					perr = s.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{path}})
				}
				if perr != nil {
					s.log.Warn("bgp: withdraw", "prefix", p, "err", perr)
				}
				delete(s.held, p)
			}
		} else {
			for _, p := range withdraw {
				delete(s.held, p)
			}
		}
	}
	if len(announce) > 0 {
		prefixes := make([]netip.Prefix, 0, len(announce))
		paths := make([]*apiutil.Path, 0, len(announce))
		for p, k := range announce {
			path, err := s.path(p, k)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			prefixes = append(prefixes, p)
			paths = append(paths, path)
		}
		resp, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: paths})
		if err != nil {
			errs = append(errs, fmt.Errorf("bgp: announce %d paths: %w", len(paths), err))
		}
		for i, r := range resp {
			if i >= len(prefixes) {
				break
			}
			if r.Error != nil {
				errs = append(errs, fmt.Errorf("bgp: announce %s: %w", prefixes[i], r.Error))
				continue
			}
			s.held[prefixes[i]] = heldPath{kind: announce[prefixes[i]], uuid: r.UUID}
		}
	}
	return errors.Join(errs...)
}

// path builds a locally originated path with next-hop-self.
func (s *Speaker) path(p netip.Prefix, k advert.Kind) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(p)
	if err != nil {
		return nil, fmt.Errorf("bgp: %s: %w", p, err)
	}
	lc, err := bgp.ParseLargeCommunity(marker(s.asn, k))
	if err != nil {
		return nil, err
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(0), bgp.NewPathAttributeLargeCommunities([]*bgp.LargeCommunity{lc})}
	fam := bgp.RF_IPv4_UC
	if p.Addr().Is4() {
		nh, err := bgp.NewPathAttributeNextHop(netip.IPv4Unspecified())
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, nh)
	} else {
		fam = bgp.RF_IPv6_UC
		mp, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, mp)
	}
	return &apiutil.Path{Family: fam, Nlri: nlri, Attrs: attrs}, nil
}

// Held returns what the speaker originates (prefix → kind).
func (s *Speaker) Held() map[netip.Prefix]advert.Kind {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[netip.Prefix]advert.Kind, len(s.held))
	for p, h := range s.held {
		out[p] = h.kind
	}
	return out
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
