// Package session holds the BGP session status types the speaker fills
// and the admin API, flockctl, metrics and NodeConfig status show as they
// are. It imports nothing of GoBGP, so flockctl links none of it.
package session

import (
	"encoding/json"
	"time"
)

// FamilyCounts are per-family prefix counters.
type FamilyCounts struct {
	Family     string `json:"family"`
	Received   uint64 `json:"received"`
	Accepted   uint64 `json:"accepted"`
	Advertised uint64 `json:"advertised"`
}

// State is a session's state: a BGP FSM state, or Configuring /
// Resolving for a peer not yet added to GoBGP.
type State string

// Session states.
const (
	Configuring State = "Configuring" // being added
	Resolving   State = "Resolving"   // unnumbered: waiting for the neighbour's link-local address
	Idle        State = "Idle"
	Connect     State = "Connect"
	Active      State = "Active"
	OpenSent    State = "OpenSent"
	OpenConfirm State = "OpenConfirm"
	Established State = "Established"
)

// Neighbor is one session as an operator sees it.
type Neighbor struct {
	Peer     string    `json:"peer"`              // Key: configured address or "interface X"
	Address  string    `json:"address,omitempty"` // resolved neighbour address (no zone)
	LocalASN uint32    `json:"localASN"`
	PeerASN  uint32    `json:"peerASN"`
	State    State     `json:"state"`
	Since    time.Time `json:"since,omitzero"`  // last state change
	Uptime   Duration  `json:"uptime,omitzero"` // while established
	// RFC5549Mismatch: the RFC 5549 guard holds IPv4 routes back from
	// this established session (Warnings says why).
	RFC5549Mismatch bool           `json:"rfc5549Mismatch,omitempty"`
	Families        []FamilyCounts `json:"families"`
	BFD             string         `json:"bfd"`
	// BFDDetail is flock's BFD session, when BFD is enabled.
	BFDDetail *BFDDetail `json:"bfdDetail,omitempty"`
	GR        string     `json:"gracefulRestart"`
	Warnings  []string   `json:"warnings,omitempty"`
	LastError string     `json:"lastError,omitempty"`
}

// BFDDetail is what a network engineer asks of a BFD session.
type BFDDetail struct {
	State string    `json:"state"`
	Since time.Time `json:"since,omitzero"`
	// Diag: why it last left Up ("detection time expired", …).
	Diag        string `json:"diag,omitempty"`
	RemoteState string `json:"remoteState"`
	// RemoteCBit: the peer's BFD is control-plane independent.
	RemoteCBit bool `json:"remoteCBit"`
	// Failures reset the BGP session; PlannedDowns (the peer sent
	// AdminDown) did not.
	Failures     int `json:"failures"`
	PlannedDowns int `json:"plannedDowns"`
	// SocketFailures: failed opens of the session's sending socket (each
	// retried); SocketError: why it is not open, while it is not.
	SocketFailures int    `json:"socketFailures,omitempty"`
	SocketError    string `json:"socketError,omitempty"`
}

// Established tells whether the session is up.
func (n Neighbor) Established() bool { return n.State == Established }

// Duration is a time.Duration that reads "1h2m3s" in JSON, for people
// reading `flockctl -o json`.
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string ("1h2m3s").
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
