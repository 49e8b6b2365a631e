package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "a.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi, err)
	}
	// A live socket is never taken over.
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "another agent is listening on "+path) {
		t.Errorf("live socket: %v", err)
	}
	l.Close()
	// A stale one (left by a crash) is replaced.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	l, err = Listen(path)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	l.Close()
	// A regular file is never removed.
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file: %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Error("regular file was touched")
	}
}
