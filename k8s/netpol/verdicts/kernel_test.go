package verdicts

import (
	"context"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/google/nftables"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/verdicts/probe"
)

// TestKernelDifferential: the rendered program, run by the kernel,
// decides every packet as the engine does (and lets every packet the
// engine does not judge pass).
func TestKernelDifferential(t *testing.T) {
	l := probe.New(t)
	conn, err := NewConn(int(l.NS))
	if err != nil {
		t.Fatal(err)
	}
	load := func(p *Program) {
		t.Helper()
		if err := Load(conn, "flock-verdicts-test", Hook{Num: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter}, p); err != nil {
			t.Fatalf("load the program: %v", err)
		}
	}
	s := seed(t)
	t.Logf("FLOCK_SEED=%d", s)
	r := rand.New(rand.NewPCG(s, 0x6b65))
	worlds, packets := scaled(t, 200), 150
	if testing.Short() {
		worlds = 30
	}
	verdicts := map[bool]int{}
	for wi := range worlds {
		w := newWorld(r)
		ctrl := engine(t, w)
		prog := Compile(w.in)
		load(prog)
		want := judged(t, ctrl)
		for range packets {
			k := randPacket(r, w)
			got := l.Allows(t, probe.Packet(k))
			exp := true
			if want[k.Src] || want[k.Dst] {
				exp = ctrl.EvaluatePacket(context.Background(), net.IP(k.Src.AsSlice()), net.IP(k.Dst.AsSlice()), protoNames[k.Proto], int(k.SrcPort), int(k.DstPort))
			}
			verdicts[exp]++
			if got != exp {
				t.Fatalf("world %d (FLOCK_SEED=%d): packet %s → %s proto %d port %d: kernel %v, engine %v (program %v)\n%s", wi, s, k.Src, k.Dst, k.Proto, k.DstPort, got, exp, prog.Allows(k), describe(w))
			}
		}
	}
	t.Logf("%d packets through the kernel: %d passed, %d dropped", l.Sent, verdicts[true], verdicts[false])
	if verdicts[false] < worlds {
		t.Errorf("only %d packets dropped in %d worlds: the corpus tests little", verdicts[false], worlds)
	}
}
