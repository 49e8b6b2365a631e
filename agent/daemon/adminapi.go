package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/bgp/session"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
)

// hangups delivers SIGHUP until ctx ends.
func hangups(ctx context.Context) <-chan os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	context.AfterFunc(ctx, func() { signal.Stop(ch) })
	return ch
}

// The admin API (flockctl): every view is rendered from the node state,
// the targets' own view or the status snapshot.

func strs(ips []netip.Addr) []string {
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

func v6First(ips []netip.Addr) []netip.Addr {
	out := slices.Clone(ips)
	slices.SortStableFunc(out, func(a, b netip.Addr) int {
		switch {
		case a.Is6() && b.Is4():
			return -1
		case a.Is4() && b.Is6():
			return 1
		}
		return 0
	})
	return out
}

func (d *daemon) Status() admin.Status {
	n := d.snapshot()
	up, total := n.Peers()
	st := admin.Status{Ready: n.Ready, Allocations: n.Allocations, PeersUp: up, Peers: total,
		Reaped: n.Reaped, ReapFailures: n.ReapFailures, Stuck: n.Stuck, ConfigError: n.ConfigError, Installer: n.Installer, Problems: n.Problems()}
	st.Reconcilers = n.Reconcilers
	return st
}

func (d *daemon) Pods() []admin.Pod {
	out := []admin.Pod{}
	for _, r := range d.state.Attachments() {
		out = append(out, admin.Pod{
			ContainerID: r.ContainerID, ID: r.Pod,
			IfName: r.IfName, HostVeth: r.HostVeth, IPs: strs(v6First(r.IPs)),
			Addresses: strs(r.Addresses), Anycast: strs(r.Anycast), Phase: r.Phase.String(), Ready: r.Ready, Created: r.Created,
		})
	}
	return out
}

// Pools lists the node's summaries and every AddressPool (the NodeConfig's
// deprecated shared pools among them), a row per CIDR, with what IPAM hands
// out of it here, how many of its addresses are claimed, and the anycast
// and `addresses` IPs in use here that IPAM must leave alone.
func (d *daemon) Pools() []admin.Pool {
	out := []admin.Pool{}
	ipamStats := map[netip.Prefix]ipam.PoolStats{}
	for _, st := range d.state.IPAM() {
		ipamStats[st.Pool.Prefix] = st
	}
	suppressed := d.state.Suppressed()
	for _, p := range d.state.Summaries() {
		st := ipamStats[p]
		out = append(out, admin.Pool{CIDR: p.String(), Kind: "summary", Used: st.Used, Held: st.Held, Free: st.Free,
			Note: joinNotes(suppressed[p], inUseNote(d.state.InUseIn(p)))})
	}
	v := d.authority.Load()
	if v == nil {
		return out
	}
	claims := d.claimCounts()
	valid := map[string]authz.Pool{}
	for _, p := range v.set.Pools() {
		valid[p.Name] = p
	}
	for _, ap := range v.pools {
		kind := "addresspool"
		if strings.HasPrefix(ap.Name, "nodeconfig-pool-") {
			kind = "nodeconfig"
		}
		row := admin.Pool{Name: ap.Name, Kind: kind, Use: ap.Spec.Use, Namespaces: ap.Spec.Namespaces, Claims: claims[ap.Name]}
		if ap.Spec.NamespaceSelector != nil {
			if sel, err := metav1.LabelSelectorAsSelector(ap.Spec.NamespaceSelector); err == nil {
				row.Selector = sel.String()
				if sel.Empty() {
					row.Selector = "every namespace"
				}
			}
		}
		if err, bad := v.set.Invalid()[ap.Name]; bad {
			row.Note = "ignored: " + err.Error()
		}
		for _, c := range ap.Spec.CIDRs {
			r := row
			r.CIDR = c
			if pfx, err := netip.ParsePrefix(c); err == nil {
				if st, ok := ipamStats[pfx]; ok {
					r.Used, r.Held, r.Free = st.Used, st.Held, st.Free
					r.Note = joinNotes(r.Note, inUseNote(d.state.InUseIn(pfx)))
				}
			}
			out = append(out, r)
		}
	}
	return out
}

func joinNotes(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// claimCounts counts claimed addresses per pool: cluster-wide from the
// API's claims, or (standalone) those held on this node.
func (d *daemon) claimCounts() map[string]int {
	if d.kube != nil {
		return d.kube.claims.CountByPool()
	}
	v := d.authority.Load()
	out := map[string]int{}
	for _, a := range d.state.Attachments(nodestate.Committed) {
		for _, ip := range append(slices.Clone(a.IPs), a.Addresses...) {
			for _, p := range v.set.Pools() {
				if !p.Uses(v1alpha1.UsePod) && !p.Uses(v1alpha1.UseAddresses) {
					continue // a pod's addresses are claimed only from these
				}
				if slices.ContainsFunc(p.CIDRs, func(c netip.Prefix) bool { return c.Contains(ip) }) {
					out[p.Name]++
				}
			}
		}
	}
	return out
}

func hops(nhs []dataplane.Nexthop) []string {
	out := []string{}
	for _, nh := range nhs {
		out = append(out, nh.Gateway.String()+"%"+nh.Dev)
	}
	return out
}

// Routes shows the kernel's flock host routes next to what the state
// wants: a route the kernel holds but nobody wants (a crash leftover not
// yet repaired) is listed too.
func (d *daemon) Routes() []admin.Route {
	desired, _ := d.state.HostRoutes()
	installed := d.kernel.Installed()
	out := []admin.Route{}
	seen := map[netip.Prefix]bool{}
	for _, r := range desired {
		seen[r.Prefix] = true
		out = append(out, admin.Route{Prefix: r.Prefix.String(), Kind: string(r.Kind), Nexthops: hops(installed[r.Prefix]),
			Desired: hops(r.Nexthops), Owners: r.Owners, Synced: slices.Equal(installed[r.Prefix], r.Nexthops)})
	}
	for p, nhs := range installed {
		if !seen[p] {
			out = append(out, admin.Route{Prefix: p.String(), Nexthops: hops(nhs), Desired: []string{}, Owners: []string{}})
		}
	}
	slices.SortFunc(out, func(a, b admin.Route) int {
		return netip.MustParsePrefix(a.Prefix).Addr().Compare(netip.MustParsePrefix(b.Prefix).Addr())
	})
	return out
}

func (d *daemon) Neighbors() []session.Neighbor { return d.snapshot().Neighbors }

func (d *daemon) BGPRoutes() []admin.BGPRoute {
	names := map[string]string{}
	for _, r := range d.state.Attachments() {
		names[r.ContainerID] = r.Pod.String()
	}
	held := d.speaker.Held()
	routes, _ := d.state.AdvertRoutes()
	out := []admin.BGPRoute{}
	for _, r := range routes {
		br := admin.BGPRoute{Prefix: r.Prefix.String(), Kind: string(r.Kind), Drain: r.Drain, Weight: r.Weight, Advertised: held[r.Prefix] == r.Path()}
		for _, o := range r.Owners {
			if n, ok := names[o]; ok {
				o = n
			}
			br.Owners = append(br.Owners, o)
		}
		out = append(out, br)
	}
	return out
}

// SetReadiness is the operator's readiness report (standalone mode; in
// Kubernetes mode the pod's Ready condition is the only source).
func (d *daemon) SetReadiness(r admin.Readiness) (int, error) {
	if d.kube != nil {
		return 0, errors.New("Kubernetes mode: readiness comes from the pod's Ready condition in the API")
	}
	if r.Namespace == "" || r.Name == "" {
		return 0, fmt.Errorf("readiness: namespace %q and name %q: both are required", r.Namespace, r.Name)
	}
	n, err := d.state.SetReadyByName(r.Namespace, r.Name, r.Ready)
	if err == nil {
		d.log.Info("readiness set by operator", "pod", r.Namespace+"/"+r.Name, "ready", r.Ready, "incarnations", n)
	}
	return n, err
}
