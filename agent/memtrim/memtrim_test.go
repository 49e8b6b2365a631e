package memtrim

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
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

// While the process keeps allocating, Run collects (the heap does not
// grow) but does not hand the pages back, which the allocations would
// fault in again at once; once allocation stops, it does.
func TestRunKeepsPagesWhileAllocating(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection but Run's
	var collected, released atomic.Int32
	collect = func() { collected.Add(1); runtime.GC() }
	release = func() { released.Add(1); debug.FreeOSMemory() }
	defer func() { collect, release = runtime.GC, debug.FreeOSMemory }()
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}()
	// 8 MB of garbage every 10 ms for a second: steady churn.
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		for range 128 {
			sink = append(sink, make([]byte, 64<<10))
		}
		sink = nil
		time.Sleep(10 * time.Millisecond)
	}
	if c, r := collected.Load(), released.Load(); c < 5 || r != 0 {
		t.Errorf("while allocating: %d collections and %d hand-backs, want several collections and none", c, r)
	}
	// Allocation stops: the pages go back, once.
	deadline := time.Now().Add(10 * time.Second)
	for released.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if r := released.Load(); r != 1 {
		t.Errorf("%d hand-backs once allocation stopped, want 1", r)
	}
}
