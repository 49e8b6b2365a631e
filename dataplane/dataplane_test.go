package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNewNetns runs f on a locked thread inside a fresh network namespace
// (the node), with a named one for the pod; both go afterwards.
func inNewNetns(t testing.TB, f func(podNS string)) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("FLOCK_REQUIRE_ROOT") != "" {
			t.Fatal("needs root (network namespaces), and FLOCK_REQUIRE_ROOT is set")
		}
		t.Skip("needs root (network namespaces)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // the thread dies with its namespace
		name := "flkdp-" + strings.ReplaceAll(t.Name(), "/", "-")
		pod, err := netns.NewNamed(name) // switches this thread
		if err != nil {
			t.Error(err)
			return
		}
		pod.Close()
		defer netns.DeleteNamed(name)
		node, err := netns.New()
		if err != nil {
			t.Error(err)
			return
		}
		defer node.Close()
		f("/run/netns/" + name)
	}()
	<-done
}

// inNetns runs f with a netlink handle of the named netns.
func inNetns[T any](path string, f func(*netlink.Handle) (T, error)) (T, error) {
	var zero T
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return zero, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return zero, err
	}
	defer h.Close()
	return f(h)
}

// A retired veth is down and routes nothing, but is still there (the
// kernel's slow part, unregistering it, is Teardown's); missing is fine,
// and a link of a flock name that is not a veth is refused, named.
func TestSetupRetireTeardown(t *testing.T) {
	inNewNetns(t, func(podNS string) {
		d := &Netlink{}
		p := Pod{ContainerID: "c1", HostVeth: HostVethName("c1"), Netns: podNS, IfName: "eth0",
			IPs:     []netip.Addr{netip.MustParseAddr("fd00:10::5"), netip.MustParseAddr("10.1.0.5")},
			HostMAC: RandomMAC(), PodMAC: RandomMAC()}
		link, err := d.Setup(p)
		if err != nil {
			t.Error(err)
			return
		}
		// The veth ends carry the MACs the agent picked (its record has them
		// before the kernel is touched).
		hl, err := netlink.LinkByName(p.HostVeth)
		if err != nil || hl.Attrs().HardwareAddr.String() != p.HostMAC.String() || link.HostMAC.String() != p.HostMAC.String() || link.PodMAC.String() != p.PodMAC.String() {
			t.Errorf("host veth %v (%v), Setup said %+v; want host MAC %s, pod MAC %s", hl, err, link, p.HostMAC, p.PodMAC)
		}
		// One queue each way on both ends (creating them with a queue per
		// CPU made the kernel wait for an RCU grace period per end).
		pl, err := inNetns(podNS, func(h *netlink.Handle) (netlink.Link, error) { return h.LinkByName(p.IfName) })
		for _, l := range []netlink.Link{hl, pl} {
			if err != nil || l == nil || l.Attrs().NumTxQueues != 1 || l.Attrs().NumRxQueues != 1 {
				t.Errorf("veth end %v (%v): want 1 tx and 1 rx queue", l, err)
				break
			}
		}
		if m := p.HostMAC; m[0]&0x03 != 0x02 || m.String() == p.PodMAC.String() {
			t.Errorf("RandomMAC gave %s and %s: want distinct locally administered unicast MACs", m, p.PodMAC)
		}
		// HostRoutes names each next hop's device.
		any6 := netip.MustParsePrefix("2001:db8:a::1/128")
		nh := Nexthop{Gateway: p.IPs[0], Dev: p.HostVeth}
		if err := d.SetRoute(any6, []Nexthop{nh}); err != nil {
			t.Error(err)
			return
		}
		held, err := d.HostRoutes()
		if err != nil || len(held[any6]) != 1 || held[any6][0] != nh {
			t.Errorf("HostRoutes = %v, %v; want %s via %v", held, err, any6, nh)
		}
		if err := d.Retire(p.HostVeth); err != nil {
			t.Error(err)
			return
		}
		l, err := netlink.LinkByName(p.HostVeth)
		if err != nil {
			t.Errorf("retired veth gone already: %v", err)
			return
		}
		if l.Attrs().Flags&net.FlagUp != 0 {
			t.Error("retired veth still up")
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := netlink.RouteList(l, fam)
			if err != nil {
				t.Error(err)
			}
			for _, r := range rs {
				if r.Dst != nil && r.Dst.IP.IsGlobalUnicast() {
					t.Errorf("route %s still through the retired veth", r.Dst)
				}
			}
		}
		if err := d.Teardown(p.HostVeth); err != nil {
			t.Error(err)
		}
		// A leftover host veth of the name (a crashed ADD) is replaced;
		// an interface of the pod's name in its netns is refused.
		stale := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.HostVeth}, PeerName: "stale0"}
		if err := netlink.LinkAdd(stale); err != nil {
			t.Error(err)
			return
		}
		if _, err := d.Setup(p); err != nil {
			t.Errorf("Setup over a leftover host veth: %v", err)
		}
		if _, err := netlink.LinkByName("stale0"); err == nil {
			t.Error("the leftover veth's peer is still there")
		}
		p2 := p
		p2.HostVeth = HostVethName("c3")
		if _, err := d.Setup(p2); !errors.Is(err, ErrInterfaceExists) || !strings.Contains(err.Error(), `interface "eth0" already exists`) {
			t.Errorf("Setup into a netns that has eth0: %v", err)
		}
		if _, err := netlink.LinkByName(p2.HostVeth); err == nil {
			t.Errorf("the refused Setup left its host veth %s", p2.HostVeth)
		}
		if err := d.Teardown(p.HostVeth); err != nil {
			t.Error(err)
		}
		if _, err := netlink.LinkByName(p.HostVeth); err == nil {
			t.Error("veth still there after Teardown")
		}
		if err := d.Retire(p.HostVeth); err != nil {
			t.Errorf("Retire of a missing veth: %v", err)
		}
		other := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: HostVethName("c2")}}
		if err := netlink.LinkAdd(other); err != nil {
			t.Error(err)
			return
		}
		if err := d.Retire(other.Name); err == nil || !strings.Contains(err.Error(), other.Name) || !strings.Contains(err.Error(), "not a veth") {
			t.Errorf("Retire of a bridge: %v", err)
		}
	})
}

// WatchLinks reports a flock veth deleted behind the agent's back, by
// name, and nothing for links created or changed or for links that are
// not flock's.
func TestWatchLinks(t *testing.T) {
	inNewNetns(t, func(podNS string) {
		d := &Netlink{}
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan string, 16)
		done := make(chan error, 1)
		// The watch must run in the node's namespace: this locked thread.
		watchNS, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer watchNS.Close()
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := netns.Set(watchNS); err != nil {
				done <- err
				return
			}
			done <- d.WatchLinks(ctx, func(name string) { got <- name })
		}()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("WatchLinks: %v", err)
			}
		}()
		// Until the watch has subscribed nothing is reported: repeat the
		// churn until the flock veth's deletion is.
		var reported []string
		deadline := time.Now().Add(10 * time.Second)
		for seen := false; !seen; {
			if time.Now().After(deadline) {
				t.Fatalf("no report of the deleted flock veth (reports: %v)", reported)
			}
			for i, name := range []string{"flocka1b2c3d4", "other0"} {
				if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: fmt.Sprintf("peer%d", i)}); err != nil {
					t.Fatal(err)
				}
				l, err := netlink.LinkByName(name)
				if err != nil {
					t.Fatal(err)
				}
				if err := netlink.LinkSetUp(l); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range []string{"other0", "flocka1b2c3d4"} {
				l, err := netlink.LinkByName(name)
				if err != nil {
					t.Fatal(err)
				}
				if err := netlink.LinkDel(l); err != nil {
					t.Fatal(err)
				}
			}
			timeout := time.After(200 * time.Millisecond)
		drain:
			for {
				select {
				case name := <-got:
					reported = append(reported, name)
					seen = seen || name == "flocka1b2c3d4"
				case <-timeout:
					break drain
				}
			}
		}
		for _, name := range reported {
			if name != "flocka1b2c3d4" {
				t.Errorf("gone(%q): want reports of the flock veth only (all: %v)", name, reported)
			}
		}
	})
}

// The link watch's socket filter lets RTM_DELLINK through and nothing
// else: creating a link, taking it up and down reaches the watch as the
// one deletion.
func TestDelLinkFilter(t *testing.T) {
	inNewNetns(t, func(string) {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, delLinkFilter()); err != nil {
			t.Fatalf("attaching the filter: %v", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_LINK - 1)}); err != nil {
			t.Fatal(err)
		}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000}); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "flocka1b2c3d4"}, PeerName: "peer0"}); err != nil {
			t.Fatal(err)
		}
		l, err := netlink.LinkByName("flocka1b2c3d4")
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range []func(netlink.Link) error{netlink.LinkSetUp, netlink.LinkSetDown, netlink.LinkDel} {
			if err := op(l); err != nil {
				t.Fatal(err)
			}
		}
		var deleted []string
		buf := make([]byte, 64<<10)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := syscall.ParseNetlinkMessage(buf[:n])
			if err != nil {
				t.Fatal(err)
			}
			for i := range msgs {
				if msgs[i].Header.Type != unix.RTM_DELLINK {
					t.Errorf("message of type %d passed the filter", msgs[i].Header.Type)
					continue
				}
				deleted = append(deleted, deletedLinkName(&msgs[i]))
			}
		}
		// Both ends of the veth go; the flock end must be among them.
		if !slices.Contains(deleted, "flocka1b2c3d4") {
			t.Errorf("deletions seen: %v, want flocka1b2c3d4 among them", deleted)
		}
	})
}
