package agent

import (
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// buildResult turns an allocation into the CNI result: IPv6 first, then
// IPv4, then the `addresses` IPs, which is the order the runtime copies into
// pod.status.podIPs.
func buildResult(al store.Allocation) *current.Result {
	podIdx := 1
	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: al.HostVeth, Mac: al.HostMAC},
			{Name: al.IfName, Mac: al.PodMAC, Sandbox: al.Netns},
		},
	}
	ordered := append(append([]netip.Addr{}, v6First(al.IPs)...), al.Addresses...)
	for _, ip := range ordered {
		cfg := &current.IPConfig{Interface: &podIdx, Address: hostNet(ip)}
		if isPodIP(al, ip) {
			cfg.Gateway = gatewayFor(ip).AsSlice()
		}
		res.IPs = append(res.IPs, cfg)
	}
	for _, ip := range v6First(al.IPs) {
		gw := gatewayFor(ip)
		bits := 128
		if ip.Is4() {
			bits = 32
		}
		res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: make(net.IP, bits/8), Mask: net.CIDRMask(0, bits)}, GW: gw.AsSlice()})
	}
	return res
}

func isPodIP(al store.Allocation, ip netip.Addr) bool {
	for _, a := range al.IPs {
		if a == ip {
			return true
		}
	}
	return false
}

func v6First(ips []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, ip := range ips {
		if ip.Is6() {
			out = append(out, ip)
		}
	}
	for _, ip := range ips {
		if ip.Is4() {
			out = append(out, ip)
		}
	}
	return out
}

func gatewayFor(ip netip.Addr) netip.Addr {
	if ip.Is4() {
		return dataplane.GatewayV4
	}
	return dataplane.GatewayV6
}

func hostNet(ip netip.Addr) net.IPNet {
	return net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
}
