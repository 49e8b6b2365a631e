// Package status is the agent's one status snapshot: built in one place
// (the daemon) and rendered by flockctl (through the admin API), by
// /metrics and by the NodeConfig status, so the three never disagree and
// none of them queries the speaker on its own.
package status

import (
	"fmt"
	"strings"
	"time"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/bgp/session"
	"code.fritzlab.net/fritzlab/flock/ipam"
)

// Node is one coherent view of the agent.
type Node struct {
	Time time.Time
	// Ready: allocations recovered, CNI served.
	Ready       bool
	Allocations int
	Pools       []ipam.PoolStats
	Neighbors   []session.Neighbor
	// Advertised counts the paths the speaker holds, by kind.
	Advertised  map[advert.Kind]int
	Reconcilers []reconcile.Status
	// Reaped counts allocations reaped since start, by reason.
	Reaped map[string]uint64
	// ReapFailures counts reaps that failed (each is retried with
	// back-off until it succeeds).
	ReapFailures uint64
	// Stuck lists attachments routed nowhere until a DEL or GC removes
	// them ("<container>: <reason>"): a failed rollback, a record that
	// could not be restored.
	Stuck []string
	// Suppressed says why summaries are not advertised (an overlap with
	// another node's summary or an AddressPool).
	Suppressed []string
	// ConfigError is the last error applying the NodeConfig ("" if the
	// running config is the latest).
	ConfigError string
	// Installer is the CNI installer's refusal ("" if it installed or
	// none ran): no conflist of its chain was written.
	Installer string
	// PeersWait is what the BGP peers wait for before they are added
	// ("" if nothing): every node's NodeConfig, listed after the agent
	// serves, whose summaries ours must not overlap.
	PeersWait string
	// Services counts this node's Service addresses by state (advertised,
	// draining, not advertised); ServiceRouteChanges counts changes of
	// its Service routes since start.
	Services            map[string]int
	ServiceRouteChanges uint64
}

// Peers counts established and configured sessions.
func (n Node) Peers() (established, configured int) {
	for _, p := range n.Neighbors {
		configured++
		if p.Established() {
			established++
		}
	}
	return established, configured
}

// Problems lists what an operator must look at: a CNI installer that
// refused, a NodeConfig that could not be applied, reconcilers whose last
// pass failed, summaries not advertised, peers not added yet.
func (n Node) Problems() []string {
	var out []string
	if n.Installer != "" {
		out = append(out, "cni installer: "+n.Installer)
	}
	if n.ConfigError != "" {
		out = append(out, "config: "+n.ConfigError)
	}
	for _, r := range n.Reconcilers {
		if r.Failing {
			out = append(out, fmt.Sprintf("reconcile %s: %s", r.Target, r.LastError))
		}
	}
	for _, s := range n.Suppressed {
		out = append(out, "not advertised: "+s)
	}
	if n.PeersWait != "" {
		out = append(out, "BGP peers not added yet: "+n.PeersWait)
	}
	if len(n.Stuck) > 0 {
		out = append(out, fmt.Sprintf("%d attachment(s) stuck until a DEL or GC removes them: %s", len(n.Stuck), strings.Join(n.Stuck, "; ")))
	}
	return out
}
