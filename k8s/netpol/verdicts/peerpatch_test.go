package verdicts

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// edited keeps a set normalized as a build of its addresses would be:
// random batches of toggles of addresses in a few small blocks of both
// families (neighbours, each family's first and last address), each
// checked against a build of the members.
func TestEditedIsABuild(t *testing.T) {
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0x3a9e))
	space := runs(8, "0.0.0.0", "192.0.2.0", "255.255.255.248", "::", "fd00:77::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff8")
	for round := range scaled(t, 300) {
		member := map[netip.Addr]bool{}
		var rs []Range
		for step := range 40 {
			var add, cut []netip.Addr
			batch := map[netip.Addr]bool{}
			for range 1 + r.IntN(6) {
				a := space[r.IntN(len(space))]
				if batch[a] {
					continue
				}
				batch[a] = true
				if member[a] {
					cut = append(cut, a)
				} else {
					add = append(add, a)
				}
			}
			was := slices.Clone(rs)
			now := edited(rs, add, cut)
			for _, a := range add {
				member[a] = true
			}
			for _, a := range cut {
				member[a] = false
			}
			var b addrsBuilder
			for m, ok := range member {
				if ok {
					b.addAddr(m)
				}
			}
			if want := b.build().r; !slices.Equal(now, want) {
				t.Fatalf("FLOCK_SEED=%d round %d step %d: %v + %v - %v: %v, a build %v", sd, round, step, was, add, cut, now, want)
			}
			if !slices.Equal(rs, was) {
				t.Fatalf("FLOCK_SEED=%d: edited changed its argument", sd)
			}
			rs = now
		}
	}
}

// The kernel's set of peers follows patches that join and split its
// ranges: a program whose one group lets a judged address reach a set of
// peers, patched with random toggles of neighbouring addresses of both
// families, answers as the program does for every address after each.
func TestKernelPeerRanges(t *testing.T) {
	const table = "flock-verdicts-peer-ranges"
	l, conn, hook := patchLab(t)
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0x5e75))
	judged4, judged6 := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:1::1")
	space := runs(10, "192.0.2.1", "fd00:77::1")
	// Both families held from the start (a patch does not add a family).
	var b addrsBuilder
	b.addAddr(space[0])
	b.addAddr(space[10])
	peers := b.build()
	peers.id = 1
	prog := &Program{
		Selected: map[netip.Addr]bool{judged4: true, judged6: true},
		Egress:   map[netip.Addr][]int{judged4: {0}, judged6: {0}},
		Ingress:  map[netip.Addr][]int{},
		Groups:   []*Group{{Key: "g", Egress: true, Terms: []Term{{Peers: peers, Ports: Ports{All: true}}}}},
		peerSets: []*Addrs{peers},
		peerFrom: [][]peerSource{{}},
	}
	at, err := LoadGen(conn, table, hook, prog)
	if err != nil {
		t.Fatal(err)
	}
	member := map[netip.Addr]bool{space[0]: true, space[10]: true}
	for step := range scaled(t, 60) {
		es := map[netip.Addr]Entry{}
		for range 1 + r.IntN(3) {
			a := space[r.IntN(len(space))]
			if a == space[0] || a == space[10] {
				continue // each family keeps one
			}
			member[a] = r.IntN(2) == 0
		}
		for _, a := range space {
			e := Entry{}
			if member[a] {
				e.in = []int32{1}
			}
			es[a] = e
		}
		was := slices.Clone(prog.peerSets[0].r)
		ch, ok := prog.Change(es)
		if !ok {
			t.Fatalf("FLOCK_SEED=%d step %d: refused", sd, step)
		}
		if err := Patch(conn, table, at, prog, ch); err != nil {
			t.Fatalf("FLOCK_SEED=%d step %d: %v", sd, step, err)
		}
		prog.Apply(ch)
		for _, a := range space {
			src := judged6
			if a.Is4() {
				src = judged4
			}
			k := Packet{Src: src, Dst: a, Proto: unix.IPPROTO_UDP, SrcPort: 1000, DstPort: 53}
			if want := prog.Allows(k); want != member[a] {
				t.Fatalf("FLOCK_SEED=%d step %d: the program lets %s through: %v, want %v", sd, step, a, want, member[a])
			}
			if got := l.Allows(t, probe.Packet(k)); got != member[a] {
				t.Fatalf("FLOCK_SEED=%d step %d: %v patched to %v: the kernel lets %s through: %v, want %v", sd, step, was, prog.peerSets[0].r, a, got, member[a])
			}
		}
	}
}

// A Change's edit of a set of peers, applied in place (Apply) or to a copy
// (Patched), is a build of the members: random batches of toggles of
// neighbouring addresses of both families, through Change as flock-policy
// makes them; Patched leaves the program it was given as it was.
func TestChangeEditsAsABuild(t *testing.T) {
	sd := seed(t)
	r := rand.New(rand.NewPCG(sd, 0xed17))
	space := runs(16, "192.0.2.1", "fd00:77::1")
	for round := range scaled(t, 200) {
		var b addrsBuilder
		b.addAddr(space[0])
		b.addAddr(space[16])
		peers := b.build()
		peers.id = 1
		prog := &Program{Egress: map[netip.Addr][]int{}, Ingress: map[netip.Addr][]int{}, peerSets: []*Addrs{peers}, peerFrom: [][]peerSource{{}},
			Groups: []*Group{{Terms: []Term{{Peers: peers, Ports: Ports{All: true}}}}}}
		member := map[netip.Addr]bool{space[0]: true, space[16]: true}
		for step := range 30 {
			es := map[netip.Addr]Entry{}
			for range 1 + r.IntN(5) {
				a := space[1+r.IntN(len(space)-1)]
				if a == space[16] {
					continue // each family keeps one
				}
				member[a] = !member[a]
				e := Entry{}
				if member[a] {
					e.in = []int32{1}
				}
				es[a] = e
			}
			var want addrsBuilder
			for a, in := range member {
				if in {
					want.addAddr(a)
				}
			}
			ch, ok := prog.Change(es)
			if !ok {
				t.Fatalf("FLOCK_SEED=%d round %d step %d: refused", sd, round, step)
			}
			before := slices.Clone(prog.peerSets[0].r)
			copied := prog.Patched(ch)
			if !slices.Equal(prog.peerSets[0].r, before) {
				t.Fatalf("FLOCK_SEED=%d round %d step %d: Patched changed the program it was given", sd, round, step)
			}
			if got := copied.Groups[0].Terms[0].Peers.r; !slices.Equal(got, want.build().r) {
				t.Fatalf("FLOCK_SEED=%d round %d step %d: Patched: %v, a build %v", sd, round, step, got, want.build().r)
			}
			prog.Apply(ch)
			if got := prog.Groups[0].Terms[0].Peers.r; !slices.Equal(got, want.build().r) {
				t.Fatalf("FLOCK_SEED=%d round %d step %d: %v edited by %v: %v, a build %v", sd, round, step, before, ch.peers[1], got, want.build().r)
			}
		}
	}
}

// runs are n addresses in a row from each of bases.
func runs(n int, bases ...string) []netip.Addr {
	var out []netip.Addr
	for _, base := range bases {
		a := netip.MustParseAddr(base)
		for range n {
			out = append(out, a)
			a = a.Next()
		}
	}
	return out
}
