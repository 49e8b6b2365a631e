package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// TestAnycastAndAddresses: anycast IPs land on the pod's eth0 (the IPv6 one
// deprecated, so never a source) and out of the result, `addresses` on eth0
// and in the result; the runtime's loopback plugin still succeeds after
// flock's ADD; the host routes them via the pod's eth0 IP, with one ECMP
// route for two replicas on the node, withdrawn with the last one.
func TestAnycastAndAddresses(t *testing.T) {
	n := startNode(t, defaultConfig)
	ctx := ctxT(t)
	const any6, any4, pub6 = "2001:db8:a::1", "203.0.113.10", "2001:db8:b::7"
	mk := func(id, name string, extra ...string) lab.Pod {
		return lab.Pod{ContainerID: id, NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", name, extra...)}
	}
	a := mk("any01", "web-a", "flock.fritzlab.net/anycast", any6+","+any4, "flock.fritzlab.net/addresses", pub6)
	b := mk("any02", "web-b", "flock.fritzlab.net/anycast", any6+","+any4)
	ra, err := n.cni.Add(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	ipsA := podIPs(t, ra)
	if len(ipsA) != 3 || ipsA[2] != mustAddr(pub6) {
		t.Fatalf("result IPs %v: want IPv6, IPv4, then the addresses IP %s", ipsA, pub6)
	}
	rb, err := n.cni.Add(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	ipsB := podIPs(t, rb)

	// Pod a: anycast and addresses on eth0.
	err = a.NS.Do(func(h *netlink.Handle) error {
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := h.AddrList(eth0, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, ip := range []string{any6, any4, pub6} {
			found := false
			for _, ad := range addrs {
				if ad.IP.String() != ip {
					continue
				}
				found = true
				if ad.Flags&unix.IFA_F_TENTATIVE != 0 {
					t.Errorf("%s is tentative", ip)
				}
				if deprecated := ad.Flags&unix.IFA_F_DEPRECATED != 0; ip == any6 != deprecated {
					t.Errorf("%s: deprecated %v (flags %#x): want only the IPv6 anycast IP deprecated", ip, deprecated, ad.Flags)
				}
			}
			if !found {
				t.Errorf("%s not on pod eth0", ip)
			}
		}
		// Never an anycast IP as the source, even towards its own prefix
		// (a reply would reach whichever replica is nearest).
		for _, dst := range []string{"2001:db8:a::99", "203.0.113.99"} {
			rs, err := h.RouteGet(net.ParseIP(dst))
			if err != nil {
				return err
			}
			if src := rs[0].Src.String(); src == any6 || src == any4 {
				t.Errorf("source towards %s: the anycast IP %s", dst, src)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The runtime's loopback plugin (containerd runs it beside flock's
	// ADD) refuses an lo that holds anything but loopback addresses.
	if err := runLoopback(ctx, t, a); err != nil {
		t.Errorf("the loopback plugin after flock's ADD: %v", err)
	}

	vethA, vethB := dataplane.HostVethName(a.ContainerID), dataplane.HostVethName(b.ContainerID)
	wantNH := map[string][]string{
		any6: {ipOf(ipsA, true).String() + "%" + vethA, ipOf(ipsB, true).String() + "%" + vethB},
		any4: {ipOf(ipsA, false).String() + "%" + vethA, ipOf(ipsB, false).String() + "%" + vethB},
		pub6: {ipOf(ipsA, true).String() + "%" + vethA},
	}
	checkRoutes(t, n, wantNH)
	for _, ip := range []string{any6, any4, pub6} {
		if err := lab.Ping(n.ns, mustAddr(ip), 5*time.Second); err != nil {
			t.Error(err)
		}
	}
	// The agent's own view agrees.
	out := flockctl(t, n.agent, "routes")
	for ip := range wantNH {
		if !strings.Contains(out, ip) {
			t.Errorf("flockctl routes does not list %s:\n%s", ip, out)
		}
	}

	// A second pod may not bind the same `addresses` IP.
	c := mk("any03", "thief", "flock.fritzlab.net/addresses", pub6)
	if _, err := n.cni.Add(ctx, c); err == nil || !strings.Contains(err.Error(), pub6) || !strings.Contains(err.Error(), a.ContainerID) {
		t.Errorf("second claim of %s: want an error naming the IP and the owner, got %v", pub6, err)
	}

	// Delete a: anycast keeps b as its only next hop, pub6 goes away.
	if err := n.cni.Del(ctx, a); err != nil {
		t.Fatal(err)
	}
	checkRoutes(t, n, map[string][]string{
		any6: {ipOf(ipsB, true).String() + "%" + vethB},
		any4: {ipOf(ipsB, false).String() + "%" + vethB},
	})
	if err := lab.Ping(n.ns, mustAddr(any6), 5*time.Second); err != nil {
		t.Errorf("anycast unreachable after one replica left: %v", err)
	}
	if err := n.cni.Del(ctx, b); err != nil {
		t.Fatal(err)
	}
	assertClean(t, n)
}

// checkRoutes compares the node's flock gateway routes with want
// (dst → sorted "gw%dev" next hops).
func checkRoutes(t *testing.T, n *node, want map[string][]string) {
	t.Helper()
	got := map[string][]string{}
	err := n.ns.Do(func(h *netlink.Handle) error {
		for _, r := range flockRoutes(t, n.ns) {
			if r.Gw == nil && len(r.MultiPath) == 0 {
				continue // pod host route
			}
			dst := r.Dst.IP.String()
			hops := r.MultiPath
			if len(hops) == 0 {
				hops = []*netlink.NexthopInfo{{LinkIndex: r.LinkIndex, Gw: r.Gw}}
			}
			for _, nh := range hops {
				l, err := h.LinkByIndex(nh.LinkIndex)
				if err != nil {
					return err
				}
				got[dst] = append(got[dst], nh.Gw.String()+"%"+l.Attrs().Name)
			}
			slices.Sort(got[dst])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range want {
		slices.Sort(want[k])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("gateway routes:\n got  %v\n want %v", got, want)
	}
}

// TestSummaryBlackholes: each node summary has a kernel blackhole route.
func TestSummaryBlackholes(t *testing.T) {
	n := startNode(t, defaultConfig)
	var got []string
	err := n.ns.Dump(func(h *netlink.Handle) error {
		got = got[:0]
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := h.RouteListFiltered(fam, &netlink.Route{Protocol: dataplane.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				return err
			}
			for _, r := range rs {
				if r.Type == unix.RTN_BLACKHOLE {
					got = append(got, r.Dst.String())
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"10.1.1.0/24", "fd00:10:1::/64"}; !slices.Equal(got, want) {
		t.Fatalf("blackholes %v, want %v (summaries only, not shared pools)", got, want)
	}
}

// TestSpecVersions: ADD, CHECK and DEL through libcni for every supported
// spec version, and VERSION reports them all.
func TestSpecVersions(t *testing.T) {
	n := startNode(t, defaultConfig)
	ctx := ctxT(t)
	info, err := n.cni.Config.GetVersionInfo(ctx, "flock")
	if err != nil {
		t.Fatal(err)
	}
	versions := []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	for _, v := range versions {
		if !slices.Contains(info.SupportedVersions(), v) {
			t.Errorf("VERSION does not list %s: %v", v, info.SupportedVersions())
		}
	}
	for i, v := range versions {
		t.Run(v, func(t *testing.T) {
			c, err := lab.NewCNI(binDir, t.TempDir(), n.agent.CNISocket, v)
			if err != nil {
				t.Fatal(err)
			}
			pod := lab.Pod{ContainerID: fmt.Sprintf("ver%02d", i), NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", "v"+v)}
			res, err := c.Add(ctx, pod)
			if err != nil {
				t.Fatal(err)
			}
			if res.Version() != v {
				t.Errorf("result version %s, want %s", res.Version(), v)
			}
			if ips := podIPs(t, res); len(ips) != 2 {
				t.Errorf("result IPs %v", ips)
			}
			if v != "0.3.1" { // CHECK exists from 0.4.0 on
				if err := c.Check(ctx, pod); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			if v == "1.1.0" {
				if err := c.Status(ctx); err != nil {
					t.Errorf("STATUS: %v", err)
				}
			}
			if err := c.Del(ctx, pod); err != nil {
				t.Fatal(err)
			}
		})
	}
	assertClean(t, n)
}

// TestGC: CNI GC releases every attachment the runtime no longer lists.
func TestGC(t *testing.T) {
	n := startNode(t, defaultConfig)
	ctx := ctxT(t)
	var pods []lab.Pod
	for i := range 3 {
		p := lab.Pod{ContainerID: fmt.Sprintf("gc%02d", i), NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", fmt.Sprintf("gc%d", i))}
		if _, err := n.cni.Add(ctx, p); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	if err := n.cni.GC(ctx, []types.GCAttachment{{ContainerID: pods[1].ContainerID, IfName: "eth0"}}); err != nil {
		t.Fatal(err)
	}
	recs := records(t, n.agent)
	if len(recs) != 1 || recs[0].ContainerID != pods[1].ContainerID {
		t.Fatalf("after GC the store holds %+v, want only %s", recs, pods[1].ContainerID)
	}
	if v := flockVeths(t, n.ns); len(v) != 1 || v[0] != dataplane.HostVethName(pods[1].ContainerID) {
		t.Errorf("veths after GC: %v", v)
	}
	if err := n.cni.Del(ctx, pods[1]); err != nil {
		t.Fatal(err)
	}
	assertClean(t, n)
}

// TestDataplaneFailureRollsBack: failures after netlink work started (the
// pod already has an eth0; the netns does not exist) leave nothing behind.
func TestDataplaneFailureRollsBack(t *testing.T) {
	n := startNode(t, defaultConfig)
	ctx := ctxT(t)
	podNS := newNS(t, "flkp-")
	if err := podNS.Do(func(h *netlink.Handle) error {
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "other0"})
	}); err != nil {
		t.Fatal(err)
	}
	_, err := n.cni.Add(ctx, lab.Pod{ContainerID: "taken01", NS: podNS, Args: lab.PodArgs("default", "taken")})
	if err == nil || !strings.Contains(err.Error(), `"eth0" already exists`) {
		t.Fatalf("ADD into a netns that has eth0: want 'already exists', got %v", err)
	}
	assertClean(t, n)

	// IPv6 disabled in the pod: the veth exists by the time adding the /128
	// fails, so this exercises the rollback of real kernel state.
	noV6 := newNS(t, "flkp-")
	if err := noV6.InNS(func() error {
		for _, k := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err = n.cni.Add(ctx, lab.Pod{ContainerID: "nov601", NS: noV6, Args: lab.PodArgs("default", "nov6")})
	if err == nil || !strings.Contains(err.Error(), "eth0: add fd00:10:1:") {
		t.Fatalf("ADD into a netns without IPv6: want an error adding the /128, got %v", err)
	}
	assertClean(t, n)
	assertPodNSEmpty(t, noV6)

	gone := &lab.NS{Name: "missing", Path: "/run/netns/flock-does-not-exist"}
	_, err = n.cni.Add(ctx, lab.Pod{ContainerID: "nons01", NS: gone, Args: lab.PodArgs("default", "nons")})
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInvalidNetNS || !strings.Contains(te.Msg, gone.Path) {
		t.Fatalf("ADD into a missing netns: want code 8 naming %s, got %v", gone.Path, err)
	}
	assertClean(t, n)
}

// TestEmbedAlgo: replicas of one app share the embed sub-prefix.
func TestEmbedAlgo(t *testing.T) {
	n := startNode(t, defaultConfig)
	ctx := ctxT(t)
	var v6 []netip.Addr
	for i := range 3 {
		app := "api"
		if i == 2 {
			app = "db"
		}
		p := lab.Pod{ContainerID: fmt.Sprintf("emb%02d", i), NS: newNS(t, "flkp-"),
			Args: lab.PodArgs("shop", fmt.Sprintf("%s-%d", app, i), "flock.fritzlab.net/ip-algo", "embed:ns/8,app/16,image/8", "FLOCK_APP", app, "FLOCK_IMAGE", "registry.example/"+app+":1")}
		r, err := n.cni.Add(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		v6 = append(v6, ipOf(podIPs(t, r), true))
		t.Cleanup(func() { _ = n.cni.Del(ctx, p) })
	}
	sub := func(ip netip.Addr) netip.Prefix { p, _ := ip.Prefix(96); return p }
	if sub(v6[0]) != sub(v6[1]) {
		t.Errorf("two replicas of app api got different /96s: %v %v", v6[0], v6[1])
	}
	if sub(v6[0]) == sub(v6[2]) {
		t.Errorf("apps api and db share a /96: %v %v", v6[0], v6[2])
	}
	if v6[0] == v6[1] {
		t.Errorf("replicas got the same address %v", v6[0])
	}
}

// runLoopback runs the reference loopback plugin (Debian's
// containernetworking-plugins) in p's netns through libcni, as containerd
// does for every sandbox.
func runLoopback(ctx context.Context, t *testing.T, p lab.Pod) error {
	list, err := libcni.NetworkConfFromBytes([]byte(`{"cniVersion":"1.0.0","name":"cni-loopback","plugins":[{"type":"loopback"}]}`))
	if err != nil {
		return err
	}
	c := &lab.CNI{Config: libcni.NewCNIConfigWithCacheDir([]string{"/usr/lib/cni"}, t.TempDir(), nil), List: list}
	lo := p
	lo.IfName = "lo"
	_, err = c.Add(ctx, lo)
	return err
}
