package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// A planned agent stop (SIGTERM: a rollout, a drain) leaves a restart
// marker next to the CNI socket, saying until when the agent is expected
// back; the next agent removes it once it serves. Meanwhile the plugin's
// STATUS succeeds, so the runtime keeps the node's NetworkReady through a
// rollout, and ADD fails at once with "try again later". A crash leaves
// no marker: STATUS fails and the node goes NotReady until the agent is
// back, as it should.

// MaxRestartGrace bounds a marker's window: the plugin ignores one that
// claims more (a clock stepped back, a bug), so no marker holds a node
// Ready for long without an agent.
const MaxRestartGrace = 5 * time.Minute

// Restart is the marker's content.
type Restart struct {
	// Until is when the marker stops counting: the agent is overdue.
	Until time.Time `json:"until"`
	// PID of the agent that stopped (for a person reading the file).
	PID int `json:"pid,omitempty"`
}

// RestartMarker is the marker's path for the agent serving socket: it
// follows the socket, so agents on distinct sockets have distinct ones.
func RestartMarker(socket string) string { return socket + ".restarting" }

// WriteRestart puts the marker for socket in place atomically.
func WriteRestart(socket string, r Restart) error {
	path := RestartMarker(socket)
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("wire: restart marker: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("wire: restart marker: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("wire: restart marker %s: %w", path, err)
	}
	return nil
}

// RemoveRestart removes the marker for socket; none is no error.
func RemoveRestart(socket string) error {
	if err := os.Remove(RestartMarker(socket)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("wire: restart marker: %w", err)
	}
	return nil
}

// Restarting reports whether a fresh marker for socket says the agent is
// restarting at now: one that has not expired and does not reach further
// than MaxRestartGrace. Missing, stale or unreadable: false.
func Restarting(socket string, now time.Time) (Restart, bool) {
	var r Restart
	b, err := os.ReadFile(RestartMarker(socket))
	if err != nil || json.Unmarshal(b, &r) != nil {
		return r, false
	}
	return r, now.Before(r.Until) && !r.Until.After(now.Add(MaxRestartGrace))
}
