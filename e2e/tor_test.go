package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// tor is what a scenario asks of the ToR, answered by the ToR's own CLI.
type tor interface {
	// paths is the number of BGP paths the ToR holds for exactly p.
	paths(t *testing.T, p netip.Prefix) int
	// nexthops lists the BGP next hops of those paths.
	nexthops(t *testing.T, p netip.Prefix) []string
	// sessionUp tells whether the session to node n is established.
	sessionUp(t *testing.T, n *lab.LabNode) bool
	dump(t *testing.T) string
}

type birdTor struct{ l *lab.BGPLab }

func (b birdTor) show(t *testing.T, p netip.Prefix) string {
	t.Helper()
	out, err := b.l.Bird.Cmd("show route " + p.String() + " all")
	if err != nil && !strings.Contains(out, "Network not found") {
		t.Fatal(err)
	}
	return out
}

func (b birdTor) paths(t *testing.T, p netip.Prefix) int {
	return strings.Count(b.show(t, p), "BGP.as_path")
}

var birdNH = regexp.MustCompile(`BGP\.next_hop: (\S+)`)

func (b birdTor) nexthops(t *testing.T, p netip.Prefix) []string {
	var out []string
	for _, m := range birdNH.FindAllStringSubmatch(b.show(t, p), -1) {
		out = append(out, m[1])
	}
	return out
}

func (b birdTor) sessionUp(t *testing.T, n *lab.LabNode) bool {
	out, err := b.l.Bird.Cmd("show protocols " + n.Name)
	if err != nil {
		return false
	}
	return strings.Contains(out, "Established")
}

func (b birdTor) dump(t *testing.T) string {
	out, _ := b.l.Bird.Cmd("show protocols all")
	r, _ := b.l.Bird.Cmd("show route all")
	return out + "\n" + r + "\n" + b.l.Bird.Log()
}

type frrTor struct{ l *lab.BGPLab }

func (f frrTor) route(t *testing.T, p netip.Prefix) []struct {
	Nexthops []struct {
		IP string `json:"ip"`
	} `json:"nexthops"`
} {
	t.Helper()
	fam := "ipv6"
	if p.Addr().Is4() {
		fam = "ipv4"
	}
	out, err := f.l.FRR.Vtysh(fmt.Sprintf("show bgp %s unicast %s json", fam, p))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Prefix string `json:"prefix"`
		Paths  []struct {
			Nexthops []struct {
				IP string `json:"ip"`
			} `json:"nexthops"`
		} `json:"paths"`
	}
	if strings.TrimSpace(out) == "" || strings.TrimSpace(out) == "{}" {
		return nil
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("vtysh json: %v\n%s", err, out)
	}
	if r.Prefix != p.String() {
		return nil // FRR answered with a covering prefix
	}
	return r.Paths
}

func (f frrTor) paths(t *testing.T, p netip.Prefix) int { return len(f.route(t, p)) }

func (f frrTor) nexthops(t *testing.T, p netip.Prefix) []string {
	var out []string
	for _, path := range f.route(t, p) {
		for _, nh := range path.Nexthops {
			out = append(out, nh.IP)
		}
	}
	return out
}

func (f frrTor) sessionUp(t *testing.T, n *lab.LabNode) bool {
	out, err := f.l.FRR.Vtysh("show bgp neighbors json")
	if err != nil {
		return false
	}
	var m map[string]struct {
		BGPState string `json:"bgpState"`
		Hostname string `json:"hostname"`
	}
	if json.Unmarshal([]byte(out), &m) != nil {
		return false
	}
	for peer, st := range m {
		if (peer == n.V6.String() || strings.Contains(peer, n.TorIf)) && st.BGPState == "Established" {
			return true
		}
		// An unnumbered peer is listed under its link-local address.
		if ll, err := n.NS.LinkLocal(n.Uplink); err == nil && peer == ll.String() && st.BGPState == "Established" {
			return true
		}
	}
	return false
}

func (f frrTor) dump(t *testing.T) string {
	a, _ := f.l.FRR.Vtysh("show bgp summary")
	b, _ := f.l.FRR.Vtysh("show bgp ipv6 unicast")
	c, _ := f.l.FRR.Vtysh("show bgp ipv4 unicast")
	return a + "\n" + b + "\n" + c + "\n" + f.l.FRR.Log()
}

// torKernelNexthops counts the next hops of the ToR's kernel route for p
// (what the ToR actually forwards with: ECMP shows as several).
func torKernelNexthops(t *testing.T, l *lab.BGPLab, p netip.Prefix) int {
	t.Helper()
	n := 0
	err := l.Tor.Dump(func(h *netlink.Handle) error {
		n = 0
		fam := netlink.FAMILY_V6
		if p.Addr().Is4() {
			fam = netlink.FAMILY_V4
		}
		rs, err := h.RouteListFiltered(fam, &netlink.Route{Dst: toIPNet(p)}, netlink.RT_FILTER_DST)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if len(r.MultiPath) > 0 {
				n += len(r.MultiPath)
			} else {
				n++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
