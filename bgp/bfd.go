package bgp

import (
	"context"
	"net/netip"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"code.fritzlab.net/fritzlab/flock/bgp/bfd"
)

// BFD: flock runs its own single-hop BFD (package bfd) instead of GoBGP's,
// a session per peer with BFD enabled. A failure (detection time expired,
// or the remote signalled Down) resets the BGP session at once; a remote
// AdminDown is a planned stop (RFC 5882 §3.2) and resets nothing. BFD
// settings change live: they are not part of the session fingerprint.

// bfdBackoff paces retries when the BFD port cannot be opened.
const bfdBackoff = 2 * time.Second

// startBFDLocked runs the BFD manager for the speaker's lifetime once a
// peer wants BFD (a speaker without BFD peers opens no port).
func (s *Speaker) startBFDLocked() {
	if s.bfdStarted {
		return
	}
	s.bfdStarted = true
	go func() {
		for {
			err := s.bfd.Run(s.bfdCtx)
			if s.bfdCtx.Err() != nil {
				return
			}
			s.log.Error("bfd: cannot listen; sessions stay down, retrying", "err", err, "in", bfdBackoff)
			select {
			case <-s.bfdCtx.Done():
				return
			case <-time.After(bfdBackoff):
			}
		}
	}()
}

// bfdConfig is a peer's BFD timing (defaults: 300 ms × 3).
func bfdConfig(b int, mult uint32) bfd.Config {
	iv := time.Duration(b) * time.Millisecond
	if b <= 0 {
		iv = DefaultBFDInterval * time.Millisecond
	}
	m := uint8(DefaultBFDMult)
	if mult > 0 && mult <= 255 {
		m = uint8(mult)
	}
	return bfd.Config{DesiredMinTx: iv, RequiredMinRx: iv, DetectMult: m}
}

// syncBFDLocked makes the BFD sessions match the peers: one per added
// peer with BFD enabled whose BGP session has been established (so our
// first packets never reach a ToR before its own BFD session exists: FRR
// 8.4 creates it with the BGP session and then acted on our older, queued
// Down packets, taking a just-Up session down once), to the address GoBGP resolved (for an unnumbered
// peer the link-local address and its interface, so a replaced neighbour
// gets a new session), from the configured local address.
func (s *Speaker) syncBFDLocked() {
	var want []bfd.Peer
	for key, p := range s.peers {
		if p.state == bgp.BGP_FSM_ESTABLISHED {
			p.bfdArmed = true
		}
		if !p.spec.BFD.Enabled || !p.apiAddr.IsValid() || !p.bfdArmed {
			continue
		}
		remote := p.apiAddr
		if p.spec.Interface != "" && remote.Is6() && remote.IsLinkLocalUnicast() && remote.Zone() == "" {
			remote = remote.WithZone(p.spec.Interface)
		}
		local, _ := netip.ParseAddr(p.spec.LocalAddress)
		want = append(want, bfd.Peer{Key: key, Remote: remote, Local: local, Config: bfdConfig(int(p.spec.BFD.IntervalMs), p.spec.BFD.Multiplier)})
	}
	if len(want) > 0 {
		s.startBFDLocked()
	}
	s.bfd.Set(want)
}

// onBFD receives the manager's events (from a session goroutine) for Run.
func (s *Speaker) onBFD(e bfd.Event) {
	select {
	case s.bfdEvents <- e:
	default:
		s.log.Warn("bfd: event queue full; dropped", "peer", e.Key, "to", e.To)
	}
}

// handleBFDEvent resets the BGP session of a peer whose BFD failed.
// Run's goroutine.
func (s *Speaker) handleBFDEvent(ctx context.Context, e bfd.Event) {
	s.mu.Lock()
	p := s.peers[e.Key]
	if p == nil || e.From != bfd.Up || e.To != bfd.Down {
		s.mu.Unlock()
		return
	}
	if e.RemoteState == bfd.AdminDown {
		p.bfdPlanned++
		s.mu.Unlock()
		s.log.Info("bfd: peer stopped BFD on purpose (AdminDown); BGP session left to itself", "peer", e.Key)
		return
	}
	p.bfdFailures++
	addr := p.apiAddr
	if p.state != bgp.BGP_FSM_ESTABLISHED || !addr.IsValid() {
		// No session to tear down; a reset now would be queued by GoBGP
		// and end the next session as soon as it is established.
		s.mu.Unlock()
		s.log.Warn("bfd: session failed (BGP not established)", "peer", e.Key, "diag", e.Diag.String())
		return
	}
	p.bfdReset = true
	s.mu.Unlock()
	s.log.Warn("bfd: session failed; resetting the BGP session", "peer", e.Key, "diag", e.Diag.String())
	if err := s.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: addr.String(), Communication: "BFD down: " + e.Diag.String()}); err != nil {
		s.log.Warn("bfd: reset BGP session", "peer", e.Key, "err", err)
		s.mu.Lock()
		p.bfdReset = false // nothing was queued
		s.mu.Unlock()
	}
}

// adminResetSent is GoBGP's disconnect message once our ResetPeer's
// NOTIFICATION went out.
var adminResetSent = "notification-sent " + bgp.NewNotificationErrorCode(bgp.BGP_ERROR_CEASE, bgp.BGP_ERROR_SUB_ADMINISTRATIVE_RESET).String()

// dropQueuedResetLocked: the session ended before GoBGP sent our reset's
// NOTIFICATION, which it keeps for the next session. Deleting the peer
// drops it; syncPeers adds the peer again at once (the session is down
// already, so nothing is lost).
func (s *Speaker) dropQueuedResetLocked(ctx context.Context, key string, p *peer) {
	s.log.Info("bfd: the BGP session ended before our reset; re-adding the peer so the reset does not end the next session", "peer", key)
	if err := s.readdLocked(ctx, key, p); err != nil {
		s.log.Warn("bfd: re-add peer", "peer", key, "err", err)
	}
}

// ShutdownBFD tells every BFD peer that the sessions go down on purpose
// (AdminDown, spread over d) and stops them: the agent calls it on a
// planned stop, before exiting, so a ToR that honours RFC 5882 §3.2 does
// not take the stop for a failure.
func (s *Speaker) ShutdownBFD(d time.Duration) {
	s.bfd.Shutdown(d)
}
