package ipam

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
)

func TestConcurrentAllocate(t *testing.T) {
	a := mustNew(t, summary("fd00::/64"), summary("10.0.0.0/20"))
	const workers, per = 32, 100
	var (
		mu   sync.Mutex
		seen = map[netip.Addr]string{}
		wg   sync.WaitGroup
	)
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				owner := fmt.Sprintf("w%d-%d", w, i)
				algo := allAlgos[i%3]
				fam := 4 + 2*(i%2)
				ad, err := a.Allocate(Request{Owner: owner, Family: fam, Algo: algo, Identity: Identity{Namespace: "ns", App: fmt.Sprint("app", w%4)}})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if prev, dup := seen[ad]; dup {
					mu.Unlock()
					errs <- fmt.Errorf("%s handed to %s and %s", ad, prev, owner)
					return
				}
				seen[ad] = owner
				mu.Unlock()
				if i%10 == 9 {
					// Exercise Release/Owner/Stats concurrently too.
					if o, ok := a.Owner(ad); !ok || o != owner {
						errs <- fmt.Errorf("owner of %s = %q", ad, o)
						return
					}
					_ = a.Stats()
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != workers*per {
		t.Fatalf("%d addresses, want %d", len(seen), workers*per)
	}
	var used uint64
	for _, s := range a.Stats() {
		used += s.Used
	}
	if used != workers*per {
		t.Fatalf("stats used %d", used)
	}
}

func BenchmarkAllocateRandomV6(b *testing.B) {
	a := mustNew(b, summary("fd00::/64"))
	for i := 0; i < 10000; i++ { // some background occupancy
		mustAlloc(b, a, Request{Owner: "bg", Family: 6})
	}
	b.ResetTimer()
	for b.Loop() {
		ad, err := a.Allocate(Request{Owner: "b", Family: 6})
		if err != nil {
			b.Fatal(err)
		}
		a.Release(ad, "b")
	}
}

func BenchmarkAllocateSequentialV4(b *testing.B) {
	a := mustNew(b, summary("10.0.0.0/16"))
	for i := 0; i < 10000; i++ {
		mustAlloc(b, a, Request{Owner: "bg", Family: 4, Algo: Algo{Kind: Sequential}})
	}
	b.ResetTimer()
	for b.Loop() {
		ad, err := a.Allocate(Request{Owner: "b", Family: 4, Algo: Algo{Kind: Sequential}})
		if err != nil {
			b.Fatal(err)
		}
		a.Release(ad, "b")
	}
}
