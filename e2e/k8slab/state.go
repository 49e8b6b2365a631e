package k8slab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// activeMarker names the Dir of the lab that is up. A test process that
// dies (go test -timeout, SIGKILL) never calls Down; the next Up finds the
// marker and restores the host from that lab's state file.
const activeMarker = "/run/flock-k8slab-active"

// labState is what restoring the host needs, kept in Dir/run/state.json.
type labState struct {
	Dir         string
	Socket      string
	Sysctls     map[string]string // values before Up
	DirsBefore  map[string]bool   // hardcodedDirs that existed before Up
	NetnsBefore map[string]bool   // cni-* netns that existed before Up
	Procs       map[string]procID // components, by name
	LabLink     bool              // LabLink was created
	Services    bool              // kube-proxy ran (its nftables tables)
}

// procID tells a recorded process from a later one with the same PID.
type procID struct {
	PID   int
	Start string // /proc/<pid>/stat starttime, clock ticks after boot
}

func stateFile(dir string) string { return filepath.Join(dir, "run", "state.json") }

// saveState writes the state file and points activeMarker at this lab.
func (c *Cluster) saveState() error {
	c.mu.Lock()
	b, err := json.MarshalIndent(&c.st, "", "  ")
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("encode lab state: %w", err)
	}
	if err := os.WriteFile(stateFile(c.Opts.Dir), b, 0o644); err != nil {
		return fmt.Errorf("write lab state: %w", err)
	}
	if err := os.WriteFile(activeMarker, []byte(c.Opts.Dir+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", activeMarker, err)
	}
	return nil
}

func loadState(dir string) (*labState, error) {
	b, err := os.ReadFile(stateFile(dir))
	if err != nil {
		return nil, fmt.Errorf("read lab state: %w", err)
	}
	var st labState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("decode %s: %w", stateFile(dir), err)
	}
	return &st, nil
}

// clearMarker removes activeMarker if it names dir.
func clearMarker(dir string) error {
	b, err := os.ReadFile(activeMarker)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", activeMarker, err)
	}
	if strings.TrimSpace(string(b)) != dir {
		return nil
	}
	if err := os.Remove(activeMarker); err != nil {
		return fmt.Errorf("remove %s: %w", activeMarker, err)
	}
	return nil
}

// processStart returns a process's start time, "" when it does not exist.
func processStart(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	// The command name (field 2) may hold spaces; fields after its closing
	// parenthesis are plain. starttime is field 22 overall.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" {
		return "" // gone, or a zombie: nothing to stop
	}
	return f[19]
}
