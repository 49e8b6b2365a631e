package agentsock

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRestartMarker(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "cni.sock")
	now := time.Now()
	if _, ok := Restarting(sock, now); ok {
		t.Error("no marker: restarting")
	}
	if err := WriteRestart(sock, Restart{Until: now.Add(30 * time.Second), PID: 42}); err != nil {
		t.Fatal(err)
	}
	if got := RestartMarker(sock); got != filepath.Join(dir, "cni.sock.restarting") {
		t.Errorf("marker at %s, want next to the socket", got)
	}
	r, ok := Restarting(sock, now)
	if !ok || r.PID != 42 || !r.Until.Equal(now.Add(30*time.Second)) {
		t.Errorf("fresh marker: %+v %v", r, ok)
	}
	if _, ok := Restarting(sock, now.Add(31*time.Second)); ok {
		t.Error("expired marker still counts")
	}
	if _, ok := Restarting(filepath.Join(dir, "other.sock"), now); ok {
		t.Error("another socket's agent is restarting too")
	}
	// A window beyond MaxRestartGrace (the clock stepped back) is ignored.
	if err := WriteRestart(sock, Restart{Until: now.Add(MaxRestartGrace + time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, ok := Restarting(sock, now); ok {
		t.Error("a marker beyond MaxRestartGrace counts")
	}
	if err := os.WriteFile(RestartMarker(sock), []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := Restarting(sock, now); ok {
		t.Error("an unreadable marker counts")
	}
	for range 2 { // the second finds none: no error
		if err := RemoveRestart(sock); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// The marker is written and read as encoding/json wrote and read it
// before this package (an agent and a plugin of different releases meet
// during a rollout).
func TestRestartMarkerFormatIsEncodingJSONs(t *testing.T) {
	type old struct {
		Until time.Time `json:"until"`
		PID   int       `json:"pid,omitempty"`
	}
	type stamped struct {
		Format int       `json:"format"`
		Until  time.Time `json:"until"`
		PID    int       `json:"pid,omitempty"`
	}
	for _, r := range []Restart{
		{Until: time.Date(2026, 11, 27, 1, 2, 3, 456789, time.UTC), PID: 42},
		{Until: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))},
	} {
		want, err := json.Marshal(stamped{Format: RestartFormat, Until: r.Until, PID: r.PID})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.marshal(); string(got) != string(want) {
			t.Errorf("marker %s, encoding/json wrote %s", got, want)
		}
		// What v0.20.0 wrote (no format) and what this one writes are
		// read alike; encoding/json (v0.20.0's reader) reads this one's.
		was, _ := json.Marshal(old(r))
		for _, b := range [][]byte{want, was} {
			back, err := parseRestart(b)
			if err != nil || !back.Until.Equal(r.Until) || back.PID != r.PID {
				t.Errorf("read %s as %+v (%v)", b, back, err)
			}
		}
		var o old
		if err := json.Unmarshal(want, &o); err != nil || !o.Until.Equal(r.Until) || o.PID != r.PID {
			t.Errorf("encoding/json read %s as %+v (%v)", want, o, err)
		}
	}
	// A marker of a newer format counts as none: its until may not mean
	// what this reader thinks.
	if r, err := parseRestart([]byte(`{"format":2,"until":"2026-11-27T01:02:03Z"}`)); err == nil || !strings.Contains(err.Error(), "format 2; this flock reads format 1") {
		t.Errorf("a format 2 marker read as %+v (%v)", r, err)
	}
	for _, bad := range []string{`{}`, `{"until":5}`, `{"until":"yesterday"}`, `{"until":"2026-11-27T01:02:03Z","pid":"x"}`, `[]`, `null`} {
		if r, err := parseRestart([]byte(bad)); err == nil {
			t.Errorf("marker %s read as %+v, want an error", bad, r)
		}
	}
}
