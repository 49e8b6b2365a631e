package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"code.fritzlab.net/fritzlab/flock/agent/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
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

// applyPools makes the current AddressPools (plus the NodeConfig's
// deprecated shared pools) the authority, hands their pod CIDRs to IPAM
// and re-checks the summaries for overlaps. In Kubernetes mode an invalid
// pool is ignored (and logged); the standalone file refuses it at load.
// It reads the pools itself, under poolsMu (see lockPools): whichever
// call runs last applies the latest pools.
func (d *daemon) applyPools() {
	d.lockPools()
	defer d.poolsMu.Unlock()
	pools := d.currentPools()
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
	d.hook(hookPoolsRead)
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
	d.logInUse()
	d.checkOverlapsLocked()
	d.statusChanged()
	if d.kube != nil {
		d.kube.poolStatusChanged()
		d.kube.services.Refresh() // authorizations may have changed
	}
}

// currentPools are the AddressPools as the source has them now: the
// informer's cache, or the standalone file as last loaded.
func (d *daemon) currentPools() []v1alpha1.AddressPool {
	if d.kube != nil {
		return d.kube.pools.Pools()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.filePools
}

// lockPools takes poolsMu, which serializes applyPools and checkOverlaps:
// each reads its inputs (the pools, every node's summaries, the
// authority) and writes what it derives from them (the authority, IPAM's
// pools, the suppressed summaries). Run from the AddressPool informer, the
// all-NodeConfigs informer and the start at once, an older input's result
// could otherwise land after a newer one's and stay (a lost update).
func (d *daemon) lockPools() {
	if d.poolsMu.TryLock() {
		return
	}
	d.hook(hookPoolsWait) // tests: another apply runs; this one waits for it
	d.poolsMu.Lock()
}

// Points where tests hold an apply (daemon.poolHook).
const (
	hookPoolsRead = "pools-read" // inputs read, nothing written yet
	hookPoolsWait = "pools-wait" // waiting for another apply to finish
)

func (d *daemon) hook(point string) {
	if d.poolHook != nil {
		d.poolHook(point)
	}
}

// waitNodeConfigs waits until every node's NodeConfig is listed, withholds
// each summary of this node that overlaps one of theirs (checkOverlaps),
// and waits, bounded as for the Service routes, until the speaker holds
// that: the peers are added next, and their first UPDATEs must not carry
// a summary another node owns. Serving CNI does not wait for it (nothing
// of ADD reads other nodes' NodeConfigs); a list that never ends (RBAC)
// keeps the peers out and says so.
func (d *daemon) waitNodeConfigs(ctx context.Context) {
	if d.kube == nil || d.kube.nodesFactory == nil {
		return
	}
	start := time.Now()
	if !kubeclient.WaitLogged(ctx, d.log, "BGP peers", kubeclient.SyncWarnAfter, kubeclient.Synced{Name: "every node's NodeConfig", Synced: d.kube.allNC.HasSynced}) {
		return // stopping
	}
	d.checkOverlaps()
	d.statusChanged() // the peers wait no more for them (status.Node.PeersWait)
	wctx, cancel := context.WithTimeout(ctx, serviceRoutesWait)
	defer cancel()
	if err := d.bgpLoop.Wait(wctx, d.state.Generation()); err != nil {
		if ctx.Err() == nil {
			d.log.Warn("the summaries' overlaps did not reach the speaker in time; adding the BGP peers anyway", "err", err)
		}
		return
	}
	d.log.Info("every node's NodeConfig listed; summaries' overlaps checked", "nodes", len(d.kube.allNC.Names()),
		"withheld", len(d.state.Suppressed()), "after", time.Since(start).Round(time.Millisecond))
}

// checkOverlaps withholds every summary of this node that overlaps
// another node's summary or an AddressPool from BGP, until resolved.
func (d *daemon) checkOverlaps() {
	d.lockPools()
	defer d.poolsMu.Unlock()
	d.checkOverlapsLocked()
}

func (d *daemon) checkOverlapsLocked() {
	var others map[string][]netip.Prefix
	if d.kube != nil {
		others = d.kube.allNC.Summaries()
	}
	var pools []v1alpha1.AddressPool
	if v := d.authority.Load(); v != nil {
		pools = v.pools
	}
	reasons := authz.SummaryOverlaps(d.nodeName, d.state.Summaries(), others, pools)
	d.hook(hookPoolsRead)
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
