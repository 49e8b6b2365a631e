package verdicts

import (
	"context"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"

	"github.com/google/nftables"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// While the program is loaded again and again, each packet meets the
// engine's verdict: no moment of a load lets a packet meet neither
// program (TestReloadUnderTraffic fails on a load that adds sets and the
// rules that use them in one transaction).
func TestReloadUnderTraffic(t *testing.T) {
	l := probe.New(t)
	conn, err := NewConn(int(l.NS))
	if err != nil {
		t.Fatal(err)
	}
	s := seed(t)
	r := rand.New(rand.NewPCG(s, 0x726c))
	reloads := 0
	for wi := range scaled(t, 10) {
		w := newWorld(r)
		ctrl := engine(t, w)
		prog := Compile(w.in)
		load := func() {
			if err := Load(conn, "x", Hook{Num: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter}, prog); err != nil {
				t.Error(err)
			}
		}
		load()
		want := judged(t, ctrl)
		var stop atomic.Bool
		done := make(chan int)
		go func() {
			n := 0
			for !stop.Load() {
				load()
				n++
			}
			done <- n
		}()
		bad := 0
		for range 3000 {
			k := randPacket(r, w)
			exp := true
			if want[k.Src] || want[k.Dst] {
				exp = ctrl.EvaluatePacket(context.Background(), net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), protoNames[k.Proto], int(k.SrcPort), int(k.DstPort))
			}
			if got := l.Allows(t, probe.Packet(k)); got != exp {
				bad++
				t.Errorf("world %d (FLOCK_SEED=%d): while the program was loaded again, %v: kernel %v, engine %v", wi, s, k, got, exp)
			}
		}
		stop.Store(true)
		reloads += <-done
		if bad > 0 {
			return
		}
	}
	t.Logf("%d loads under traffic", reloads)
	if reloads < 10 {
		t.Errorf("only %d loads happened while packets were sent", reloads)
	}
}
