package daemon

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func gogc(t *testing.T) uint64 {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A burst of requests runs at burstGCPercent; quiet after the last one
// (not the first) puts gcPercent back. Requests from many goroutines
// while the burst ends leave it consistent. In a synctest bubble: the
// clock is fake, so the quiet period ends exactly when the test sleeps
// through it, and synctest.Wait lets the timer's rest run first.
func TestBurstGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(gcPercent))
	synctest.Test(t, func(t *testing.T) {
		const quiet = 100 * time.Millisecond
		g := &burstGC{quiet: quiet}
		after := func(d time.Duration) {
			time.Sleep(d)
			synctest.Wait()
		}
		if got := gogc(t); got != gcPercent {
			t.Fatalf("at rest GOGC = %d, want %d", got, gcPercent)
		}
		g.request()
		if got := gogc(t); got != burstGCPercent {
			t.Fatalf("in a burst GOGC = %d, want %d", got, burstGCPercent)
		}
		// Requests keep coming for longer than quiet: the burst goes on.
		for i := range 6 {
			after(40 * time.Millisecond)
			if got := gogc(t); got != burstGCPercent {
				t.Fatalf("GOGC = %d %v after the first request, 40 ms after the last, want %d", got, time.Duration(i+1)*40*time.Millisecond, burstGCPercent)
			}
			g.request()
		}
		// Quiet after the last request: back at rest then, not before.
		after(quiet - time.Nanosecond)
		if got := gogc(t); got != burstGCPercent {
			t.Fatalf("GOGC = %d before quiet passed since the last request, want %d", got, burstGCPercent)
		}
		after(time.Nanosecond)
		if got := gogc(t); got != gcPercent {
			t.Fatalf("GOGC = %d once quiet passed since the last request, want %d", got, gcPercent)
		}
		// Races between requests and the end of a burst.
		for range 5 {
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 20 {
						g.request()
						time.Sleep(time.Millisecond)
					}
				})
			}
			wg.Wait()
			if got := gogc(t); got != burstGCPercent {
				t.Fatalf("GOGC = %d right after requests, want %d", got, burstGCPercent)
			}
			after(quiet)
			if got := gogc(t); got != gcPercent {
				t.Fatalf("GOGC = %d after the burst, want %d", got, gcPercent)
			}
		}
		var none *burstGC // GOGC set by the operator
		none.request()
	})
}
