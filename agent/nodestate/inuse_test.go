package nodestate

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
)

// A pod pool that arrives over an anycast and an `addresses` IP in use on
// the node (issue 18, defect 4): the sequential allocator hands out every
// other address of the range and never those two, the stats count them
// as unavailable, the range is reported full at 12 pods, and the pod that
// holds them keeps them (nothing in use moves). Once it goes they are
// handed out again.
func TestPodPoolOverInUseAnycast(t *testing.T) {
	s := newState(t, true)
	pool := netip.MustParsePrefix("2001:db8:300::/124") // 14 usable
	any := netip.MustParseAddr("2001:db8:300::1")
	addr := netip.MustParseAddr("2001:db8:300::2")
	holder := add(t, s, "holder", pod("holder"), func(r *store.Allocation) {
		r.Anycast, r.Addresses = []netip.Addr{any}, []netip.Addr{addr}
	})
	if _, err := s.SetPodPools([]netip.Prefix{pool}); err != nil {
		t.Fatal(err)
	}
	seq := ipam.Request{Family: 6, Range: pool, Algo: ipam.Algo{Kind: ipam.Sequential}}
	var got []netip.Addr
	for i := range 14 {
		rec, err := s.Reserve(store.Allocation{ContainerID: fmt.Sprintf("p%02d", i), Pod: pod(fmt.Sprintf("p%02d", i))}, []ipam.Request{seq})
		if err != nil {
			if i < 12 || !errors.Is(err, ipam.ErrExhausted) {
				t.Fatalf("ADD %d: %v", i, err)
			}
			if !strings.Contains(err.Error(), "14 of 14 usable addresses in use, 2 of them as anycast or addresses IPs") {
				t.Errorf("exhausted: %v; want it to count the 2 held among the 14", err)
			}
			continue
		}
		if i >= 12 {
			t.Errorf("ADD %d got %v: the range holds 12 free addresses", i, rec.IPs)
		}
		got = append(got, rec.IPs...)
	}
	if slices.Contains(got, any) || slices.Contains(got, addr) {
		t.Fatalf("IPAM handed out %v, which holds the in-use anycast %s or addresses %s", got, any, addr)
	}
	st := poolStats(t, s, pool)
	if st.Used != 12 || st.Held != 2 || st.Free != "0" {
		t.Errorf("stats %+v: want 12 used, 2 held (anycast, addresses), 0 free", st)
	}
	if a, _, _ := s.Get("holder"); !slices.Equal(a.Anycast, holder.Anycast) || !slices.Equal(a.Addresses, holder.Addresses) {
		t.Errorf("holder now %+v: it must keep what it holds", a)
	}
	if got, want := fmt.Sprint(s.InUseIn(pool)), "[2001:db8:300::1 (anycast: default/holder) 2001:db8:300::2 (address: default/holder)]"; got != want {
		t.Errorf("InUseIn = %s, want %s", got, want)
	}
	s.Release("holder")
	if st := poolStats(t, s, pool); st.Held != 0 || st.Free != "2" {
		t.Errorf("after the holder's DEL: %+v; want 0 held, 2 free", st)
	}
	rec, err := s.Reserve(store.Allocation{ContainerID: "after", Pod: pod("after")}, []ipam.Request{seq, seq})
	if err != nil || !slices.Contains(rec.IPs, any) || !slices.Contains(rec.IPs, addr) {
		t.Errorf("after the holder's DEL: %v, %v; want %s and %s", rec.IPs, err, any, addr)
	}
}

// Every allocator honours the hold, and a restored pod address that is
// in use as anycast is a conflict, not a second holder.
func TestHeldAddressesEveryAlgo(t *testing.T) {
	pool := netip.MustParsePrefix("2001:db8:300::/126") // ::1, ::2
	any := netip.MustParseAddr("2001:db8:300::1")
	for _, algo := range []ipam.Algo{{Kind: ipam.Sequential}, {Kind: ipam.Random}} {
		t.Run(algo.String(), func(t *testing.T) {
			s := newState(t, true)
			add(t, s, "holder", pod("holder"), func(r *store.Allocation) { r.Anycast = []netip.Addr{any} })
			if _, err := s.SetPodPools([]netip.Prefix{pool}); err != nil {
				t.Fatal(err)
			}
			req := ipam.Request{Family: 6, Range: pool, Algo: algo}
			for i := range 20 {
				id := fmt.Sprintf("p%d", i)
				rec, err := s.Reserve(store.Allocation{ContainerID: id, Pod: pod(id)}, []ipam.Request{req})
				if err != nil {
					if !errors.Is(err, ipam.ErrExhausted) {
						t.Fatalf("Reserve: %v", err)
					}
					continue
				}
				if slices.Contains(rec.IPs, any) {
					t.Fatalf("%s got the in-use anycast %s", id, any)
				}
				s.Release(id)
			}
		})
	}
	t.Run("restore", func(t *testing.T) {
		s := newState(t, true)
		if _, err := s.SetPodPools([]netip.Prefix{pool}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Restore(store.Allocation{ContainerID: "a", Pod: pod("a"), HostVeth: dataplane.HostVethName("a"),
			IPs: []netip.Addr{netip.MustParseAddr("fd00:10:1::1")}, Anycast: []netip.Addr{any}}); err != nil {
			t.Fatalf("restore of an anycast a pool came to cover: %v (nothing in use moves)", err)
		}
		if _, err := s.Restore(store.Allocation{ContainerID: "b", Pod: pod("b"), HostVeth: dataplane.HostVethName("b"),
			IPs: []netip.Addr{any}}); !errors.Is(err, ipam.ErrConflict) {
			t.Errorf("restore of a pod address in use as anycast: %v, want a conflict", err)
		}
	})
}

// An anycast IP a pod asks for that is another pod's address on this
// node is refused at ADD, naming the reason; so is one inside a pod pool
// (IPAM may hand it out next), unless it came to lie there while in use.
func TestAnycastOverPodAddressRefused(t *testing.T) {
	s := newState(t, true)
	b := add(t, s, "b", pod("b"), nil)
	var ipB netip.Addr
	for _, ip := range b.IPs {
		if ip.Is6() {
			ipB = ip
		}
	}
	for _, key := range []string{annotations.Anycast, annotations.Addresses} {
		rec := store.Allocation{ContainerID: "a", Pod: pod("a")}
		if key == annotations.Anycast {
			rec.Anycast = []netip.Addr{ipB}
		} else {
			rec.Addresses = []netip.Addr{ipB}
		}
		_, err := s.Reserve(rec, dual())
		if err == nil || !strings.Contains(err.Error(), ipB.String()) || !strings.Contains(err.Error(), key) {
			t.Errorf("%s=%s (b's pod address): %v, want it refused naming key and IP", key, ipB, err)
		}
		if _, _, ok := s.Get("a"); ok {
			t.Fatal("refused ADD left an attachment")
		}
	}
}

func poolStats(t *testing.T, s *State, p netip.Prefix) ipam.PoolStats {
	t.Helper()
	for _, st := range s.IPAM() {
		if st.Pool.Prefix == p {
			return st
		}
	}
	t.Fatalf("pool %s not in IPAM stats", p)
	return ipam.PoolStats{}
}

// A pod address whose pool went away (the pod keeps it) is still that
// pod's: nobody may claim it as anycast or `addresses`.
func TestAnycastOverPodAddressOfGonePool(t *testing.T) {
	s := newState(t, true)
	pool := netip.MustParsePrefix("2001:db8:300::/124")
	if _, err := s.SetPodPools([]netip.Prefix{pool}); err != nil {
		t.Fatal(err)
	}
	b := add(t, s, "b", pod("b"), nil, ipam.Request{Family: 6, Range: pool, Algo: ipam.Algo{Kind: ipam.Sequential}})
	if _, err := s.SetPodPools(nil); err != nil {
		t.Fatal(err)
	}
	_, err := s.Reserve(store.Allocation{ContainerID: "a", Pod: pod("a"), Anycast: b.IPs}, dual())
	if err == nil || !strings.Contains(err.Error(), "is the pod address of container b") {
		t.Errorf("anycast %v (b's pod address, its pool gone): %v, want it refused naming b", b.IPs, err)
	}
}
