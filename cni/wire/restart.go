package wire

import (
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/agentsock"
)

// The restart marker lives in agentsock, which the plugin links without
// a JSON library; these names are the agent's.

// MaxRestartGrace bounds a restart marker's window (agentsock.MaxRestartGrace).
const MaxRestartGrace = agentsock.MaxRestartGrace

// Restart is the marker's content.
type Restart = agentsock.Restart

// RestartMarker is the marker's path for the agent serving socket.
func RestartMarker(socket string) string { return agentsock.RestartMarker(socket) }

// WriteRestart puts the marker for socket in place atomically.
func WriteRestart(socket string, r Restart) error { return agentsock.WriteRestart(socket, r) }

// RemoveRestart removes the marker for socket; none is no error.
func RemoveRestart(socket string) error { return agentsock.RemoveRestart(socket) }

// Restarting reports whether a fresh marker says the agent is restarting.
func Restarting(socket string, now time.Time) (Restart, bool) {
	return agentsock.Restarting(socket, now)
}
