// Package agentsock is where the CNI plugin finds the node agent: the
// socket's default path, and the restart marker a planned stop leaves
// beside it. Both the agent and the plugin use it; the plugin is exec'd
// once per pod, so this package links no JSON library (the marker is
// read with cni/internal/jsonlite).
package agentsock

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/internal/jsonlite"
)

// DefaultPath is where the agent listens and the plugin connects.
const DefaultPath = "/run/flock/cni.sock"

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
	b := r.marshal()
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return &os.PathError{Op: "restart marker", Path: path, Err: err}
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
		return &os.PathError{Op: "restart marker", Path: path, Err: err}
	}
	return nil
}

// RemoveRestart removes the marker for socket; none is no error.
func RemoveRestart(socket string) error {
	if err := os.Remove(RestartMarker(socket)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return &os.PathError{Op: "restart marker", Path: RestartMarker(socket), Err: err}
	}
	return nil
}

// Restarting reports whether a fresh marker for socket says the agent is
// restarting at now: one that has not expired and does not reach further
// than MaxRestartGrace. Missing, stale or unreadable: false.
func Restarting(socket string, now time.Time) (Restart, bool) {
	b, err := os.ReadFile(RestartMarker(socket))
	if err != nil {
		return Restart{}, false
	}
	r, err := parseRestart(b)
	if err != nil {
		return Restart{}, false
	}
	return r, now.Before(r.Until) && !r.Until.After(now.Add(MaxRestartGrace))
}

// RestartFormat is the marker's format: written, and the newest read (a
// marker without one, as v0.20.0 wrote it, is format 1). The plugin that
// reads a marker may be of the release before or after the agent that
// wrote it (a rollout replaces both), so readers ignore members they do
// not know, and a marker of a newer format counts as none.
const RestartFormat = 1

// marshal writes the marker as encoding/json would:
// {"format":1,"until":"<RFC 3339>","pid":N}.
func (r Restart) marshal() []byte {
	b := append([]byte(`{"format":`+strconv.Itoa(RestartFormat)+`,"until":`), jsonlite.AppendQuote(nil, r.Until.Format(time.RFC3339Nano))...)
	if r.PID != 0 {
		b = append(append(b, `,"pid":`...), strconv.Itoa(r.PID)...)
	}
	return append(b, '}')
}

var errNoUntil = errors.New("restart marker: no until")

func parseRestart(b []byte) (Restart, error) {
	var r Restart
	members, err := jsonlite.Object(b)
	if err != nil {
		return r, err
	}
	for _, m := range members {
		switch m.Key {
		case "until":
			s, err := jsonlite.Unquote(m.Value)
			if err != nil {
				return r, err
			}
			if r.Until, err = time.Parse(time.RFC3339, s); err != nil {
				return r, err
			}
		case "pid":
			if r.PID, err = strconv.Atoi(string(m.Value)); err != nil {
				return r, err
			}
		case "format":
			f, err := strconv.Atoi(string(m.Value))
			if err != nil {
				return r, err
			}
			if f > RestartFormat {
				return r, fmt.Errorf("restart marker: format %d; this flock reads format %d", f, RestartFormat)
			}
		}
	}
	if r.Until.IsZero() {
		return r, errNoUntil
	}
	return r, nil
}
