package daemon

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
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
// while the burst ends leave it consistent.
func TestBurstGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(gcPercent))
	g := &burstGC{quiet: 100 * time.Millisecond}
	if got := gogc(t); got != gcPercent {
		t.Fatalf("at rest GOGC = %d, want %d", got, gcPercent)
	}
	g.request()
	if got := gogc(t); got != burstGCPercent {
		t.Fatalf("in a burst GOGC = %d, want %d", got, burstGCPercent)
	}
	// Requests keep coming for longer than quiet: the burst goes on.
	for range 6 {
		time.Sleep(40 * time.Millisecond)
		g.request()
	}
	if got := gogc(t); got != burstGCPercent {
		t.Fatalf("GOGC = %d while requests keep coming, want %d", got, burstGCPercent)
	}
	deadline := time.Now().Add(5 * time.Second)
	for gogc(t) != gcPercent {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC = %d long after the last request, want %d", gogc(t), gcPercent)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Races between requests and the end of a burst.
	for range 5 {
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					g.request()
					time.Sleep(time.Millisecond)
				}
			}()
		}
		wg.Wait()
		if got := gogc(t); got != burstGCPercent {
			t.Fatalf("GOGC = %d right after requests, want %d", got, burstGCPercent)
		}
		time.Sleep(150 * time.Millisecond)
		for gogc(t) != gcPercent && time.Now().Before(deadline.Add(5*time.Second)) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := gogc(t); got != gcPercent {
			t.Fatalf("GOGC = %d after the burst, want %d", got, gcPercent)
		}
	}
	var none *burstGC // GOGC set by the operator
	none.request()
}
