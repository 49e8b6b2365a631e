package claims

// A Service's claims: LoadBalancer addresses (use loadBalancer), created
// and deleted by the leader-elected assigner alone. They name no pod, node
// or container; the GC and the node's view (Node, Changed) leave them out.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// ServiceRef names the Service holding a LoadBalancer address.
type ServiceRef struct {
	Namespace, Name string
	// UID of the Service; "" matches any incarnation (see Same).
	UID string
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
	}
	return nil
}

// ClaimService claims ip, authorized by pool, for the Service (use
// loadBalancer): it creates the AddressClaim, which fails if the IP is
// held. A claim that already exists for the same Service (ServiceRef.Same)
// is ours and ClaimService returns nil; any other holder — a pod, another
// Service — is a *ClaimedError naming it. An answer lost on the way is
// read back as Claim does (ErrAmbiguous when that fails too).
func (c *Claims) ClaimService(ctx context.Context, ip netip.Addr, pool string, svc ServiceRef) error {
	return c.Claim(ctx, Claim{IP: ip, Use: v1alpha1.UseLoadBalancer, Pool: pool, Service: &svc})
}

// ReleaseService deletes the claim of ip if the Service holds it
// (ServiceRef.Same). A claim that does not exist, or that someone else
// holds (a pod, another Service, another incarnation of this one), is not
// the Service's to delete: ReleaseService returns nil and leaves it. The
// delete carries the UID and resourceVersion it read as preconditions, as
// Release's does.
func (c *Claims) ReleaseService(ctx context.Context, ip netip.Addr, svc ServiceRef) error {
	if svc.Namespace == "" || svc.Name == "" {
		return fmt.Errorf("release address claim %s: service %q: namespace and name are required", ip, svc)
	}
	return c.release(ctx, ip, "Service "+svc.String(), func(h Claim) bool {
		return h.isService() && h.Service != nil && h.Service.Same(svc)
	})
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
