package bgp

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgpmetrics "github.com/osrg/gobgp/v4/pkg/metrics"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus"

	"code.fritzlab.net/fritzlab/flock/bgp/session"
)

// The status types live in bgp/session (no GoBGP in them: flockctl and
// the admin API use them as they are); these names keep the speaker's
// code short.
type (
	FamilyCounts = session.FamilyCounts
	SessionState = session.State
	Neighbor     = session.Neighbor
	BFDDetail    = session.BFDDetail
)

// Session states.
const (
	Configuring = session.Configuring
	Resolving   = session.Resolving
	Idle        = session.Idle
	Connect     = session.Connect
	Active      = session.Active
	OpenSent    = session.OpenSent
	OpenConfirm = session.OpenConfirm
	Established = session.Established
)

func sessionState(st bgp.FSMState) SessionState {
	switch st {
	case bgp.BGP_FSM_IDLE:
		return Idle
	case bgp.BGP_FSM_CONNECT:
		return Connect
	case bgp.BGP_FSM_ACTIVE:
		return Active
	case bgp.BGP_FSM_OPENSENT:
		return OpenSent
	case bgp.BGP_FSM_OPENCONFIRM:
		return OpenConfirm
	case bgp.BGP_FSM_ESTABLISHED:
		return Established
	}
	return SessionState(st.String())
}

// Neighbors lists every configured peer with live state from GoBGP: the
// one source of per-peer status.
func (s *Speaker) Neighbors(ctx context.Context) []Neighbor {
	byAddr := map[netip.Addr]*api.Peer{} // full address, zone included
	byIface := map[string]*api.Peer{}
	_ = s.srv.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		if p.Conf == nil {
			return
		}
		if p.Conf.NeighborInterface != "" {
			byIface[p.Conf.NeighborInterface] = p
			return
		}
		a := p.GetState().GetNeighborAddress()
		if a == "" {
			a = p.Conf.NeighborAddress
		}
		if addr, err := netip.ParseAddr(a); err == nil {
			byAddr[addr] = p
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Neighbor, 0, len(s.want))
	for key, p := range s.peers {
		if _, ok := s.want[key]; ok {
			out = append(out, s.neighborLocked(key, p, byAddr, byIface))
		}
	}
	// Desired peers Run has not taken on yet.
	for key, w := range s.want {
		if _, ok := s.peers[key]; !ok {
			out = append(out, s.neighborLocked(key, &peer{key: key, spec: w.spec}, nil, nil))
		}
	}
	slices.SortFunc(out, func(a, b Neighbor) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}

func (s *Speaker) neighborLocked(key string, p *peer, byAddr map[netip.Addr]*api.Peer, byIface map[string]*api.Peer) Neighbor {
	n := Neighbor{Peer: key, LocalASN: s.asn, PeerASN: p.spec.ASN, State: Idle, LastError: p.lastErr}
	if m := p.maxPrefixStatus(time.Now()); m != "" {
		n.LastError = strings.TrimSuffix(m+"; "+p.lastErr, "; ")
	}
	if p.apiAddr.IsValid() {
		n.Address = p.apiAddr.WithZone("").String()
	}
	if !p.added && p.maxPfx == "" { // else being re-added after max-prefix: Idle
		n.State = Configuring
		if p.spec.Interface != "" {
			n.State = Resolving
		}
	}
	if p.state != 0 {
		n.State = sessionState(p.state)
		n.Since = p.since
		if p.state == bgp.BGP_FSM_ESTABLISHED {
			n.Uptime = session.Duration(max(time.Since(p.since).Round(time.Second), time.Second))
		}
	}
	var lp *api.Peer
	if p.spec.Interface != "" {
		lp = byIface[p.spec.Interface]
	} else if p.apiAddr.IsValid() {
		lp = byAddr[p.apiAddr]
	} else if a, err := netip.ParseAddr(key); err == nil {
		lp = byAddr[a]
	}
	counts := map[string]*FamilyCounts{}
	for _, f := range Families(p.spec) {
		counts[f] = &FamilyCounts{Family: f}
	}
	n.BFD, n.GR = "off", "off"
	if p.spec.BFD.Enabled {
		n.BFD = "down"
	}
	if !p.spec.GracefulRestart.Disabled {
		n.GR = "on"
	}
	if lp != nil {
		for _, af := range lp.AfiSafis {
			if af.State == nil || af.State.Family == nil {
				continue
			}
			name := "ipv6"
			if af.State.Family.Afi == api.Family_AFI_IP {
				name = "ipv4"
			}
			if c := counts[name]; c != nil {
				c.Received, c.Accepted, c.Advertised = af.State.Received, af.State.Accepted, af.State.Advertised
			}
		}
		if !p.spec.GracefulRestart.Disabled && lp.State != nil {
			n.GR = grState(lp)
		}
	}
	if p.spec.BFD.Enabled {
		if st, ok := s.bfd.Status(key); ok {
			n.BFD = st.State.String()
			d := &BFDDetail{State: n.BFD, Since: st.Since, RemoteState: st.RemoteState.String(), RemoteCBit: st.RemoteControlPlaneIndependent, Failures: p.bfdFailures, PlannedDowns: p.bfdPlanned,
				SocketFailures: st.SocketFailures, SocketError: st.SocketError}
			if st.Diag != 0 {
				d.Diag = st.Diag.String()
			}
			n.BFDDetail = d
		}
	}
	for _, f := range Families(p.spec) {
		n.Families = append(n.Families, *counts[f])
	}
	if p.state == bgp.BGP_FSM_ESTABLISHED {
		if p.guard.Warning != "" {
			n.Warnings = append(n.Warnings, p.guard.Warning)
			n.RFC5549Mismatch = true
		}
		n.RFC5549Mismatch = n.RFC5549Mismatch || p.ipv4Held
	}
	if p.policyWarning != "" {
		n.Warnings = append(n.Warnings, p.policyWarning)
	}
	return n
}

// grState: "on" (configured), "negotiated" (the peer offered GR too), with
// the peer's restart time when known.
func grState(lp *api.Peer) string {
	caps, err := apiutil.UnmarshalCapabilities(lp.State.RemoteCap)
	if err != nil {
		return "on"
	}
	for _, c := range caps {
		if gr, ok := c.(*bgp.CapGracefulRestart); ok {
			return "negotiated (peer restart " + (time.Duration(gr.Time) * time.Second).String() + ")"
		}
	}
	return "on"
}

// Collector is GoBGP's own Prometheus collector for this server.
func (s *Speaker) Collector() prometheus.Collector { return gobgpmetrics.NewBgpCollector(s.srv) }
