package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// The FIB watch counts the routes either ToR installs (BIRD's protocol,
// and zebra's for FRR's bgpd) and nothing else: a rack against FRR timed
// out waiting for routes FRR had installed, because only BIRD's were
// counted.
func TestWatchFIBCountsBothToRs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root for a network namespace (the e2e suite runs as root)")
	}
	ns, err := NewNS(fmt.Sprintf("flkfib%d", os.Getpid()%10000))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Delete()
	w, err := WatchFIB(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	routes := map[string]netlink.RouteProtocol{"2001:db8:f1::/64": rtprotBird, "2001:db8:f2::/64": rtprotBGP, "2001:db8:f3::/64": 4 /* static */}
	if err := ns.Do(func(h *netlink.Handle) error {
		d, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(d); err != nil {
			return err
		}
		for dst, proto := range routes {
			_, n, _ := net.ParseCIDR(dst)
			if err := h.RouteAdd(&netlink.Route{LinkIndex: d.Attrs().Index, Dst: n, Protocol: proto}); err != nil {
				return fmt.Errorf("route %s: %w", dst, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	within := netip.MustParsePrefix("2001:db8::/32")
	if _, err := w.WaitCount(within, 2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WaitPresent(netip.MustParsePrefix("2001:db8:f2::/64"), time.Second); err != nil {
		t.Errorf("FRR's route: %v", err)
	}
	if _, err := w.WaitPresent(netip.MustParsePrefix("2001:db8:f3::/64"), 200*time.Millisecond); err == nil {
		t.Error("a static route was counted as the ToR's")
	}
}
