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

// The kernel's carrier reaches the speaker: a veth whose far end goes
// down and up is reported down, then up, and nothing is reported for the
// states found at the start.
func TestKernelLinksCarrier(t *testing.T) {
	needRoot(t, "needs root for a veth pair")
	name := fmt.Sprintf("flkc%04x", uint16(os.Getpid()))
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := kernelLinks{}.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		for range ch {
		}
	}()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(veth)
	far, err := netlink.LinkByName(name + "p")
	if err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []netlink.Link{host, far} {
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	next := func(want bool) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case c := <-ch:
				if c.Iface != name {
					continue
				}
				if c.Up != want {
					t.Fatalf("carrier of %s: up %v, want %v", name, c.Up, want)
				}
				return
			case <-timeout:
				t.Fatalf("no carrier change (up %v) of %s reported", want, name)
			}
		}
	}
	next(true) // down when made, up once both ends are
	if err := netlink.LinkSetDown(far); err != nil {
		t.Fatal(err)
	}
	next(false)
	if err := netlink.LinkSetUp(far); err != nil {
		t.Fatal(err)
	}
	next(true)
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
