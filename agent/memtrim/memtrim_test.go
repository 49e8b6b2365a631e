package memtrim

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

var sink [][]byte

// After a burst of allocation, once no collection runs, Run collects and
// hands the freed heap back: the heap released to the kernel grows by
// most of what the burst left.
func TestRunHandsBackABurst(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection but Run's
	runtime.GC()
	debug.FreeOSMemory()
	released := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := released()
	const burst = 64 << 20
	for range burst / (64 << 10) {
		sink = append(sink, make([]byte, 64<<10))
	}
	sink = nil // garbage now
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	deadline := time.Now().Add(10 * time.Second)
	for released()-min(released(), before) < burst/2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := released() - min(released(), before); got < burst/2 {
		t.Errorf("released %d MB after a %d MB burst, want at least half of it", got>>20, burst>>20)
	}
}
