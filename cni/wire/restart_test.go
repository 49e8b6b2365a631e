package wire

import (
	"os"
	"path/filepath"
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
