package bgp

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// bgp-state.json across releases: v0.20.0's (no format), this one's
// (format 1) are read; a newer format is ignored, not misread; what is
// written carries the format.
func TestStateFileFormats(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       bool
	}{
		{"v0.20.0, no format", `{"rfc5549":{"p1":true}}`, true},
		{"format 1", `{"format":1,"rfc5549":{"p1":true}}`, true},
		{"a newer format", `{"format":2,"rfc5549":{"p1":true}}`, false},
		{"unreadable", `{"rfc5549":`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bgp-state.json")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			s := &Speaker{log: slog.New(slog.NewTextHandler(io.Discard, nil)), stateFile: path, knownGood: map[string]bool{}}
			s.loadState()
			if s.knownGood["p1"] != tc.want {
				t.Fatalf("known good %v, want p1 %v", s.knownGood, tc.want)
			}
		})
	}
	path := filepath.Join(t.TempDir(), "bgp-state.json")
	s := &Speaker{log: slog.New(slog.NewTextHandler(io.Discard, nil)), stateFile: path, knownGood: map[string]bool{"p1": true}}
	s.saveStateLocked()
	if b, _ := os.ReadFile(path); string(b) != `{"format":1,"rfc5549":{"p1":true}}` {
		t.Fatalf("written %s", b)
	}
}
