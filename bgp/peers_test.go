package bgp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// gobgpPeers lists the peers the speaker's GoBGP server holds.
func gobgpPeers(t *testing.T, sp *Speaker) []string {
	t.Helper()
	var out []string
	if err := sp.srv.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
		out = append(out, p.GetState().GetNeighborAddress())
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func waitAdded(t *testing.T, sp *Speaker, key string) Neighbor {
	t.Helper()
	var n Neighbor
	testutil.EventuallyWithin(t, waitFor, key+" added", func() (bool, string) {
		var ok bool
		n, ok = neighbor(sp, key)
		return ok && n.State != Configuring && n.State != Resolving && n.Address != "", fmt.Sprintf("%+v", n)
	})
	return n
}

// A peer whose GoBGP address was never learnt is still deleted (by its
// configured address): GoBGP's DeletePeer panics on an empty address.
func TestRemovePeerWithoutListedAddress(t *testing.T) {
	sp := newSpeaker(t)
	p := v1alpha1.Peer{Address: "::1", Port: freePort(t, "::1"), ASN: torASN, Timers: v1alpha1.Timers{ConnectRetry: 1}}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	waitAdded(t, sp, "::1")
	if got := gobgpPeers(t, sp); !slices.Equal(got, []string{"::1"}) {
		t.Fatalf("GoBGP peers %v", got)
	}
	sp.mu.Lock()
	sp.peers["::1"].apiAddr = netip.Addr{}
	sp.mu.Unlock()
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	waitNoGoBGPPeers(t, sp)
}

// waitNoGoBGPPeers waits until Run has removed every peer from GoBGP.
func waitNoGoBGPPeers(t *testing.T, sp *Speaker) {
	t.Helper()
	testutil.EventuallyWithin(t, waitFor, "GoBGP has no peers", func() (bool, string) {
		got := gobgpPeers(t, sp)
		return len(got) == 0, fmt.Sprint(got)
	})
}

// TestInterfacePeerRemove adds an unnumbered peer on a veth whose
// neighbour table holds one (permanent) link-local neighbour, then removes
// it, also after the neighbour is gone. Needs root (CAP_NET_ADMIN); it
// creates and deletes a veth pair in the current network namespace.
func TestInterfacePeerRemove(t *testing.T) {
	needRoot(t, "needs root to create a veth pair")
	name := fmt.Sprintf("flkt%x", uint16(os.Getpid()))
	la := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name + "a"}, PeerName: name + "b"}
	if err := netlink.LinkAdd(la); err != nil {
		t.Fatalf("cannot create a veth pair: %v", err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(la) })
	link, err := netlink.LinkByName(la.Name)
	if err != nil {
		t.Fatal(err)
	}
	peerLink, err := netlink.LinkByName(la.PeerName)
	if err != nil {
		t.Fatal(err)
	}
	// Both ends up, so that the link-local address (which GoBGP needs as
	// the session's source) passes duplicate address detection.
	for _, l := range []netlink.Link{link, peerLink} {
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	neigh := &netlink.Neigh{
		LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("fe80::beef"), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0xbe, 0xef},
	}
	if err := netlink.NeighAdd(neigh); err != nil {
		t.Fatal(err)
	}

	sp := newSpeaker(t)
	key := "interface " + la.Name
	p := v1alpha1.Peer{Interface: la.Name, ASN: torASN, Timers: v1alpha1.Timers{ConnectRetry: 1}}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	n := waitAdded(t, sp, key)
	if n.Address != "fe80::beef" || n.LastError != "" {
		t.Errorf("neighbour %+v", n)
	}
	if got := gobgpPeers(t, sp); len(got) != 1 {
		t.Fatalf("GoBGP peers %v", got)
	}

	// Remove it (GoBGP v4.8.0 panics on a DeletePeer by interface alone).
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	waitNoGoBGPPeers(t, sp)

	// Again, and it can be removed after its neighbour entry is gone.
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	if n := waitAdded(t, sp, key); n.LastError != "" {
		t.Errorf("re-added: %+v", n)
	}
	if err := netlink.NeighDel(neigh); err != nil {
		t.Fatal(err)
	}
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	waitNoGoBGPPeers(t, sp)
}

// Community-only updates while a peer is still being added (here: an
// unnumbered peer whose interface does not exist, so adding retries) must
// not race with the add goroutine.
func TestApplyPeersWhileAdding(t *testing.T) {
	sp := newSpeaker(t)
	p := v1alpha1.Peer{Interface: "flk-nonexist0", ASN: torASN}
	if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
		t.Fatal(err)
	}
	// Changes spread over the adder's retries (100 ms, doubling): the
	// sleep places them, it waits for nothing.
	for i := range 10 {
		p.Communities.Pod = []string{fmt.Sprintf("64512:%d", i)}
		if err := sp.ApplyPeers([]v1alpha1.Peer{p}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	testutil.Eventually(t, "the adder's error", func() (bool, string) {
		n := mustNeighbor(t, sp, "interface flk-nonexist0")
		return n.LastError != "", fmt.Sprintf("%+v", n)
	})
	if n := mustNeighbor(t, sp, "interface flk-nonexist0"); n.State != Resolving {
		t.Errorf("neighbour %+v, want Resolving", n)
	}
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	if n := sp.Neighbors(context.Background()); len(n) != 0 {
		t.Errorf("Neighbors = %+v", n)
	}
}
