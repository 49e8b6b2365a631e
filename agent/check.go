package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
)

// Check compares the kernel with the record; prev, if set, are the IPs of
// the runtime's cached result, which must match the record.
func (a *Agent) Check(ctx context.Context, containerID, ifName string, prev []netip.Addr) error {
	if err := validateContainerID(containerID); err != nil {
		return err
	}
	unlock := a.locks.Lock(containerID)
	defer unlock()
	rec, phase, ok := a.state.Get(containerID)
	if !ok || phase != nodestate.Committed {
		return &Error{Code: codeUnknownContainer, Err: fmt.Errorf("no flock allocation for container %s", containerID)}
	}
	if ifName != "" && ifName != rec.IfName {
		return &Error{Code: codeConfig, Err: fmt.Errorf("container %s: flock interface is %s, not %s", containerID, rec.IfName, ifName)}
	}
	if prev != nil {
		want := append(v6First(rec.IPs), rec.Addresses...)
		if !sameSet(prev, want) {
			return fmt.Errorf("container %s: cached result has IPs %v, the agent has %v", containerID, prev, want)
		}
	}
	return a.cfg.Dataplane.Check(podOf(rec))
}

func sameSet(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	x := slices.Clone(a)
	y := slices.Clone(b)
	slices.SortFunc(x, netip.Addr.Compare)
	slices.SortFunc(y, netip.Addr.Compare)
	return slices.Equal(x, y)
}
