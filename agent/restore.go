package agent

import (
	"context"
	"fmt"

	"code.fritzlab.net/fritzlab/flock/agent/store"
)

// Restore recovers the node at start, before anything is served: committed
// records go back into the state (unless their network namespace is gone:
// those are reaped), pending ones (a crash mid-ADD) are torn down and
// dropped, and flock veths that no record owns are removed. One record
// that cannot be restored or torn down never keeps the node from serving
// (nor from receiving the DEL that clears it): it is quarantined as Stuck.
// A record that cannot even be read does stop the start (store.Load): what
// it holds is unknown, and handing its IPs out again could duplicate them.
func (a *Agent) Restore(ctx context.Context) error {
	if err := a.cfg.Dataplane.EnsureNode(a.state.Summaries()); err != nil {
		return fmt.Errorf("node setup: %w", err)
	}
	recs, err := a.cfg.Store.Load()
	if err != nil {
		return err
	}
	quarantine := func(r store.Allocation, why string, err error) {
		reason := fmt.Sprintf("%s: %v", why, err)
		a.log.Error("quarantined allocation: it is routed nowhere until a DEL or GC removes it", "container", r.ContainerID, "pod", r.Pod, "ips", r.IPs, "reason", reason)
		a.state.Quarantine(r, reason)
	}
	for _, r := range recs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.State == store.Pending {
			a.log.Warn("dropping allocation left pending by a crash", "container", r.ContainerID, "pod", r.Pod, "ips", r.IPs)
			if err := a.dropRecord(r, ReapInterrupted); err != nil {
				quarantine(r, "tear down an interrupted ADD", err)
			}
			continue
		}
		gone, err := a.netnsGone(r)
		if err != nil {
			a.log.Warn("cannot tell whether the network namespace exists; keeping the allocation", "container", r.ContainerID, "err", err)
		} else if gone {
			a.log.Warn("reaping allocation whose network namespace is gone", "container", r.ContainerID, "pod", r.Pod, "netns", r.Netns, "ips", r.IPs)
			if err := a.dropRecord(r, ReapNetnsGone); err != nil {
				quarantine(r, "reap (netns gone)", err)
			}
			continue
		}
		r = a.withStaticUID(r)
		warns, err := a.state.Restore(r)
		if err != nil {
			quarantine(r, "restore", err)
			continue
		}
		for _, w := range warns {
			a.log.Warn("restore: " + w)
		}
	}
	a.ensureClaims(ctx)
	a.releaseUnowned(ctx)
	veths, err := a.cfg.Dataplane.HostVeths()
	if err != nil {
		return err
	}
	for _, v := range veths {
		if _, owned := a.state.VethOwner(v); !owned {
			a.log.Warn("removing flock veth that no allocation owns", "veth", v)
			if err := a.cfg.Dataplane.Teardown(v); err != nil {
				a.log.Error("orphan veth stays", "veth", v, "err", err)
			}
		}
	}
	a.log.Info("allocations recovered", "allocations", a.state.Count(), "summaries", a.state.Summaries())
	return nil
}

// dropRecord removes a record that never made it into the state.
func (a *Agent) dropRecord(r store.Allocation, reason string) error {
	if r.HostVeth != "" {
		if err := a.cfg.Dataplane.Teardown(r.HostVeth); err != nil {
			return err
		}
	}
	a.releaseClaims(context.Background(), a.claimsOf(r, nil, nil))
	if err := a.cfg.Store.Delete(r.ContainerID); err != nil {
		return err
	}
	a.reaped(reason)
	return nil
}

func (a *Agent) reaped(reason string) {
	if a.cfg.Reaped != nil {
		a.cfg.Reaped(reason)
	}
}

func (a *Agent) netnsGone(r store.Allocation) (bool, error) {
	ok, err := a.cfg.Dataplane.NetnsExists(r.Netns)
	if err != nil {
		return false, fmt.Errorf("allocation %s: %w", r.ContainerID, err)
	}
	return !ok, nil
}
