package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

func statsOf(t *testing.T, a *Allocator, p netip.Prefix) PoolStats {
	t.Helper()
	for _, st := range a.Stats() {
		if st.Pool.Prefix == p {
			return st
		}
	}
	t.Fatalf("no stats for %s", p)
	return PoolStats{}
}

// Addresses held before a pool covers them (an anycast IP in use when a
// pod pool arrives over it) are never handed out by any algorithm, never
// reserved, and counted as taken; the range is full when everything else
// is, and says why.
func TestHeldNeverHandedOut(t *testing.T) {
	p := pfx("2001:db8:300::/124") // 14 usable
	held := []netip.Addr{addr("2001:db8:300::1"), addr("2001:db8:300::7")}
	// (embed needs more host bits than a /124 has; it picks as random does)
	for _, algo := range []Algo{{Kind: Random}, {Kind: Sequential}} {
		t.Run(algo.String(), func(t *testing.T) {
			a := mustNew(t, summary("fd00::/64"))
			for _, h := range held {
				a.Hold(h)
				a.Hold(h) // idempotent
			}
			a.Hold(addr("2001:db8:300::")) // the network address: never handed out anyway
			if err := a.SetPools([]Pool{summary("fd00::/64"), {Prefix: p}}); err != nil {
				t.Fatal(err)
			}
			if st := statsOf(t, a, p); st.Used != 0 || st.Held != 2 || st.Free != "12" {
				t.Fatalf("stats %+v, want 0 used, 2 held, 12 free", st)
			}
			req := Request{Family: 6, Range: p, Algo: algo}
			got := map[netip.Addr]bool{}
			for i := range 12 {
				req.Owner = fmt.Sprintf("c%d", i)
				ip, err := a.Allocate(req)
				if err != nil {
					t.Fatalf("Allocate %d: %v", i, err)
				}
				if ip == held[0] || ip == held[1] || got[ip] {
					t.Fatalf("Allocate %d = %s: held or handed out twice", i, ip)
				}
				got[ip] = true
			}
			req.Owner = "last"
			_, err := a.Allocate(req)
			want := fmt.Sprintf("ipam: pool %s exhausted (14 of 14 usable addresses in use, 2 of them as anycast or addresses IPs of this node)", p)
			if !errors.Is(err, ErrExhausted) || err.Error() != want {
				t.Fatalf("Allocate with the range full: %v, want %q", err, want)
			}
			if err := a.Reserve(held[0], "x"); !errors.Is(err, ErrConflict) {
				t.Errorf("Reserve of a held address: %v, want ErrConflict", err)
			}
			a.Unhold(held[0])
			a.Unhold(held[0])
			if st := statsOf(t, a, p); st.Used != 12 || st.Held != 1 || st.Free != "1" {
				t.Fatalf("after Unhold: %+v, want 12 used, 1 held, 1 free", st)
			}
			req.Owner = "after"
			if ip, err := a.Allocate(req); err != nil || ip != held[0] {
				t.Fatalf("after Unhold: %s, %v; want %s", ip, err, held[0])
			}
		})
	}
}

// An address owned and held at once (a store written before holds
// existed) is counted once, and stays held when its owner lets go.
func TestHeldAndOwned(t *testing.T) {
	p := pfx("2001:db8:300::/126") // ::1, ::2
	a := mustNew(t, Pool{Prefix: p})
	ip := addr("2001:db8:300::1")
	if err := a.Reserve(ip, "pod"); err != nil {
		t.Fatal(err)
	}
	a.Hold(ip)
	if st := statsOf(t, a, p); st.Used != 1 || st.Held != 0 || st.Free != "1" {
		t.Fatalf("owned and held: %+v, want 1 used, 0 held, 1 free", st)
	}
	if !a.Release(ip, "pod") {
		t.Fatal("Release failed")
	}
	if st := statsOf(t, a, p); st.Used != 0 || st.Held != 1 || st.Free != "1" {
		t.Fatalf("released, still held: %+v, want 0 used, 1 held, 1 free", st)
	}
	if got := mustAlloc(t, a, Request{Owner: "next", Family: 6, Range: p, Algo: Algo{Kind: Sequential}}); got == ip {
		t.Fatalf("handed out the held %s", ip)
	}
	// A pool that goes and comes back counts it again.
	for _, pools := range [][]Pool{nil, {{Prefix: p}}} {
		if err := a.SetPools(pools); err != nil {
			t.Fatal(err)
		}
	}
	if st := statsOf(t, a, p); st.Used != 1 || st.Held != 1 || st.Free != "0" {
		t.Fatalf("after SetPools: %+v, want 1 used, 1 held, 0 free", st)
	}
	if !a.Held(ip) || a.Held(addr("2001:db8:300::2")) {
		t.Error("Held reports the wrong addresses")
	}
}
