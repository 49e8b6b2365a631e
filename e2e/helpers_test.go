package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// podIPs returns the result's IPs in order.
func podIPs(t *testing.T, r types.Result) []netip.Addr {
	t.Helper()
	res, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, ip := range res.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			t.Fatalf("bad IP in result: %v", ip.Address)
		}
		out = append(out, a.Unmap())
	}
	return out
}

func ipOf(ips []netip.Addr, v6 bool) netip.Addr {
	for _, ip := range ips {
		if ip.Is6() == v6 {
			return ip
		}
	}
	return netip.Addr{}
}

func prefixOf(n *net.IPNet) netip.Prefix {
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

// flockVeths lists the flock veths in the node namespace. A DEL returns
// with its veth down and unregisters it right after (the kernel takes an
// RCU grace period): the list is taken once no down one is left, or after
// 2 s, when a veth that is still there is reported as left behind.
func flockVeths(t *testing.T, ns *lab.NS) []string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		var out []string
		down := false
		err := ns.Do(func(h *netlink.Handle) error {
			links, err := h.LinkList()
			if err != nil {
				return err
			}
			for _, l := range links {
				if strings.HasPrefix(l.Attrs().Name, dataplane.VethPrefix) {
					out = append(out, l.Attrs().Name)
					down = down || l.Attrs().Flags&net.FlagUp == 0
				}
			}
			return nil
		})
		if errors.Is(err, netlink.ErrDumpInterrupted) && time.Now().Before(deadline) {
			continue // links changed during the dump
		}
		if err != nil {
			t.Fatal(err)
		}
		if !down || time.Now().After(deadline) {
			return out
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// flockRoutes lists the node's flock-installed routes other than the
// summary blackholes.
func flockRoutes(t *testing.T, ns *lab.NS) []netlink.Route {
	t.Helper()
	var out []netlink.Route
	err := ns.Dump(func(h *netlink.Handle) error {
		out = out[:0]
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := h.RouteListFiltered(fam, &netlink.Route{Protocol: dataplane.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if r.Type != 6 { // RTN_BLACKHOLE
					out = append(out, r)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// records reads the agent's store directory: committed records and the
// pending ones of ADDs in progress (<id>.pending, state pending).
func records(t *testing.T, a *lab.Agent) []store.Allocation {
	t.Helper()
	dir := filepath.Join(a.StateDir, "allocations")
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []store.Allocation
	for _, e := range ents {
		pending := strings.HasSuffix(e.Name(), ".pending")
		if !strings.HasSuffix(e.Name(), ".json") && !pending {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var r store.Allocation
		if pending && len(b) == 0 {
			continue // created, its one write not yet done
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		if pending {
			r.State = store.Pending
		}
		out = append(out, r)
	}
	return out
}

// flockctl runs the real flockctl against the agent.
func flockctl(t *testing.T, a *lab.Agent, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "flockctl"), append([]string{"--socket", a.AdminSocket}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("flockctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

type poolUse struct {
	CIDR string `json:"cidr"`
	Used uint64 `json:"used"`
}

// settledDeletes waits (up to 2 s) until no pod is in phase deleting: a
// DEL returns once the routes are withdrawn and the veth is down, and the
// IPs are released once the kernel has unregistered the veth, right after.
func settledDeletes(t *testing.T, a *lab.Agent) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		var pods []struct {
			ContainerID string `json:"containerID"`
			Phase       string `json:"phase"`
		}
		flockctlJSON(t, a, &pods, "pods")
		var deleting []string
		for _, p := range pods {
			if p.Phase == "deleting" {
				deleting = append(deleting, p.ContainerID)
			}
		}
		if len(deleting) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("pods still deleting after 2 s: %v", deleting)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// used returns the number of addresses in use per pool, via flockctl, once
// no DEL is finishing.
func used(t *testing.T, a *lab.Agent) map[string]uint64 {
	t.Helper()
	settledDeletes(t, a)
	var pools []poolUse
	if err := json.Unmarshal([]byte(flockctl(t, a, "-o", "json", "ipam")), &pools); err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, p := range pools {
		out[p.CIDR] = p.Used
	}
	return out
}

// assertClean checks that the node holds no pod state at all.
func assertClean(t *testing.T, n *node) {
	t.Helper()
	if v := flockVeths(t, n.ns); len(v) != 0 {
		t.Errorf("veths left behind: %v", v)
	}
	if r := flockRoutes(t, n.ns); len(r) != 0 {
		t.Errorf("routes left behind: %v", r)
	}
	if r := records(t, n.agent); len(r) != 0 {
		t.Errorf("store records left behind: %+v", r)
	}
	for pool, u := range used(t, n.agent) {
		if u != 0 {
			t.Errorf("pool %s still has %d addresses in use", pool, u)
		}
	}
}

type netIPNet = net.IPNet

func toIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// flockctlJSON runs flockctl -o json and decodes its output into v.
func flockctlJSON(t *testing.T, a *lab.Agent, v any, args ...string) {
	t.Helper()
	out := flockctl(t, a, append([]string{"-o", "json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("flockctl %v: %v\n%s", args, err, out)
	}
}
