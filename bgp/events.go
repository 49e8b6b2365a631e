package bgp

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

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

// stateFile is bgp-state.json. Format 1 (absent in files written before
// it was stamped); a newer format is ignored with a warning: it only
// saves a re-check of RFC 5549 after a restart.
type stateFile struct {
	Format  int             `json:"format,omitempty"`
	RFC5549 map[string]bool `json:"rfc5549"`
}

// stateFormat is the format of bgp-state.json this speaker writes.
const stateFormat = 1

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
	if st.Format > stateFormat {
		s.log.Warn("bgp: ignoring a state file of a newer format (RFC 5549 peers are checked again)", "file", s.stateFile, "format", st.Format, "reads", stateFormat)
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
	b, _ := json.Marshal(stateFile{Format: stateFormat, RFC5549: s.knownGood})
	tmp := s.stateFile + ".tmp"
	if err := os.MkdirAll(filepath.Dir(s.stateFile), 0o700); err == nil {
		if err := os.WriteFile(tmp, b, 0o600); err == nil {
			_ = os.Rename(tmp, s.stateFile)
			return
		}
	}
	s.log.Warn("bgp: could not save state file", "file", s.stateFile)
}
