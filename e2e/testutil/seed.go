package testutil

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Seed is a randomized test's seed: FLOCK_SEED's if set (a run repeated),
// else the clock's. It is logged if the test fails, with how to repeat it.
func Seed(t testing.TB) int64 {
	t.Helper()
	seed := time.Now().UnixNano()
	if s := os.Getenv("FLOCK_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("FLOCK_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (FLOCK_SEED=%d repeats it)", seed, seed)
		}
	})
	return seed
}
