package bgp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// What a carrier change does to an unnumbered peer: a lost carrier
// forgets the resolved neighbour and drops the peer to be added again;
// carrier back asks the link who is there and wakes the add goroutines;
// other links and established sessions are left alone.
func TestCarrierDecisions(t *testing.T) {
	old := netip.MustParseAddr("fe80::1")
	cases := []struct {
		name         string
		iface        string
		up           bool
		established  bool
		added        bool
		wantForget   bool
		wantSolicit  bool
		wantWoken    bool
		wantReadd    bool // readdLocked asked GoBGP to delete the peer
		wantSinceNow bool
	}{
		{name: "carrier lost", iface: "eth9", established: true, added: true, wantForget: true, wantReadd: true},
		{name: "carrier lost while adding", iface: "eth9"},
		{name: "another link lost", iface: "eth8", established: true, added: true},
		{name: "carrier back", iface: "eth9", up: true, wantSolicit: true, wantWoken: true},
		{name: "carrier back, established", iface: "eth9", up: true, established: true, added: true, wantSolicit: true, wantWoken: true},
		{name: "carrier back, added but down", iface: "eth9", up: true, added: true, wantSolicit: true, wantWoken: true, wantReadd: true},
		{name: "another link back", iface: "eth8", up: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fn := &fakeNeighbours{}
			sp := newIdleSpeaker(t, func(cfg *Config) { cfg.Neighbours = fn })
			st := bgp.BGP_FSM_ACTIVE
			if c.established {
				st = bgp.BGP_FSM_ESTABLISHED
			}
			since := time.Now().Add(-time.Hour)
			p := &peer{key: "interface eth9", spec: v1alpha1.Peer{Interface: "eth9", ASN: 64513}, added: c.added, enabled: c.added,
				apiAddr: old.WithZone("eth9"), state: st, since: since}
			sp.mu.Lock()
			sp.peers[p.key] = p
			sp.mu.Unlock()
			woken := sp.linkUp.wait()
			sp.handleCarrier(context.Background(), Carrier{Iface: c.iface, Up: c.up}, time.Now())
			if forgot := len(fn.forgotten) == 1 && fn.forgotten[0] == old; forgot != c.wantForget {
				t.Errorf("forgot the neighbour: %v, want %v (%v)", forgot, c.wantForget, fn.forgotten)
			}
			if (fn.solicited > 0) != c.wantSolicit {
				t.Errorf("solicited %d times, want solicit %v", fn.solicited, c.wantSolicit)
			}
			select {
			case <-woken:
				if !c.wantWoken {
					t.Error("woke the add goroutines")
				}
			default:
				if c.wantWoken {
					t.Error("did not wake the add goroutines")
				}
			}
			// GoBGP has no such peer: the delete fails, the peer stays
			// added, and readdLocked has cleared enabled all the same.
			sp.mu.Lock()
			readd := c.added && !p.enabled
			sp.mu.Unlock()
			if readd != c.wantReadd {
				t.Errorf("dropped the peer to add it again: %v, want %v", readd, c.wantReadd)
			}
		})
	}
}

// watchCarrier watches the kernel's carrier until the test ends.
func watchCarrier(t *testing.T) <-chan Carrier {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := kernelLinks{}.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
	})
	return ch
}

// upVeth makes the veth pair name, name+"p" with both ends up (removed
// when the test ends, if still there).
func upVeth(t *testing.T, name string) *netlink.Veth {
	t.Helper()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	for _, n := range []string{name, name + "p"} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	return veth
}

// nextCarrier waits for the next change of name's carrier and tells
// whether it came, and came as want.
func nextCarrier(ch <-chan Carrier, name string, want bool, within time.Duration) bool {
	timeout := time.After(within)
	for {
		select {
		case c := <-ch:
			if c.Iface == name {
				return c.Up == want
			}
		case <-timeout:
			return false
		}
	}
}

// The kernel's carrier reaches the speaker: a veth whose far end goes
// down and up is reported down, then up, and nothing is reported for the
// states found at the start.
func TestKernelLinksCarrier(t *testing.T) {
	needRoot(t, "needs root for a veth pair")
	name := fmt.Sprintf("flkc%04x", uint16(os.Getpid()))
	ch := watchCarrier(t)
	upVeth(t, name)
	far, err := netlink.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	// Down when made, up once both ends are; then the far end flaps.
	for _, step := range []struct {
		set  func(netlink.Link) error
		want bool
	}{{nil, true}, {netlink.LinkSetDown, false}, {netlink.LinkSetUp, true}} {
		if step.set != nil {
			if err := step.set(far); err != nil {
				t.Fatal(err)
			}
		}
		if !nextCarrier(ch, name, step.want, 10*time.Second) {
			t.Fatalf("carrier of %s: no change to up %v reported", name, step.want)
		}
	}
}

// A link deleted while up reports its carrier lost; made again and up,
// its carrier back.
func TestKernelLinksDeleted(t *testing.T) {
	needRoot(t, "needs root for a veth pair")
	name := fmt.Sprintf("flkd%04x", uint16(os.Getpid()))
	ch := watchCarrier(t)
	veth := upVeth(t, name)
	if !nextCarrier(ch, name, true, 3*time.Second) {
		t.Fatal("no up")
	}
	if err := netlink.LinkDel(veth); err != nil {
		t.Fatal(err)
	}
	if !nextCarrier(ch, name, false, 3*time.Second) {
		t.Error("deleted link: no carrier loss reported")
	}
	upVeth(t, name)
	if !nextCarrier(ch, name, true, 3*time.Second) {
		t.Error("re-made link: carrier up not reported")
	}
}

// An unnumbered ToR replaced by another whose port comes up with a new
// MAC and link-local address: the speaker sees its link lose the carrier
// and come back, and peers with the new ToR. The hold time is ten
// minutes, so the old session cannot end by it within the test: only the
// carrier can have ended it.
func TestUnnumberedToRReplacedCarrier(t *testing.T) {
	u := newUnnumberedPeered(t, "flkq", 1792, v1alpha1.Timers{HoldTime: 600, KeepaliveTime: 200, ConnectRetry: 1})
	if err := u.h.LinkSetDown(u.far); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 20*time.Second, "the session dropped with the carrier", func() (bool, string) {
		n, ok := neighbor(u.sp, u.key)
		return !ok || n.State != "Established", fmt.Sprintf("%+v", n)
	})
	u.replaceToR(t, net.HardwareAddr{0x02, 0, 0x5e, 0, 0x53, 0x03})
	if err := u.h.LinkSetUp(u.far); err != nil {
		t.Fatal(err)
	}
	u.repeered(t, 30*time.Second, time.Now())
}

// While a link has no carrier, its peer is not added (the old ToR's
// address, still in the table, would be resolved and dialled); carrier
// back clears that, and forgets the neighbours still being resolved or
// failed, which GoBGP would take for a second neighbour on the link.
func TestCarrierBackForgetsFailedNeighbours(t *testing.T) {
	stale, fresh := netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fe80::2")
	fn := &fakeNeighbours{table: []Neighbour{{Addr: stale, Failed: true}, {Addr: fresh, Reachable: true}}}
	sp := newIdleSpeaker(t, func(cfg *Config) { cfg.Neighbours = fn })
	p := &peer{key: "interface eth9", spec: v1alpha1.Peer{Interface: "eth9", ASN: 64513}}
	sp.mu.Lock()
	sp.peers[p.key] = p
	sp.mu.Unlock()
	sp.handleCarrier(context.Background(), Carrier{Iface: "eth9", Up: false}, time.Now())
	if !sp.carrierLost("eth9") || sp.carrierLost("eth8") {
		t.Errorf("carrier lost: eth9 %v, eth8 %v; want true, false", sp.carrierLost("eth9"), sp.carrierLost("eth8"))
	}
	sp.handleCarrier(context.Background(), Carrier{Iface: "eth9", Up: true}, time.Now())
	if sp.carrierLost("eth9") {
		t.Error("carrier back, still lost")
	}
	if fmt.Sprint(fn.forgotten) != fmt.Sprint([]netip.Addr{stale}) {
		t.Errorf("forgot %v, want only the failed %v", fn.forgotten, stale)
	}
}
