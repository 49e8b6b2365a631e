// Package report is what flock-installer leaves for the agent: a small
// JSON file in the run directory both containers mount, saying which
// cniVersion it chose and why, or why it refused. The agent reads it at
// start and reports a refusal as not Ready. It imports nothing heavy, so
// the agent links none of the installer.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// FileName is the report's name in the run directory: next to the CNI
// socket, where the agent looks by default.
const FileName = "installer.json"

// DefaultPath is where the installer writes by default: next to the
// default CNI socket (/run/flock/cni.sock).
const DefaultPath = "/run/flock/" + FileName

// What happened to the conflist.
const (
	ConflistWritten   = "written"   // a new or changed conflist is in place
	ConflistUnchanged = "unchanged" // the one in place was already right
	ConflistKept      = "kept"      // refused, but the one in place runs with the chain
	ConflistRemoved   = "removed"   // refused, and the one in place did not run with the chain
	ConflistStaged    = "staged"    // written to Staged: the agent publishes it once it serves
	ConflistNone      = "none"      // refused, and there was none
)

// Format is the report's format: written by Write, and the newest Read
// accepts (a report without one is format 1, as v0.20.0 wrote it).
const Format = 1

// Report is the installer's outcome.
type Report struct {
	// Format of the report (Write sets it).
	Format int       `json:"format,omitempty"`
	Time   time.Time `json:"time"`
	// CNIVersion is the conflist's cniVersion: the one written, or the
	// one of the conflist kept after a refusal.
	CNIVersion string `json:"cniVersion,omitempty"`
	// Flock is the versions the flock plugin supports.
	Flock   []string `json:"flockVersions"`
	Plugins []Plugin `json:"plugins,omitempty"`
	// Runtime is the container runtime as a member of the chain (its
	// libcni decodes only the spec versions it knows); nil: not known.
	Runtime *Plugin `json:"runtime,omitempty"`
	// ConflistPath and Conflist (one of the Conflist* values) say what
	// happened to the network config.
	ConflistPath string `json:"conflistPath,omitempty"`
	Conflist     string `json:"conflist,omitempty"`
	// Staged is where the conflist waits for the agent (installer
	// --stage-dir): the agent copies it to ConflistPath once it serves, so
	// the runtime never calls a plugin whose agent cannot answer.
	Staged string `json:"staged,omitempty"`
	// Error is why the install was refused or failed ("" on success).
	Error string `json:"error,omitempty"`
}

// Plugin is one chained plugin as the installer found it.
type Plugin struct {
	Type string `json:"type"`
	// Path is where the runtime execs it (on the host).
	Path string `json:"path"`
	// Versions are the spec versions it answered VERSION with.
	Versions []string `json:"versions,omitempty"`
	// Error is why it could not be asked (missing, not executable, failed).
	Error string `json:"error,omitempty"`
}

// Write puts r at path atomically (temp file in the same directory,
// fsync, rename), so the agent never reads half a report.
func Write(path string, r Report) error {
	r.Format = Format
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("report: write %s: %w", path, err)
	}
	return nil
}

// Read loads the report at path. A missing file is an error wrapping
// os.ErrNotExist (no installer ran: standalone mode, an older image).
func Read(path string) (Report, error) {
	var r Report
	b, err := os.ReadFile(path)
	if err != nil {
		return r, fmt.Errorf("installer report: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("installer report %s: %w", path, err)
	}
	if r.Format > Format {
		return r, fmt.Errorf("installer report %s: format %d; this agent reads format %d at most (the installer is of a newer release than the agent)", path, r.Format, Format)
	}
	return r, nil
}
