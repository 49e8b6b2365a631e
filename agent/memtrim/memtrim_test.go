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
// hands the freed heap back, once.
func TestRunHandsBackABurst(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection but Run's
	var released atomic.Int32
	release = func() { released.Add(1); debug.FreeOSMemory() }
	defer func() { release = debug.FreeOSMemory }()
	runtime.GC()
	const burst = 64 << 20
	for range burst / (64 << 10) {
		sink = append(sink, make([]byte, 64<<10))
	}
	sink = nil // garbage now
	heap := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := heap()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	deadline := time.Now().Add(10 * time.Second)
	for released.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r := released.Load(); r != 1 {
		t.Errorf("%d hand-backs after a %d MB burst, want 1", r, burst>>20)
	}
	if after := heap(); after > before-burst/2 {
		t.Errorf("heap objects %d MB after the hand-back, %d MB before: want the burst collected", after>>20, before>>20)
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
	looks := make(chan struct{})
	looked = func() { looks <- struct{}{} }
	defer func() { collect, release, looked = runtime.GC, debug.FreeOSMemory, func() {} }()
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	ticks := make(chan time.Time)
	done := make(chan error, 1)
	go func() { done <- run(ctx, ticks, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}()
	// tick lets Run look, and waits until it has.
	tick := func() {
		ticks <- time.Now()
		<-looks
	}
	// 8 MB of garbage between looks, ten times: steady churn.
	for range 10 {
		for range 128 {
			sink = append(sink, make([]byte, 64<<10))
		}
		sink = nil
		tick()
	}
	if c, r := collected.Load(), released.Load(); c < 5 || r != 0 {
		t.Errorf("while allocating: %d collections and %d hand-backs, want several collections and none", c, r)
	}
	// Allocation stops: the pages go back, once.
	for range 4 {
		tick()
	}
	if r := released.Load(); r != 1 {
		t.Errorf("%d hand-backs once allocation stopped, want 1", r)
	}
}
