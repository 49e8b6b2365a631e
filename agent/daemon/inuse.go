package daemon

import (
	"fmt"
	"net/netip"
	"strings"

	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// A pod pool may come to cover anycast and `addresses` IPs in use on the
// node (an AddressPool created or widened over them). Those stay where they
// are and IPAM never hands them out (nodestate holds them); what is left is
// telling the operator: a note on the pool's row in `flockctl ipam`, a log
// line when it changes, and this node's entry of the pool's status.inUse.

// inUseByPool lists, per valid AddressPool of use pod, the anycast and
// `addresses` IPs in use on this node inside its CIDRs that this node
// hands pod addresses out from.
func (d *daemon) inUseByPool() map[string][]nodestate.InUse {
	out := map[string][]nodestate.InUse{}
	v := d.authority.Load()
	if v == nil {
		return out
	}
	inIPAM := map[netip.Prefix]bool{}
	for _, st := range d.state.IPAM() {
		inIPAM[st.Pool.Prefix] = true
	}
	for _, p := range v.set.Pools() {
		if !p.Uses(v1alpha1.UsePod) {
			continue
		}
		for _, c := range p.CIDRs {
			if inIPAM[c] {
				out[p.Name] = append(out[p.Name], d.state.InUseIn(c)...)
			}
		}
		if len(out[p.Name]) == 0 {
			delete(out, p.Name)
		}
	}
	return out
}

// logInUse logs each pod pool whose addresses in use changed. Call with
// poolsMu held.
func (d *daemon) logInUse() {
	now := map[string]string{}
	for pool, list := range d.inUseByPool() {
		now[pool] = inUseList(list, len(list))
	}
	for pool, list := range now {
		if d.inUseLogged[pool] != list {
			d.log.Warn("AddressPool for pods covers addresses in use on this node; they stay where they are and are never handed out as pod addresses",
				"pool", pool, "inUse", list)
		}
	}
	for pool := range d.inUseLogged {
		if _, still := now[pool]; !still {
			d.log.Info("AddressPool for pods no longer covers addresses in use on this node", "pool", pool)
		}
	}
	d.inUseLogged = now
}

// inUseNote is the note on a pool's row in `flockctl ipam`.
func inUseNote(list []nodestate.InUse) string {
	if len(list) == 0 {
		return ""
	}
	return "in use here as anycast/addresses, never handed out: " + inUseList(list, 4)
}

// inUseList renders at most max entries, then how many more there are.
func inUseList(list []nodestate.InUse, max int) string {
	var parts []string
	for i, u := range list {
		if i == max {
			parts = append(parts, fmt.Sprintf("and %d more", len(list)-max))
			break
		}
		parts = append(parts, u.String())
	}
	return strings.Join(parts, ", ")
}

// inUseStatus is this node's entry of each pod pool's status.inUse.
func (d *daemon) inUseStatus() map[string]v1alpha1.NodeInUse {
	out := map[string]v1alpha1.NodeInUse{}
	for pool, list := range d.inUseByPool() {
		e := v1alpha1.NodeInUse{Node: d.nodeName, Count: int32(len(list))}
		for _, u := range list[:min(len(list), v1alpha1.MaxInUseListed)] {
			use := v1alpha1.UseAnycast
			if u.Kind == nodestate.KindAddress {
				use = v1alpha1.UseAddresses
			}
			e.Addresses = append(e.Addresses, v1alpha1.InUseAddress{IP: u.IP.String(), Use: use, Pods: u.Pods})
		}
		out[pool] = e
	}
	return out
}
