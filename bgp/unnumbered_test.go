package bgp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// torPort is one port of a ToR that uses the same link-local address on
// every port: the far end of a veth pair in its own network namespace,
// holding farLL, whose BGP port is proxied to a GoBGP ToR on loopback.
type torPort struct {
	host string         // our end of the link
	far  string         // the ToR's end, in ns
	ns   netns.NsHandle // the ToR's namespace
}

// newTorPort builds the link, the namespace and the proxy, and removes all
// of them when the test ends.
func newTorPort(t *testing.T, host string, hostLL, farLL netip.Addr, port uint16, target string, stripENHE bool) torPort {
	t.Helper()
	ns, l := listenInNewNetns(t, port)
	t.Cleanup(func() { l.Close(); ns.Close() })

	far := host + "f"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: far}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("veth %s: %v", host, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) }) // takes the far end with it
	farLink, err := netlink.LinkByName(far)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(farLink, int(ns)); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	hostLink, err := netlink.LinkByName(host)
	if err != nil {
		t.Fatal(err)
	}
	if farLink, err = h.LinkByName(far); err != nil {
		t.Fatal(err)
	}
	// Exactly one link-local address on each end (no kernel-generated one,
	// which would be a second neighbour), usable at once (no DAD).
	configure := func(h *netlink.Handle, link netlink.Link, ll netip.Addr) {
		t.Helper()
		if err := h.LinkSetIP6AddrGenMode(link, 1); err != nil {
			t.Fatal(err)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: ll.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrReplace(link, addr); err != nil {
			t.Fatalf("address %s on %s: %v", ll, link.Attrs().Name, err)
		}
		if err := h.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
	hh, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	configure(hh, hostLink, hostLL)
	configure(h, farLink, farLL)
	// The ToR's link-local address as a neighbour on our end, where GoBGP
	// looks for an unnumbered peer's address. Set, not added: the kernel
	// may already have made an entry for it once the link was up (seen
	// once as "file exists").
	if err := netlink.NeighSet(&netlink.Neigh{
		LinkIndex: hostLink.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
		IP: farLL.AsSlice(), HardwareAddr: farLink.Attrs().HardwareAddr,
	}); err != nil {
		t.Fatalf("neighbour %s on %s: %v", farLL, host, err)
	}
	proxyBGP(t, l, target, stripENHE)
	return torPort{host: host, far: far, ns: ns}
}

// listenInNewNetns creates a network namespace and a TCP listener on
// [::]:port inside it. The thread that entered the namespace is never
// handed back to the runtime (it ends with its goroutine).
func listenInNewNetns(t *testing.T, port uint16) (netns.NsHandle, net.Listener) {
	t.Helper()
	type result struct {
		ns  netns.NsHandle
		l   net.Listener
		err error
	}
	ch := make(chan result)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread dies with this goroutine
		ns, err := netns.New()
		if err != nil {
			ch <- result{err: err}
			return
		}
		l, err := net.Listen("tcp", fmt.Sprintf("[::]:%d", port))
		if err != nil {
			ns.Close()
		}
		ch <- result{ns, l, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("cannot create a network namespace with a listener: %v", r.err)
	}
	return r.ns, r.l
}

// proxyBGP forwards every connection accepted on l to target (dialled from
// the test's own namespace), optionally without the extended next hop
// capability in the OPEN the target sends.
func proxyBGP(t *testing.T, l net.Listener, target string, strip bool) {
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			d, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, d)
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(d, c)
				d.Close()
			})
			wg.Go(func() {
				defer c.Close()
				if strip {
					if err := stripENHE(d, c); err != nil {
						return
					}
				}
				_, _ = io.Copy(c, d)
			})
		}
	})
}

// Defect 8: two unnumbered sessions to a ToR that uses fe80::1 on every
// port. They shared the RFC 5549 guard state and the per-peer communities
// (both keyed by the address without zone). Each must get its own guard
// decision and its own communities. Needs root: it creates two network
// namespaces and two veth pairs, and removes them.
func TestUnnumberedSharedLinkLocal(t *testing.T) {
	needRoot(t, "needs root for network namespaces and veth pairs")
	torA := startToR(t, "::1", torASN, "10.255.0.1")
	torA.addNeighbor(t, "::1", flockASN) // the proxy connects from ::1
	torB := startToR(t, "::1", tor2ASN, "10.255.0.3")
	torB.addNeighbor(t, "::1", flockASN)

	const bgpPort = 1790
	farLL := netip.MustParseAddr("fe80::1")
	name := fmt.Sprintf("flku%04x", uint16(os.Getpid()))
	// Port A offers the extended next hop capability (GoBGP always does);
	// port B's OPEN loses it on the way.
	portA := newTorPort(t, name+"a", netip.MustParseAddr("fe80::a"), farLL, bgpPort, net.JoinHostPort("::1", fmt.Sprint(torA.port)), false)
	portB := newTorPort(t, name+"b", netip.MustParseAddr("fe80::b"), farLL, bgpPort, net.JoinHostPort("::1", fmt.Sprint(torB.port)), true)

	statePath := filepath.Join(t.TempDir(), "bgp-state.json")
	sp := newSpeaker(t, func(c *Config) { c.StateFile = statePath })
	timers := v1alpha1.Timers{HoldTime: 9, KeepaliveTime: 3, ConnectRetry: 1}
	pa := v1alpha1.Peer{Interface: portA.host, ASN: torASN, Port: bgpPort, Timers: timers,
		Communities: v1alpha1.KindCommunities{Pod: []string{"64512:1"}}, LargeCommunities: v1alpha1.KindCommunities{Pod: []string{"64512:1:1"}}}
	pb := v1alpha1.Peer{Interface: portB.host, ASN: tor2ASN, Port: bgpPort, Timers: timers,
		Communities: v1alpha1.KindCommunities{Pod: []string{"64512:2"}}}
	set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod, pod4: advert.Pod, summary6: advert.Summary}, true)
	if err := sp.ApplyPeers([]v1alpha1.Peer{pa, pb}); err != nil {
		t.Fatal(err)
	}
	keyA, keyB := Key(pa), Key(pb)
	na := waitEstablished(t, sp, torA, keyA)
	nb := waitEstablished(t, sp, torB, keyB)
	if na.Address != "fe80::1" || nb.Address != "fe80::1" {
		t.Fatalf("test setup: neighbour addresses %q, %q", na.Address, nb.Address)
	}

	// Each peer its own guard decision.
	testutil.EventuallyWithin(t, waitFor, "guard decisions", func() (bool, string) {
		a, b := mustNeighbor(t, sp, keyA), mustNeighbor(t, sp, keyB)
		return !a.RFC5549Mismatch && len(a.Warnings) == 0 && b.RFC5549Mismatch, fmt.Sprintf("A %+v\nB %+v", a, b)
	})
	ribA := torA.waitRIB(t, pod6, pod4, summary6)
	ribB := torB.waitRIB(t, pod6, summary6)
	testutil.Consistently(t, "IPv4 to port A only", 2*time.Second, func() (bool, string) {
		a, b := prefixes(torA.rib(t)), prefixes(torB.rib(t))
		return len(a) == 3 && len(b) == 2, fmt.Sprintf("A %v B %v", a, b)
	})
	if nh := nextHop(ribA[pod6]); nh != netip.MustParseAddr("fe80::a") {
		t.Errorf("port A next hop %v", nh)
	}

	// Each peer its own communities.
	testutil.EventuallyWithin(t, waitFor, "per-peer communities", func() (bool, string) {
		ribA, ribB = torA.rib(t), torB.rib(t)
		stdA4, largeA4 := communities(ribA[pod4])
		stdA, largeA := communities(ribA[pod6])
		stdB, largeB := communities(ribB[pod6])
		stdAS, _ := communities(ribA[summary6])
		ok := slices.Equal(stdA, []string{"64512:1"}) && slices.Equal(largeA, []string{"64512:1:1"}) &&
			slices.Equal(stdA4, []string{"64512:1"}) && slices.Equal(largeA4, []string{"64512:1:1"}) &&
			slices.Equal(stdB, []string{"64512:2"}) && len(largeB) == 0 && len(stdAS) == 0
		return ok, fmt.Sprintf("A pod6 %v %v, A pod4 %v %v, B pod6 %v %v", stdA, largeA, stdA4, largeA4, stdB, largeB)
	})
	assertNoMarker(t, ribA)
	assertNoMarker(t, ribB)

	// The state file remembers each peer's own decision.
	b, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if good, ok := st.RFC5549[keyA]; !ok || !good {
		t.Errorf("state file %s: %s not good", b, keyA)
	}
	if st.RFC5549[keyB] {
		t.Errorf("state file %s: %s good", b, keyB)
	}

	// Removing one session leaves the other alone.
	uptime := torA.uptime(t)
	if err := sp.ApplyPeers([]v1alpha1.Peer{pa}); err != nil {
		t.Fatal(err)
	}
	torB.waitRIB(t)
	testutil.Consistently(t, "port A untouched", time.Second, func() (bool, string) {
		ok := torA.established(t) && torA.uptime(t).Equal(uptime) && len(torA.rib(t)) == 3
		return ok, fmt.Sprint(prefixes(torA.rib(t)))
	})
	if err := sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	waitNoGoBGPPeers(t, sp)
}

// needRoot skips a test that needs root when not run as root (`make unit`
// as a user), and fails it instead where root tests are required (`make
// test`, CI): a skipped test must never pass for a run test.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("FLOCK_REQUIRE_ROOT") != "" {
		t.Fatalf("%s, and FLOCK_REQUIRE_ROOT is set", why)
	}
	t.Skip(why)
}

// unnumberedPeered is a speaker peered over an unnumbered link with a ToR
// at oldLL (fe80::1), whose neighbour entry is a learnt one (which dies
// with its ToR), not the setup's permanent one.
type unnumberedPeered struct {
	sp   *Speaker
	tor  *tor
	port torPort
	key  string
	h    *netlink.Handle // in the ToR's namespace
	far  netlink.Link    // the ToR's port
}

var oldLL, newLL = netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fe80::2")

func newUnnumberedPeered(t *testing.T, prefix string, bgpPort uint16, timers v1alpha1.Timers) *unnumberedPeered {
	t.Helper()
	needRoot(t, "needs root for network namespaces and veth pairs")
	tr := startToR(t, "::1", torASN, "10.255.0.1")
	tr.addNeighbor(t, "::1", flockASN)
	name := fmt.Sprintf("%s%04x", prefix, uint16(os.Getpid()))
	port := newTorPort(t, name, netip.MustParseAddr("fe80::a"), oldLL, bgpPort, net.JoinHostPort("::1", fmt.Sprint(tr.port)), false)
	sp := newSpeaker(t)
	peer := v1alpha1.Peer{Interface: port.host, ASN: torASN, Port: bgpPort, Timers: timers}
	set(t, sp, map[netip.Prefix]advert.Kind{pod6: advert.Pod}, true)
	if err := sp.ApplyPeers([]v1alpha1.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	u := &unnumberedPeered{sp: sp, tor: tr, port: port, key: Key(peer)}
	if n := waitEstablished(t, sp, tr, u.key); n.Address != oldLL.String() {
		t.Fatalf("test setup: neighbour address %q", n.Address)
	}
	host, err := netlink.LinkByName(port.host)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighDel(&netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V6, IP: oldLL.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	if u.h, err = netlink.NewHandleAt(port.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.h.Close)
	if u.far, err = u.h.LinkByName(port.far); err != nil {
		t.Fatal(err)
	}
	return u
}

// replaceToR gives the ToR's port another MAC and newLL in place of
// oldLL (gone already if the port went down: Linux keeps no IPv6 address
// on a downed link by default).
func (u *unnumberedPeered) replaceToR(t *testing.T, mac net.HardwareAddr) {
	t.Helper()
	mask := net.CIDRMask(64, 128)
	if err := u.h.AddrDel(u.far, &netlink.Addr{IPNet: &net.IPNet{IP: oldLL.AsSlice(), Mask: mask}}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Fatal(err)
	}
	if err := u.h.LinkSetHardwareAddr(u.far, mac); err != nil {
		t.Fatal(err)
	}
	if err := u.h.AddrAdd(u.far, &netlink.Addr{IPNet: &net.IPNet{IP: newLL.AsSlice(), Mask: mask}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
}

// repeered waits for the session with the new ToR, its routes, and ends
// the peering.
func (u *unnumberedPeered) repeered(t *testing.T, within time.Duration, since time.Time) {
	t.Helper()
	testutil.EventuallyWithin(t, within, "re-peered with the new ToR", func() (bool, string) {
		n, ok := neighbor(u.sp, u.key)
		return ok && n.State == "Established" && n.Address == newLL.String(), fmt.Sprintf("%+v", n)
	})
	t.Logf("re-peered with %s %v after the replacement", newLL, time.Since(since).Round(100*time.Millisecond))
	u.tor.waitRIB(t, pod6)
	if err := u.sp.ApplyPeers(nil); err != nil {
		t.Fatal(err)
	}
	waitNoGoBGPPeers(t, u.sp)
}

// An unnumbered ToR replaced by another (new MAC, new link-local address):
// GoBGP resolved the old address once, at AddPeer, and would dial it for
// ever. The speaker notices the old neighbour is dead and a new one
// answers on the link, and peers with the new one. The port stays up (no
// carrier change): the old session ends by its hold time.
func TestUnnumberedToRReplaced(t *testing.T) {
	u := newUnnumberedPeered(t, "flkr", 1791, v1alpha1.Timers{HoldTime: 6, KeepaliveTime: 2, ConnectRetry: 1})
	u.replaceToR(t, net.HardwareAddr{0x02, 0, 0x5e, 0, 0x53, 0x02})
	u.repeered(t, 45*time.Second, time.Now())
}
