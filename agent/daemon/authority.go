package daemon

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"code.fritzlab.net/fritzlab/flock/agent/authz"
	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// authorityView is one AddressPool decision: the compiled pools and the
// namespace labels their selectors match against.
type authorityView struct {
	set    *authz.Set
	pools  []v1alpha1.AddressPool // as given, with the legacy ones
	labels func(ns string) labels.Set
}

// Authorize implements agent.Authority with the current view.
func (d *daemon) Authorize(use string, want netip.Prefix, namespace string) (string, error) {
	v := d.authority.Load()
	if v == nil {
		return "", fmt.Errorf("no AddressPools loaded yet")
	}
	var nsLabels labels.Set
	if v.labels != nil {
		nsLabels = v.labels(namespace)
	}
	p, err := v.set.Authorize(use, want, namespace, nsLabels)
	return p.Name, err
}

// applyPools makes a new set of AddressPools (plus the NodeConfig's
// deprecated shared pools) the authority, hands their pod CIDRs to IPAM
// and re-checks the summaries for overlaps. In Kubernetes mode an invalid
// pool is ignored (and logged); the standalone file refuses it at load.
func (d *daemon) applyPools(pools []v1alpha1.AddressPool) {
	d.mu.Lock()
	spec := d.spec
	d.mu.Unlock()
	legacy, warns := nodeconfig.LegacyPools(&spec)
	d.mu.Lock()
	for _, w := range warns {
		if !d.warned[w] {
			d.warned[w] = true
			d.log.Warn("deprecated: " + w)
		}
	}
	d.mu.Unlock()
	all := append(slices.Clone(pools), legacy...)
	set, err := authz.Compile(all)
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			d.log.Error("AddressPool ignored", "err", line)
		}
	}
	v := &authorityView{set: set, pools: all}
	if d.kube != nil {
		v.labels = d.kube.pools.NamespaceLabels
	}
	d.authority.Store(v)
	var podCIDRs []netip.Prefix
	for _, p := range set.Pools() {
		if p.Uses(v1alpha1.UsePod) {
			podCIDRs = append(podCIDRs, p.CIDRs...)
		}
	}
	skipped, err := d.state.SetPodPools(podCIDRs)
	if err != nil {
		d.log.Error("IPAM: AddressPools not applied", "err", err)
	}
	for _, p := range skipped {
		d.log.Error("AddressPool CIDR overlaps this node's summary: not used for pod addresses here", "cidr", p)
	}
	d.checkOverlaps()
	d.statusChanged()
}

// checkOverlaps withholds every summary of this node that overlaps
// another node's summary or an AddressPool from BGP, until resolved.
func (d *daemon) checkOverlaps() {
	var others map[string][]netip.Prefix
	if d.kube != nil {
		others = d.kube.allNC.Summaries()
	}
	var pools []v1alpha1.AddressPool
	if v := d.authority.Load(); v != nil {
		pools = v.pools
	}
	reasons := authz.SummaryOverlaps(d.nodeName, d.state.Summaries(), others, pools)
	before := d.state.Suppressed()
	if !d.state.SetSuppressed(reasons) {
		return
	}
	for p, why := range reasons {
		if before[p] != why {
			d.log.Error("summary not advertised until the overlap is resolved", "summary", p, "reason", why)
		}
	}
	for p := range before {
		if _, still := reasons[p]; !still {
			d.log.Info("summary overlap resolved; advertising it again", "summary", p)
		}
	}
	d.statusChanged()
}
