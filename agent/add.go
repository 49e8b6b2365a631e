package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Add runs the ADD flow and returns the committed allocation. It ends
// within AddTimeout whatever stalls (the API server, another operation
// on the container), rolled back completely.
func (a *Agent) Add(ctx context.Context, containerID, netns, ifName, cniArgs string) (store.Allocation, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.AddTimeout)
	defer cancel()
	rec, err := a.add(ctx, containerID, netns, ifName, cniArgs)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = &Error{Code: codeTryAgain, Err: fmt.Errorf("ADD of container %s did not finish within %v; nothing was kept: %w", containerID, a.cfg.AddTimeout, err)}
	}
	return rec, err
}

func (a *Agent) add(ctx context.Context, containerID, netns, ifName, cniArgs string) (store.Allocation, error) {
	if err := validateAttachment(containerID, netns, ifName); err != nil {
		return store.Allocation{}, err
	}
	args, err := podmeta.ParseArgs(cniArgs)
	if err != nil {
		return store.Allocation{}, &Error{Code: codeEnv, Err: err}
	}
	start := time.Now()
	unlock, err := a.locks.LockCtx(ctx, containerID)
	if err != nil {
		return store.Allocation{}, fmt.Errorf("waiting for another operation on container %s: %w", containerID, err)
	}
	defer unlock()

	if r, phase, ok := a.state.Get(containerID); ok {
		switch phase {
		case nodestate.Committed:
			if r.IfName != ifName {
				return store.Allocation{}, &Error{Code: codeConfig, Err: fmt.Errorf("container %s already has flock interface %s; a second interface %s is not supported", containerID, r.IfName, ifName)}
			}
			return r, nil // kubelet retried an ADD that succeeded
		case nodestate.Stuck:
			if err := a.teardown(r); err != nil {
				return store.Allocation{}, fmt.Errorf("an earlier failed ADD of %s cannot be cleaned up: %w", containerID, err)
			}
		default:
			return store.Allocation{}, &Error{Code: codeTryAgain, Err: fmt.Errorf("container %s is being deleted (an earlier DEL failed); retry the DEL first", containerID)}
		}
	}
	pod, err := a.cfg.Source.Lookup(ctx, args)
	if err != nil {
		return store.Allocation{}, err
	}
	req, err := annotations.Parse(pod.Annotations, a.defaults)
	if err != nil {
		return store.Allocation{}, err
	}
	// Nothing is allocated for a value no AddressPool allows.
	pools, ranges, err := a.authorize(pod, req)
	if err != nil {
		return store.Allocation{}, err
	}
	rec, draft, err := a.reserve(ctx, containerID, ifName, netns, pod, req, pools, ranges)
	if err != nil && heldByDeleted(err) {
		// An address (or the last free one) may be held only by a deleted
		// pod whose veth is being unregistered (or was a moment ago): try
		// again once that is done rather than refuse the ADD.
		a.removals.wait()
		rec, draft, err = a.reserve(ctx, containerID, ifName, netns, pod, req, pools, ranges)
	}
	if err != nil {
		return store.Allocation{}, err
	}
	committed := false
	defer func() {
		if !committed {
			a.rollback(rec, a.claimsOf(rec, nil, nil))
		}
	}()
	reserved := time.Now()
	_, err = a.cfg.Dataplane.Setup(podOf(rec))
	if errors.Is(err, dataplane.ErrInterfaceExists) && a.removals.wait() {
		// The name may be a deleted pod's, in the same netns, whose veth
		// is still being removed (a runtime that ADDs into a netns right
		// after a DEL from it): try again once the removals running now
		// are done. Nothing was created.
		_, err = a.cfg.Dataplane.Setup(podOf(rec))
	}
	if err != nil {
		return store.Allocation{}, err
	}
	programmed := time.Now()
	if h := a.cfg.Hooks.BeforeCommit; h != nil {
		h(containerID)
	}
	rec.State = store.Committed
	if err := a.cfg.Store.Commit(draft); err != nil {
		return store.Allocation{}, err
	}
	gen, err := a.state.Commit(rec)
	if err != nil {
		return store.Allocation{}, err
	}
	committed = true
	stored := time.Now()
	a.settle(ctx, gen) // the UPDATE leaves before ADD returns
	a.log.Info("pod added", "container", containerID, "pod", pod.ID, "ips", rec.IPs, "veth", rec.HostVeth,
		"reserve", reserved.Sub(start), "dataplane", programmed.Sub(reserved), "commit", stored.Sub(programmed), "advertise", time.Since(stored))
	return rec, nil
}

// claimAttempts bounds the retries of a pod address from a cluster-wide
// range that another node claimed first (its claim not yet in our cache).
const claimAttempts = 4

// reserve takes what an ADD needs — IPs, local claims, veth name and the
// veth's MACs (so the record is whole before the kernel is touched) —
// writes the pending record (a crash from here on leaves a record the
// next start tears down; it reaches the disk while the veth is
// programmed) and takes the cluster-wide claims. A pod address from a
// range that another node took meanwhile is picked again; an IP the pod
// asked for by name is not.
func (a *Agent) reserve(ctx context.Context, containerID, ifName, netns string, pod podmeta.Pod, req annotations.Request, pools grants, ranges map[netip.Prefix]string) (store.Allocation, *store.Draft, error) {
	id := ipam.Identity{Namespace: pod.Namespace, App: pod.App, Image: pod.Image, ContainerID: containerID}
	lost := map[netip.Addr]bool{} // claimed elsewhere during this ADD
	for attempt := 1; ; attempt++ {
		var reqs []ipam.Request
		for _, fam := range []struct {
			want bool
			n    int
			rng  netip.Prefix
		}{{req.IPv6, 6, req.CIDR6}, {req.IPv4, 4, req.CIDR4}} {
			if !fam.want {
				continue
			}
			r := ipam.Request{Family: fam.n, Range: fam.rng, Algo: req.Algo, Identity: id}
			if a.cfg.Claims != nil && fam.rng.IsValid() && !a.inSummary(fam.rng) {
				// Only pods from cluster-wide ranges pay for this.
				r.Avoid = func(ip netip.Addr) bool { return lost[ip] || a.cfg.Claims.Taken(ip) }
			}
			reqs = append(reqs, r)
		}
		rec, err := a.state.Reserve(store.Allocation{
			ContainerID: containerID, IfName: ifName, Netns: netns, Pod: pod.ID,
			Anycast: req.Anycast, Addresses: req.Addresses, Created: time.Now().UTC(),
			HostMAC: dataplane.RandomMAC().String(), PodMAC: dataplane.RandomMAC().String(),
		}, reqs)
		if err != nil {
			return store.Allocation{}, nil, err
		}
		draft, err := a.cfg.Store.Begin(rec)
		if err != nil {
			a.rollback(rec, nil)
			return store.Allocation{}, nil, err
		}
		if a.cfg.Claims == nil {
			return rec, draft, nil
		}
		if _, err = a.claim(ctx, a.claimsOf(rec, pools, ranges)); err == nil {
			return rec, draft, nil
		}
		a.rollback(rec, nil) // claim gave back what it took
		var ce *ClaimError
		if !errors.As(err, &ce) || !errors.Is(err, ErrClaimed) || attempt == claimAttempts {
			return store.Allocation{}, nil, err
		}
		rng := req.CIDR6
		if ce.IP.Is4() {
			rng = req.CIDR4
		}
		if ce.Use != v1alpha1.UsePod || rng.IsSingleIP() {
			return store.Allocation{}, nil, err // the pod asked for exactly that IP
		}
		lost[ce.IP] = true
		a.log.Info("pod address claimed by another node meanwhile; picking another", "container", containerID, "attempt", attempt, "err", err)
	}
}

func podOf(r store.Allocation) dataplane.Pod {
	p := dataplane.Pod{ContainerID: r.ContainerID, HostVeth: r.HostVeth, Netns: r.Netns, IfName: r.IfName, IPs: r.IPs, Addresses: r.Addresses, Anycast: r.Anycast}
	// Records are written with both MACs; an unreadable one leaves the
	// kernel to pick.
	p.HostMAC, _ = net.ParseMAC(r.HostMAC)
	p.PodMAC, _ = net.ParseMAC(r.PodMAC)
	return p
}

// rollback undoes a failed ADD: kernel state, cluster-wide claims,
// record, IPs, local claims. What cannot be undone now keeps the
// attachment stuck — its IPs and pending record held — until the DEL the
// runtime sends after a failed ADD (or the next start) finishes the job:
// handing the IPs out again while the old veth may still route them would
// be worse. A claim the API did not let go of is the claim GC's (see
// releaseClaims): no other pod gets its IP meanwhile, the API refuses it.
func (a *Agent) rollback(rec store.Allocation, claimed []Claim) {
	err := a.cfg.Dataplane.Teardown(rec.HostVeth)
	if err == nil {
		a.releaseClaims(context.Background(), claimed)
	}
	if err == nil {
		err = a.cfg.Store.Delete(rec.ContainerID)
	}
	if err != nil {
		a.log.Error("rollback incomplete; the attachment is held until DEL", "container", rec.ContainerID, "err", err)
		a.state.MarkStuck(rec.ContainerID, "rollback of a failed ADD: "+err.Error())
		return
	}
	a.state.Release(rec.ContainerID)
}

// teardown removes an attachment for good: veth, record, then what the
// state holds (it also finishes a stuck rollback). Call with the
