package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// crashCheck is what one quiescent point found.
type crashCheck struct {
	leaks, dups int
	interrupted int // the restarted agent's "interrupted-add" reaps
	converged   time.Duration
}

// checkCrashNode waits (bounded) until the node and the ToR hold exactly
// what the live pods imply, reports every difference otherwise, and then
// looks inside the pods' own namespaces.
func checkCrashNode(t *testing.T, l *lab.BGPLab, n *lab.LabNode, live, gone []*crashPod) crashCheck {
	t.Helper()
	var res crashCheck

	// The IPs every live pod holds, once each.
	owner := map[netip.Addr]string{}
	for _, p := range live {
		for _, ip := range append(slices.Clone(p.ips), p.addresses()...) {
			if prev, dup := owner[ip]; dup {
				res.dups++
				t.Errorf("%s handed to both %s and %s", ip, prev, p.id)
			}
			owner[ip] = p.id
		}
	}
	want := crashWant(n, live)
	start := time.Now()
	var diffs []crashDiff
	for {
		diffs = crashDiffs(t, l, n, want)
		if len(diffs) == 0 || time.Since(start) > crashSettle {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.converged = time.Since(start)
	for _, d := range diffs {
		res.leaks += len(d.extra)
		t.Errorf("%s: leaked %v; missing %v", d.what, d.extra, d.missing)
	}
	var st admin.Status
	flockctlJSON(t, n.Agent, &st, "status")
	res.interrupted = int(st.Reaped["interrupted-add"])

	// Inside the pods: a live pod has lo and eth0 with exactly its IPs and
	// anycast IPs (a killed attempt left nothing behind), a deleted one
	// only lo, bare.
	for _, p := range live {
		got, err := podNSView(p.pod.NS)
		if err != nil {
			t.Fatal(err)
		}
		w := []string{"eth0"}
		for _, ip := range append(slices.Clone(p.ips), p.addresses()...) {
			w = append(w, "eth0 "+host(ip).String())
		}
		if p.kind == crashAnycast {
			w = append(w, "eth0 "+host(crashAny6).String(), "eth0 "+host(crashAny4).String())
		}
		if extra, missing := diffSets(got, w); len(extra)+len(missing) > 0 {
			res.leaks += len(extra)
			t.Errorf("pod %s netns: extra %v; missing %v", p.id, extra, missing)
		}
	}
	var deleted []lab.Pod
	for _, p := range append(slices.Clone(live), gone...) {
		deleted = append(deleted, p.abandoned...)
	}
	for _, p := range gone {
		deleted = append(deleted, p.pod)
	}
	for _, p := range deleted {
		got, err := podNSView(p.NS)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range got {
			res.leaks++
			t.Errorf("deleted sandbox %s still has %s in its netns", p.ContainerID, g)
		}
	}
	return res
}

// crashWanted is the node's whole truth for a set of live pods, each part
// as a set of strings comparable with what the node shows.
type crashWanted struct {
	veths, routes, records, pods, ipam, tor, speaker []string
}

func crashWant(n *lab.LabNode, live []*crashPod) crashWanted {
	var w crashWanted
	w.routes = []string{n.Summary6.String() + " blackhole", n.Summary4.String() + " blackhole"}
	tor := map[netip.Prefix]int{n.Summary6: 1, n.Summary4: 1}
	used := map[netip.Prefix]int{}
	claims := map[string]int{"lab-pods": 0, "lab-addresses": 0, "lab-anycast": 0}
	for _, p := range live {
		veth := dataplane.HostVethName(p.id) // a hash collision among ~200 live pods: p ≈ 5e-6
		w.veths = append(w.veths, veth)
		v6, v4 := ipOf(p.ips, true), ipOf(p.ips, false)
		for _, ip := range p.ips {
			w.routes = append(w.routes, host(ip).String()+" dev "+veth)
			switch {
			case crashSharedRange.Contains(ip):
				used[crashSharedRange]++
				claims["lab-pods"]++
				tor[host(ip)] = 1
			case n.Summary6.Contains(ip):
				used[n.Summary6]++
			case n.Summary4.Contains(ip):
				used[n.Summary4]++
			}
		}
		switch p.kind {
		case crashAddress:
			w.routes = append(w.routes, host(p.addr).String()+" via "+v6.String()+"%"+veth)
			claims["lab-addresses"]++
			tor[host(p.addr)] = 1
		case crashAnycast:
			w.routes = append(w.routes, host(crashAny6).String()+" via "+v6.String()+"%"+veth, host(crashAny4).String()+" via "+v4.String()+"%"+veth)
			tor[host(crashAny6)], tor[host(crashAny4)] = 1, 1
		}
		w.records = append(w.records, fmt.Sprintf("%s committed %v %v", p.id, p.ips, p.addresses()))
		w.pods = append(w.pods, fmt.Sprintf("%s committed ready=true veth=%s %v %v", p.id, veth, p.ips, p.addresses()))
	}
	for _, pfx := range []netip.Prefix{n.Summary6, n.Summary4, crashSharedRange} {
		w.ipam = append(w.ipam, fmt.Sprintf("%s used=%d", pfx, used[pfx]))
	}
	for name, c := range claims {
		w.ipam = append(w.ipam, fmt.Sprintf("%s claims=%d", name, c))
	}
	for p, c := range tor {
		w.tor = append(w.tor, fmt.Sprintf("%s paths=%d", p, c))
		w.speaker = append(w.speaker, p.String()+" advertised")
	}
	return w
}

// crashDiff is one view of the node that differs from what the live pods
// imply.
type crashDiff struct {
	what           string
	extra, missing []string
}

// crashDiffs compares every view with what the live pods imply.
//
// Claims: in the lab's standalone mode there are no cluster-wide claim
// objects (agent.Config.Claims is nil; uniqueness is per node). What the
// node holds of use-pod and addresses pools is still counted per pool
// (flockctl ipam's claims column, from its committed allocations), and
// that must match the live pods.
func crashDiffs(t *testing.T, l *lab.BGPLab, n *lab.LabNode, w crashWanted) []crashDiff {
	t.Helper()
	var out []crashDiff
	cmp := func(what string, got, want []string) {
		if extra, missing := diffSets(got, want); len(extra)+len(missing) > 0 {
			out = append(out, crashDiff{what, extra, missing})
		}
	}
	settledDeletes(t, n.Agent)
	cmp("host veths", flockVeths(t, n.NS), w.veths)
	cmp("kernel routes (proto flock)", crashRouteTable(t, n.NS), w.routes)

	var recs []string
	for _, r := range records(t, n.Agent) {
		recs = append(recs, fmt.Sprintf("%s %s %v %v", r.ContainerID, r.State, r.IPs, r.Addresses))
	}
	cmp("store records", recs, w.records)
	ents, err := os.ReadDir(filepath.Join(n.Agent.StateDir, "allocations"))
	if err != nil {
		t.Fatal(err)
	}
	var stray []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".spare-") && strings.HasSuffix(name, ".tmp") {
			// Deleted records' files kept for reuse: empty, or they are
			// records that outlived their DEL.
			if fi, err := e.Info(); err != nil || fi.Size() != 0 {
				stray = append(stray, name+" (not empty)")
			}
			continue
		}
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			stray = append(stray, name)
		}
	}
	cmp("store files other than records and empty spares", stray, nil)

	var pods []admin.Pod
	flockctlJSON(t, n.Agent, &pods, "pods")
	var pv []string
	for _, p := range pods {
		pv = append(pv, fmt.Sprintf("%s %s ready=%v veth=%s %v %v", p.ContainerID, p.Phase, p.Ready, p.HostVeth, addrs(t, p.IPs), addrs(t, p.Addresses)))
	}
	cmp("flockctl pods", pv, w.pods)

	var pools []admin.Pool
	flockctlJSON(t, n.Agent, &pools, "ipam")
	var iv []string
	for _, p := range pools {
		switch p.CIDR {
		case n.Summary6.String(), n.Summary4.String(), crashSharedRange.String():
			iv = append(iv, fmt.Sprintf("%s used=%d", p.CIDR, p.Used))
		}
		// One row per CIDR: a pool's claims once.
		if c := fmt.Sprintf("%s claims=%d", p.Name, p.Claims); strings.HasPrefix(p.Name, "lab-") && !slices.Contains(iv, c) {
			iv = append(iv, c)
		}
	}
	cmp("flockctl ipam", iv, w.ipam)

	var st admin.Status
	flockctlJSON(t, n.Agent, &st, "status")
	if !st.Ready || len(st.Problems) > 0 || st.Allocations != len(w.pods) {
		out = append(out, crashDiff{what: "flockctl status", extra: st.Problems, missing: []string{fmt.Sprintf("ready with %d allocations (it says ready=%v with %d)", len(w.pods), st.Ready, st.Allocations)}})
	}

	var routes []admin.BGPRoute
	flockctlJSON(t, n.Agent, &routes, "bgp", "routes")
	var sv []string
	for _, r := range routes {
		if r.Advertised {
			sv = append(sv, r.Prefix+" advertised")
		} else {
			sv = append(sv, r.Prefix+" held back")
		}
	}
	cmp("speaker paths (flockctl bgp routes)", sv, w.speaker)

	// Until the node's End-of-RIB, BIRD keeps the killed agent's routes as
	// stale ones: a match before that proves nothing.
	if proto, err := l.Bird.Cmd("show protocols all " + n.Name); err != nil || !strings.Contains(proto, "Established") || strings.Contains(proto, "Neighbor graceful restart active") {
		out = append(out, crashDiff{what: "ToR session", missing: []string{n.Name + " Established, graceful restart over"}})
	}
	var tv []string
	for p, c := range birdTable(t, l) {
		tv = append(tv, fmt.Sprintf("%s paths=%d", p, c))
	}
	cmp("ToR table (BIRD)", tv, w.tor)
	return out
}

// addrs parses flockctl's IP strings, for printing like netip.Addr slices.
func addrs(t *testing.T, ss []string) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil {
			t.Fatalf("flockctl printed %q: %v", s, err)
		}
		out = append(out, a)
	}
	return out
}

// crashRouteTable is every route flock owns on the node, one string per
// next hop: "P blackhole" (summaries), "P dev VETH" (a pod's own IPs) and
// "P via GW%VETH" (anycast and addresses, as kernelHostRoutes prints them).
func crashRouteTable(t *testing.T, ns *lab.NS) []string {
	t.Helper()
	var out []string
	err := ns.Dump(func(h *netlink.Handle) error {
		out = out[:0]
		names := map[int]string{}
		links, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := h.RouteListFiltered(fam, &netlink.Route{Protocol: dataplane.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				return err
			}
			for _, r := range rs {
				p := prefixOf(r.Dst).String()
				switch {
				case r.Type == unix.RTN_BLACKHOLE:
					out = append(out, p+" blackhole")
				case r.Gw != nil:
					out = append(out, p+" via "+r.Gw.String()+"%"+names[r.LinkIndex])
				case len(r.MultiPath) > 0:
					for _, m := range r.MultiPath {
						out = append(out, p+" via "+m.Gw.String()+"%"+names[m.LinkIndex])
					}
				default:
					out = append(out, p+" dev "+names[r.LinkIndex])
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

// podNSView lists a pod namespace's interfaces and their global addresses:
// "IF" for an interface, "IF PREFIX" for an address (loopback's own
// 127.0.0.1 and ::1 left out, and lo itself).
func podNSView(ns *lab.NS) ([]string, error) {
	var out []string
	err := ns.Dump(func(h *netlink.Handle) error {
		out = out[:0]
		links, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			name := l.Attrs().Name
			if name != "lo" {
				out = append(out, name)
			}
			as, err := h.AddrList(l, netlink.FAMILY_ALL)
			if err != nil {
				return err
			}
			for _, a := range as {
				ip, _ := netip.AddrFromSlice(a.IP)
				if ip = ip.Unmap(); ip.IsLoopback() || ip.IsLinkLocalUnicast() {
					continue
				}
				out = append(out, name+" "+host(ip).String())
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", ns.Name, err)
	}
	return out, nil
}

// diffSets compares two multisets of strings.
func diffSets(got, want []string) (extra, missing []string) {
	count := map[string]int{}
	for _, g := range got {
		count[g]++
	}
	for _, w := range want {
		count[w]--
	}
	for k, c := range count {
		for ; c > 0; c-- {
			extra = append(extra, k)
		}
		for ; c < 0; c++ {
			missing = append(missing, k)
		}
	}
	slices.Sort(extra)
	slices.Sort(missing)
	return extra, missing
}
