package kubeclient

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// A wait names what it still waits for, and ends when all of it synced or
// when ctx ends.
func TestWaitLogged(t *testing.T) {
	var buf testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var claims atomic.Bool
	always := func() bool { return true }
	done := make(chan bool)
	go func() {
		done <- WaitLogged(context.Background(), log, "extra pod IPs", 50*time.Millisecond,
			Synced{"pods", always}, Synced{"AddressClaims", claims.Load})
	}()
	for !strings.Contains(buf.String(), "AddressClaims") {
		select {
		case ok := <-done:
			t.Fatalf("the wait ended (%v) before AddressClaims synced", ok)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if out := buf.String(); !strings.Contains(out, `what="extra pod IPs" for=[AddressClaims]`) {
		t.Errorf("the log does not name what is waited for alone:\n%s", out)
	}
	claims.Store(true)
	if !<-done {
		t.Error("the wait failed once everything synced")
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- WaitLogged(ctx, log, "x", time.Hour, Synced{"never", func() bool { return false }}) }()
	cancel()
	if <-done {
		t.Error("the wait succeeded when ctx ended first")
	}
}
