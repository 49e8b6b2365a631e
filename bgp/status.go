package bgp

import (
	"context"
	"slices"
	"strings"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgpmetrics "github.com/osrg/gobgp/v4/pkg/metrics"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus"
)

// FamilyCounts are per-family prefix counters.
type FamilyCounts struct {
	Family     string `json:"family"`
	Received   uint64 `json:"received"`
	Accepted   uint64 `json:"accepted"`
	Advertised uint64 `json:"advertised"`
}

// Neighbor is one session as an operator sees it.
type Neighbor struct {
	Peer      string         `json:"peer"`              // configured address or "interface X"
	Address   string         `json:"address,omitempty"` // resolved neighbour address
	LocalASN  uint32         `json:"localASN"`
	PeerASN   uint32         `json:"peerASN"`
	State     string         `json:"state"`
	Since     time.Time      `json:"since,omitzero"` // last state change
	Uptime    time.Duration  `json:"uptime"`         // while established
	Families  []FamilyCounts `json:"families"`
	BFD       string         `json:"bfd"`
	GR        string         `json:"gracefulRestart"`
	Warnings  []string       `json:"warnings,omitempty"`
	LastError string         `json:"lastError,omitempty"`
}

// Neighbors lists every configured peer with live state from GoBGP.
func (s *Speaker) Neighbors(ctx context.Context) []Neighbor {
	live := map[string]*api.Peer{}
	_ = s.srv.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		if p.Conf == nil {
			return
		}
		if p.Conf.NeighborInterface != "" {
			live["interface "+p.Conf.NeighborInterface] = p
			return
		}
		live[strings.Split(p.Conf.NeighborAddress, "%")[0]] = p
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Neighbor, 0, len(s.peers))
	for key, p := range s.peers {
		n := Neighbor{Peer: key, Address: p.addr, LocalASN: s.asn, PeerASN: p.spec.ASN, State: "Idle", LastError: p.lastErr}
		if !p.added {
			n.State = "Configuring"
			if p.spec.Interface != "" {
				n.State = "Resolving"
			}
		}
		if p.state != 0 {
			n.State = stateName(p.state)
			n.Since = p.since
			if p.state == bgp.BGP_FSM_ESTABLISHED {
				n.Uptime = max(time.Since(p.since).Round(time.Second), time.Second)
			}
		}
		lp := live[key]
		if lp == nil && p.addr != "" {
			lp = live[p.addr]
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
			if p.spec.BFD.Enabled && lp.State != nil && lp.State.BfdState != nil {
				n.BFD = bfdName(lp.State.BfdState.SessionState)
			}
			if !p.spec.GracefulRestart.Disabled && lp.State != nil {
				n.GR = grState(lp)
			}
		}
		for _, f := range Families(p.spec) {
			n.Families = append(n.Families, *counts[f])
		}
		if p.state == bgp.BGP_FSM_ESTABLISHED && p.guard.Warning != "" {
			n.Warnings = append(n.Warnings, p.guard.Warning)
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b Neighbor) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}

func stateName(st bgp.FSMState) string {
	switch st {
	case bgp.BGP_FSM_IDLE:
		return "Idle"
	case bgp.BGP_FSM_CONNECT:
		return "Connect"
	case bgp.BGP_FSM_ACTIVE:
		return "Active"
	case bgp.BGP_FSM_OPENSENT:
		return "OpenSent"
	case bgp.BGP_FSM_OPENCONFIRM:
		return "OpenConfirm"
	case bgp.BGP_FSM_ESTABLISHED:
		return "Established"
	}
	return st.String()
}

func bfdName(st api.BfdSessionState) string {
	switch st {
	case api.BfdSessionState_BFD_SESSION_STATE_UP:
		return "up"
	case api.BfdSessionState_BFD_SESSION_STATE_INIT:
		return "init"
	case api.BfdSessionState_BFD_SESSION_STATE_ADMIN_DOWN:
		return "admin-down"
	}
	return "down"
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

// Established counts established sessions.
func (s *Speaker) Established() (up, total int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.peers {
		total++
		if p.state == bgp.BGP_FSM_ESTABLISHED {
			up++
		}
	}
	return up, total
}

// Mismatches lists peers the RFC 5549 guard holds IPv4 back from.
func (s *Speaker) Mismatches() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, p := range s.peers {
		if p.state == bgp.BGP_FSM_ESTABLISHED && p.guard.Warning != "" {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// SessionState is a cheap per-peer summary (no GoBGP call).
type SessionState struct {
	Peer        string
	Established bool
}

// Sessions lists every configured peer and whether it is established.
func (s *Speaker) Sessions() []SessionState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SessionState, 0, len(s.peers))
	for k, p := range s.peers {
		out = append(out, SessionState{Peer: k, Established: p.state == bgp.BGP_FSM_ESTABLISHED})
	}
	slices.SortFunc(out, func(a, b SessionState) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}

// Collector is GoBGP's own Prometheus collector for this server.
func (s *Speaker) Collector() prometheus.Collector { return gobgpmetrics.NewBgpCollector(s.srv) }
