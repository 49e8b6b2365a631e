package claims

// A Service's claims: LoadBalancer addresses (use loadBalancer), created,
// updated and deleted by the leader-elected assigner alone. They name no
// pod, node or container; the GC and the node's view (Node, Changed) leave
// them out.
//
// A shared address (MetalLB's allow-shared-ip) is still one claim: it
// names the sharing key, its first holder (spec.service, what older
// readers see) and the other holders (spec.sharers), each with the terms
// the assigner holds it under (ServiceRef.Terms). A Service joins it by
// claiming under the same non-empty key — an update carrying the
// resourceVersion it read, so two joins cannot lose one another — and
// leaves it by releasing: the claim is deleted only with its last holder.
// The assigner decides who may share (ports, traffic policy, selector);
// the key in the claim keeps anyone else out even if two assigners ran
// at once. A claim written before sharing existed has neither key nor
// sharers and reads as its one Service's.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// ServiceRef names the Service holding a LoadBalancer address.
type ServiceRef struct {
	Namespace, Name string
	// UID of the Service; "" matches any incarnation (see Same).
	UID string
	// Terms are what it shares the address under besides the key, as the
	// assigner writes them (opaque here; not part of its identity).
	Terms string
}

// String is "namespace/name", for people.
func (s ServiceRef) String() string { return s.Namespace + "/" + s.Name }

// Same tells whether s and o are the same Service: the same namespace and
// name, and the same UID when both know theirs (a Service re-created
// under the same name is another holder).
func (s ServiceRef) Same(o ServiceRef) bool {
	return s.Namespace == o.Namespace && s.Name == o.Name && (s.UID == "" || o.UID == "" || s.UID == o.UID)
}

// checkService validates a Service's claim (use loadBalancer): a Service
// with namespace and name, and no pod, container or node.
func checkService(cl Claim) error {
	s := cl.Service
	switch {
	case s == nil:
		return fmt.Errorf("address claim %s: use %q: no service", cl.IP, cl.Use)
	case s.Namespace == "" || s.Name == "":
		return fmt.Errorf("address claim %s: service %q: namespace and name are required", cl.IP, s)
	case cl.Pod != (podmeta.ID{}):
		return fmt.Errorf("address claim %s for Service %s: pod %q: a Service's claim names no pod", cl.IP, s, cl.Pod)
	case cl.ContainerID != "":
		return fmt.Errorf("address claim %s for Service %s: container ID %q: a Service's claim names no container", cl.IP, s, cl.ContainerID)
	case cl.Node != "":
		return fmt.Errorf("address claim %s for Service %s: node %q: a Service's claim names no node", cl.IP, s, cl.Node)
	case len(cl.Sharers) > 0:
		return fmt.Errorf("address claim %s for Service %s: sharers %v: a Service joins a shared claim by claiming it under its key", cl.IP, s, cl.Sharers)
	}
	return nil
}

// ClaimService claims ip, authorized by pool, for the Service (use
// loadBalancer), unshared (ClaimSharedService with no key): it creates the
// AddressClaim, which fails if the IP is held. A claim that already exists for the same Service
// (ServiceRef.Same) is ours and ClaimService returns nil; any other holder
// — a pod, another Service — is a *ClaimedError naming it. An answer lost
// on the way is read back as Claim does (ErrAmbiguous when that fails
// too).
func (c *Claims) ClaimService(ctx context.Context, ip netip.Addr, pool string, svc ServiceRef) error {
	return c.ClaimSharedService(ctx, ip, pool, "", svc)
}

// ClaimSharedService is ClaimService under a sharing key (the Service's
// allow-shared-ip; "" is ClaimService) and terms (svc.Terms, recorded for
// the assigner): a claim whose Services hold the address under the same
// non-empty key gains this one as a sharer. The Service's own claim is
// ours, and takes its key and terms. Anything else — a pod's claim,
// another key, a claim not shareable — is a *ClaimedError.
func (c *Claims) ClaimSharedService(ctx context.Context, ip netip.Addr, pool, key string, svc ServiceRef) error {
	return c.Claim(ctx, Claim{IP: ip, Use: v1alpha1.UseLoadBalancer, Pool: pool, Service: &svc, SharingKey: key})
}

// joinService settles a Service's claim that found u (holder, as read)
// in its way: nil when the Service holds it already, or has joined its
// sharers under the same key (see ClaimSharedService); a *ClaimedError
// when it may not; again when the claim changed or went since it was
// read, and Claim must look again.
func (c *Claims) joinService(ctx context.Context, u *unstructured.Unstructured, holder, cl Claim) (again bool, err error) {
	next, write, ok := join(holder, cl)
	if !ok {
		return false, &ClaimedError{IP: cl.IP, Holder: holder}
	}
	if !write {
		c.log.Debug("address already claimed by this Service", "ip", cl.IP, "claim", u.GetName(), "holder", holder.Describe())
		return false, nil
	}
	err = c.updateHolders(ctx, u, next)
	switch {
	case err == nil:
		c.log.Debug("address claim shared", "ip", cl.IP, "claim", u.GetName(), "holders", next.Describe())
		return false, nil
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return true, nil
	default:
		return false, fmt.Errorf("claim %s for %s: update AddressClaim %s: %w", cl.IP, cl.who(), u.GetName(), err)
	}
}

// join decides cl's Service's place in h, an existing claim: ok false
// when it may not hold it (a pod's claim, another key, not shareable);
// write when next, h with the Service in it under cl's key and terms,
// must be written.
func join(h, cl Claim) (next Claim, write, ok bool) {
	if !h.isService() || h.Service == nil {
		return h, false, false
	}
	svc := *cl.Service
	holders := h.Holders()
	if i := slices.IndexFunc(holders, svc.Same); i >= 0 {
		if h.SharingKey == cl.SharingKey && holders[i].Terms == svc.Terms {
			return h, false, true
		}
		// A holder's key is the claim's: it takes a new one (or none)
		// only while it holds the address alone. The assigner moves a
		// sharer whose key no longer fits the others, so another holder
		// still there is an orphan it frees first (and a claim with
		// sharers but no key is one the API refuses).
		if h.SharingKey != cl.SharingKey && len(holders) > 1 {
			return h, false, false
		}
		h.SharingKey = cl.SharingKey
		holders[i].Terms = svc.Terms
		return h.withHolders(holders), true, true
	}
	// Sharing stays within a namespace: a key is anyone's to read.
	if cl.SharingKey == "" || h.SharingKey != cl.SharingKey || holders[0].Namespace != svc.Namespace {
		return h, false, false
	}
	return h.withHolders(append(holders, svc)), true, true
}

// withHolders is the claim held by holders (the first is spec.service),
// none: Service nil.
func (cl Claim) withHolders(holders []ServiceRef) Claim {
	cl.Service, cl.Sharers = nil, nil
	if len(holders) > 0 {
		first := holders[0]
		cl.Service = &first
		if len(holders) > 1 {
			cl.Sharers = slices.Clone(holders[1:])
		}
	}
	return cl
}

// updateHolders writes the holders of next (its service, sharingKey and
// sharers) into u, the claim as read: an update carrying u's
// resourceVersion, which fails with a conflict if the claim changed since.
func (c *Claims) updateHolders(ctx context.Context, u *unstructured.Unstructured, next Claim) error {
	want, err := object(next)
	if err != nil {
		return err
	}
	upd := u.DeepCopy()
	upd.Object["spec"] = want.Object["spec"]
	_, err = c.res().Update(ctx, upd, metav1.UpdateOptions{})
	return err
}

// ReleaseService gives up the Service's hold on ip (ServiceRef.Same): the
// claim is deleted if the Service is its only holder, or else updated
// without it (a shared address stays with its other sharers). A claim
// that does not exist, or that the Service does not hold (a pod, other
// Services, another incarnation of this one), is left alone and
// ReleaseService returns nil. The delete carries the UID and
// resourceVersion it read as preconditions, as Release's does; the update
// its resourceVersion.
func (c *Claims) ReleaseService(ctx context.Context, ip netip.Addr, svc ServiceRef) error {
	if svc.Namespace == "" || svc.Name == "" {
		return fmt.Errorf("release address claim %s: service %q: namespace and name are required", ip, svc)
	}
	return c.release(ctx, ip, "Service "+svc.String(), func(h Claim) (Claim, bool) {
		return h.without(svc), h.HeldBy(svc)
	})
}

// without is the claim with svc no longer among its holders: the first
// remaining one becomes spec.service, Service nil when none remains.
func (cl Claim) without(svc ServiceRef) Claim {
	return cl.withHolders(slices.DeleteFunc(cl.Holders(), svc.Same))
}

// ServiceClaims returns every Service's claim (use loadBalancer) from the
// cache, sorted by IP.
func (c *Claims) ServiceClaims() []Claim { return c.indexed(useIndex, v1alpha1.UseLoadBalancer) }

// PodClaims are every pod's claims in the cache (uses pod and addresses),
// sorted by IP: what the assigner must never hand a Service.
func (c *Claims) PodClaims() []Claim {
	out := append(c.indexed(useIndex, v1alpha1.UsePod), c.indexed(useIndex, v1alpha1.UseAddresses)...)
	slices.SortFunc(out, func(a, b Claim) int { return a.IP.Compare(b.IP) })
	return out
}
