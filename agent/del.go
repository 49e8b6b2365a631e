package agent

import (
	"context"
	"errors"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
)

func (a *Agent) teardown(rec store.Allocation) error {
	if err := a.cfg.Dataplane.Teardown(rec.HostVeth); err != nil {
		return err
	}
	a.releaseClaims(context.Background(), a.claimsOf(rec, nil, nil))
	if err := a.cfg.Store.Delete(rec.ContainerID); err != nil {
		return err
	}
	a.state.Release(rec.ContainerID)
	return nil
}

// remove takes a committed (or half-deleted) attachment out of every route
// first, then tears it down and releases it. Call with the container's lock
// held.
func (a *Agent) remove(ctx context.Context, rec store.Allocation) error {
	a.withdraw(ctx, rec.ContainerID)
	return a.teardown(rec)
}

// withdraw takes an attachment out of every route and advertisement and
// waits (bounded) until the reconcilers applied that: other replicas' ECMP
// routes must stop naming its veth before the veth goes down, and the ToR
// should stop sending traffic here.
func (a *Agent) withdraw(ctx context.Context, id string) {
	if gen, ok := a.state.MarkDeleting(id); ok {
		a.settle(ctx, gen)
	}
}

// Del tears a container down. Unknown containers succeed; a leftover veth
// of the container's name is still removed, unless another container holds
// that name.
//
// The kernel needs ~20 ms (an RCU grace period) to unregister a veth: more
// than the rest of a DEL together. So DEL withdraws the routes, takes the
// veth down, releases the cluster-wide claims and deletes the record, and
// returns; the veth is unregistered afterwards, still under the container's
// lock (a retried ADD or DEL of the container waits for it) and with its
// IPs and name held until it is gone. A crash meanwhile leaves a veth no
// record owns, which the next start removes before it serves.
func (a *Agent) Del(ctx context.Context, containerID string) error {
	return a.del(ctx, containerID, true)
}

// del is Del; early false removes the veth before returning (GC: nobody
// waits on it, and its errors are reported).
func (a *Agent) del(ctx context.Context, containerID string, early bool) error {
	if err := validateContainerID(containerID); err != nil {
		return err
	}
	unlock := a.locks.Lock(containerID)
	handedOff := false
	defer func() {
		if !handedOff {
			unlock()
		}
	}()
	rec, phase, known := a.state.Get(containerID)
	if !known {
		// A leftover veth of the container's default name goes, unless a
		// live container holds that name (a hash collision); the name is
		// held meanwhile so that no ADD takes it under our feet.
		name := dataplane.HostVethName(containerID)
		if release, ok := a.state.HoldVeth(name, containerID); ok {
			err := a.cfg.Dataplane.Teardown(name)
			release()
			if err != nil {
				return err
			}
		}
		// A record the state does not know (one left by a failed
		// rollback before a restart) goes too.
		return a.cfg.Store.Delete(containerID)
	}
	if phase == nodestate.Stuck {
		return a.teardown(rec)
	}
	if !early {
		return a.remove(ctx, rec)
	}
	start := time.Now()
	a.withdraw(ctx, rec.ContainerID)
	withdrawn := time.Since(start)
	// The record goes before the veth goes down: a restart must never
	// find a committed record whose veth is already down (it would route
	// the pod again into a dead link); a veth no record owns it removes.
	a.releaseClaims(context.Background(), a.claimsOf(rec, nil, nil))
	if err := a.cfg.Store.Delete(rec.ContainerID); err != nil {
		return err
	}
	if err := a.cfg.Dataplane.Retire(rec.HostVeth); err != nil {
		return err // the state still knows it: a retried DEL finishes
	}
	handedOff = true
	done := a.removals.start()
	go func() {
		defer done()
		defer unlock()
		var err error
		for attempt, wait := 1, 10*time.Millisecond; ; attempt, wait = attempt+1, 2*wait {
			if err = a.cfg.Dataplane.Teardown(rec.HostVeth); err == nil {
				a.state.Release(containerID)
				return
			}
			if attempt == removeAttempts {
				break
			}
			time.Sleep(wait)
		}
		// Down and unrouted, but its IPs stay held until a DEL or the next
		// start removes it.
		a.log.Error("veth of a deleted pod not removed; its IPs are held until a DEL or the next start", "container", containerID, "veth", rec.HostVeth, "err", err)
		a.state.MarkStuck(containerID, "remove the veth after DEL: "+err.Error())
	}()
	a.log.Info("pod deleted", "container", containerID, "pod", rec.Pod, "ips", rec.IPs, "withdrawn", withdrawn, "took", time.Since(start))
	return nil
}

// removeAttempts bounds the retries of a veth removal after DEL (10 ms
// apart, doubling): the container's lock is held meanwhile.
const removeAttempts = 5

// heldByDeleted tells whether a reservation failed on something a deleted
// pod may still hold: an address or the last free one.
func heldByDeleted(err error) bool {
	var ce *nodestate.ConflictError
	return errors.Is(err, ipam.ErrExhausted) || errors.Is(err, ipam.ErrConflict) || errors.As(err, &ce)
}

// Wait returns once no veth removal a DEL left running is left (shutdown,
// and tests at quiescent points).
func (a *Agent) Wait() {
	for a.removals.wait() {
	}
}

// Attachment names one container interface the runtime still uses.
type Attachment struct{ ContainerID, IfName string }

// GC deletes every attachment (committed, or left by a failed ADD or DEL)
// whose container interface the runtime no longer lists (CNI GC, spec
// 1.1). An ADD in progress is left alone.
func (a *Agent) GC(ctx context.Context, valid []Attachment) error {
	keep := map[Attachment]bool{}
	for _, v := range valid {
		keep[v] = true
	}
	var errs []error
	for _, r := range a.state.Attachments(nodestate.Committed, nodestate.Deleting, nodestate.Stuck) {
		if keep[Attachment{r.ContainerID, r.IfName}] {
			continue
		}
		a.log.Info("GC: releasing attachment the runtime no longer knows", "container", r.ContainerID, "ifname", r.IfName)
		if err := a.del(ctx, r.ContainerID, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// keyedMutex serialises operations on one container ID. A waiter can give
