package plugin

import (
	"bytes"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fullBacklog is a listening unix socket that never accepts, its backlog
// filled: a further connect waits for room.
func fullBacklog(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "full.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		c, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Close(c) })
		if err := syscall.Connect(c, &syscall.SockaddrUnix{Name: sock}); err == syscall.EAGAIN {
			return sock
		} else if err != nil || i > 64 {
			t.Fatalf("filling the backlog: %v after %d", err, i)
		}
	}
}

// serveOnce accepts one connection, reads the request and has answer
// write what it likes.
func serveOnce(t *testing.T, answer func(c net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "one.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil || bytes.IndexByte(buf[:n], '\n') >= 0 {
				break
			}
		}
		answer(c)
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return sock
}

var okFrame = []byte(`{"op":"STATUS"}` + "\n")

func TestCall(t *testing.T) {
	t.Run("backlog full: not running, after the dial timeout", func(t *testing.T) {
		sock := fullBacklog(t)
		start := time.Now()
		_, err := call(sock, okFrame, 200*time.Millisecond, 5*time.Second)
		if !errors.Is(err, errAgentNotRunning) || !strings.Contains(err.Error(), "no room in its backlog within 200ms") {
			t.Errorf("%v, want agent not running", err)
		}
		if d := time.Since(start); d < 200*time.Millisecond || d > 2*time.Second {
			t.Errorf("gave up after %v, want the 200ms dial timeout", d)
		}
	})
	t.Run("the whole call within its timeout, dial included", func(t *testing.T) {
		sock := fullBacklog(t)
		start := time.Now()
		_, err := call(sock, okFrame, 2*time.Second, 300*time.Millisecond)
		if !errors.Is(err, errAgentNotRunning) {
			t.Errorf("%v, want agent not running", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("gave up after %v, want the call's 300ms", d)
		}
	})
	t.Run("no socket", func(t *testing.T) {
		_, err := call(filepath.Join(t.TempDir(), "none.sock"), okFrame, time.Second, time.Second)
		if !errors.Is(err, errAgentNotRunning) {
			t.Errorf("%v, want agent not running", err)
		}
	})
	t.Run("request too large, refused before connecting", func(t *testing.T) {
		big := append(bytes.Repeat([]byte("x"), maxFrameBytes+1), '\n')
		_, err := call(filepath.Join(t.TempDir(), "none.sock"), big, time.Second, time.Second)
		if err == nil || errors.Is(err, errAgentNotRunning) || !strings.Contains(err.Error(), "more than the agent reads") {
			t.Errorf("%v, want the size refused", err)
		}
	})
	for _, tc := range []struct {
		name   string
		answer string
		want   string // in the error; "" for success
	}{
		{"answer", `{"result":{}}` + "\n" + "ignored", ""},
		{"closed without answering", "", "closed the connection without answering"},
		{"closed mid-frame", `{"result":`, "connection closed after 10 bytes without newline"},
		{"frame too large", strings.Repeat(" ", maxFrameBytes) + "{}\n", "a frame of more than"},
		{"frame too large, no newline", strings.Repeat(" ", maxFrameBytes+10), "a frame of more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := serveOnce(t, func(c net.Conn) { c.Write([]byte(tc.answer)) })
			got, err := call(sock, okFrame, time.Second, 5*time.Second)
			switch {
			case tc.want == "" && (err != nil || string(got) != `{"result":{}}`):
				t.Errorf("%q, %v", got, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%v, want %q", err, tc.want)
			}
		})
	}
}
