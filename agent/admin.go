package agent

import (
	"net/netip"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
)

// AdminSource adapts the agent to the admin API.
type AdminSource struct{ A *Agent }

func strs(ips []netip.Addr) []string {
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

// Pods implements admin.Source.
func (s AdminSource) Pods() []admin.Pod {
	var out []admin.Pod
	for _, r := range s.A.Allocations() {
		out = append(out, admin.Pod{
			ContainerID: r.ContainerID, Namespace: r.Pod.Namespace, Name: r.Pod.Name,
			IfName: r.IfName, HostVeth: r.HostVeth, IPs: strs(v6First(r.IPs)),
			Addresses: strs(r.Addresses), Anycast: strs(r.Anycast), Created: r.Created,
		})
	}
	return out
}

// Pools implements admin.Source.
func (s AdminSource) Pools() []admin.Pool {
	var out []admin.Pool
	for _, st := range s.A.IPAM() {
		kind := "summary"
		if !st.Pool.Summary {
			kind = "shared"
		}
		out = append(out, admin.Pool{CIDR: st.Pool.Prefix.String(), Kind: kind, Namespaces: st.Pool.Namespaces, Used: st.Used, Free: st.Free})
	}
	return out
}

// Routes implements admin.Source.
func (s AdminSource) Routes() []admin.Route {
	var out []admin.Route
	for _, r := range s.A.AnycastRoutes() {
		rt := admin.Route{Prefix: netip.PrefixFrom(r.IP, r.IP.BitLen()).String(), Kind: string(r.Kind), Owners: r.Owners}
		for _, nh := range r.Nexthops {
			rt.Nexthops = append(rt.Nexthops, nh.Gateway.String()+"%"+nh.Dev)
		}
		out = append(out, rt)
	}
	return out
}
