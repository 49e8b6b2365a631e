package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v4/api"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

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
		pw, err := s.password(p)
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
	if err == nil {
		p.bfdReset = false // a queued reset went with the peer
	}
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
		added := s.addPeer(pctx, wg, p)
		// done first: a kick seen by syncPeers must find the add over,
		// or a peer dropped meanwhile (a lost carrier) is skipped as still
		// adding and never added again.
		close(done)
		if added {
			s.kick() // Run signals Changed
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
		var up <-chan struct{} // an unnumbered peer's link back: try at once
		if spec.Interface != "" {
			up = s.linkUp.wait() // before the try, so a carrier back during it counts
			if s.carrierLost(spec.Interface) {
				// Nobody to resolve: the old ToR's address, still in the
				// neighbour table, would be, and dialled.
				select {
				case <-ctx.Done():
					return false
				case <-up:
					backoff = minRetry
				}
				continue
			}
		}
		err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: apiPeer(spec, password, true, restarting)})
		if err == nil {
			break
		}
		s.mu.Lock()
		p.lastErr = err.Error()
		s.mu.Unlock()
		if spec.Interface != "" && strings.Contains(err.Error(), "link-local") {
			s.log.Debug("bgp: unnumbered peer not resolved yet", "peer", key, "err", err, "retry", backoff)
			// GoBGP counts a neighbour still being resolved as one on the
			// link: the old ToR's, probed until it fails, hides the new.
			s.forgetFailed(spec.Interface)
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
			backoff = min(backoff*2, maxRetry)
		case <-up:
			backoff = minRetry
		}
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
