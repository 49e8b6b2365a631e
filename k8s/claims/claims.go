// Package claims makes IPs unique cluster-wide through the API server: one
// cluster-scoped AddressClaim per IP, named after the IP (ClaimName), so
// that creating it is the atomic test-and-set and etcd is the consensus.
// An `addresses` IP, or a pod address from an AddressPool that is not a
// node summary, is claimed by its pod before the dataplane is touched and
// released on DEL; GC removes the claims whose pod is gone and that nobody
// released. A LoadBalancer address is claimed by its Service (use
// loadBalancer: ClaimService, ReleaseService), written by the
// leader-elected assigner alone; the GC never touches those. Services
// sharing an address (MetalLB's allow-shared-ip) share its one claim: it
// names the sharing key and every sharer, a Service joins it only under
// the same key, and it is deleted when its last holder releases it.
//
// Use: New, go Run, WaitSynced, then Claim, Release (ClaimService,
// ReleaseService) and the cache readers (Taken, Node, ServiceClaims,
// CountByPool).
package claims

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// GVR of AddressClaim.
var GVR = v1alpha1.GroupVersion.WithResource(v1alpha1.AddressClaimResource)

// Labels every claim carries (when the value is a valid label value: a node
// or pool name longer than 63 characters is left out of the labels, the
// spec still has it), so that e.g.
// `kubectl get addressclaims -l flock.fritzlab.net/node=node-a` works.
const (
	LabelNode = "flock.fritzlab.net/node"
	LabelPool = "flock.fritzlab.net/pool"
)

// Name prefixes of ClaimName.
const (
	prefix4 = "ipv4-"
	prefix6 = "ipv6-"
)

// ClaimName is the name of the AddressClaim of ip: "ipv4-192.0.2.1", or
// "ipv6-" and the fully expanded, lowercase address with '-' for ':'
// ("ipv6-2001-0db8-0000-0000-0000-0000-0000-0001"). It is a DNS-1123
// subdomain and one-to-one with addresses (ParseClaimName inverts it). An
// IPv4-mapped IPv6 address is unmapped first: ::ffff:192.0.2.1 and
// 192.0.2.1 are the same address on the wire and share one claim. A zone
// is dropped — it names a link, not an address (Claim refuses zoned IPs
// altogether). The invalid Addr yields "".
func ClaimName(ip netip.Addr) string {
	if !ip.IsValid() {
		return ""
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return prefix4 + ip.String()
	}
	return prefix6 + strings.ReplaceAll(ip.StringExpanded(), ":", "-")
}

// ParseClaimName is the inverse of ClaimName: it accepts exactly the names
// ClaimName produces.
func ParseClaimName(name string) (netip.Addr, error) {
	var s string
	switch {
	case strings.HasPrefix(name, prefix4):
		s = strings.TrimPrefix(name, prefix4)
	case strings.HasPrefix(name, prefix6):
		s = strings.ReplaceAll(strings.TrimPrefix(name, prefix6), "-", ":")
	default:
		return netip.Addr{}, fmt.Errorf("claim name %q: want an ipv4- or ipv6- prefix", name)
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("claim name %q: %w", name, err)
	}
	if ClaimName(ip) != name {
		return netip.Addr{}, fmt.Errorf("claim name %q: not canonical (want %q)", name, ClaimName(ip))
	}
	return ip, nil
}

// Claim is one IP held by one pod, or by one or more Services (a shared
// LoadBalancer address).
type Claim struct {
	IP netip.Addr
	// Use is v1alpha1.UsePod or v1alpha1.UseAddresses (held by Pod), or
	// v1alpha1.UseLoadBalancer (held by Service).
	Use string
	// Pool is the AddressPool that authorized the IP.
	Pool string
	// Pod holds a pod's claim; zero in a Service's.
	Pod podmeta.ID
	// Service holds a LoadBalancer address; nil in a pod's claim.
	Service *ServiceRef
	// SharingKey is the allow-shared-ip key the Services hold the address
	// under ("" not shareable); a Service joins only with the same key.
	SharingKey string
	// Sharers hold the address besides Service, under SharingKey. Claim
	// takes none: a Service joins by claiming under the key.
	Sharers []ServiceRef
	// Node the pod runs on; Claim fills in the Claims' node when empty
	// (a pod's claim only: a Service's has none).
	Node        string
	ContainerID string
	// Created is the object's creationTimestamp (set by the API server;
	// ignored by Claim).
	Created time.Time
}

// isService tells whether a Service holds the claim (use loadBalancer).
func (cl Claim) isService() bool { return cl.Use == v1alpha1.UseLoadBalancer }

// Holders are the Services holding a LoadBalancer address: Service, then
// the sharers; none for a pod's claim.
func (cl Claim) Holders() []ServiceRef {
	if !cl.isService() || cl.Service == nil {
		return nil
	}
	return append([]ServiceRef{*cl.Service}, cl.Sharers...)
}

// HeldBy tells whether the Service holds the claim, alone or as one of
// its sharers (ServiceRef.Same).
func (cl Claim) HeldBy(svc ServiceRef) bool {
	return slices.ContainsFunc(cl.Holders(), svc.Same)
}

// who names the holder briefly: "pod ns/name" or "Service ns/name".
func (cl Claim) who() string {
	switch {
	case cl.isService() && cl.Service == nil:
		return "a Service"
	case cl.isService():
		return "Service " + cl.Service.String()
	}
	return "pod " + cl.Pod.String()
}

// Describe names the holder for people: "Service ns/name (uid …)", or
// "pod ns/name (uid …) on node …, container …".
func (cl Claim) Describe() string {
	var b strings.Builder
	switch {
	case cl.isService() && cl.Service == nil:
		return "a Service (use loadBalancer, none named)"
	case cl.isService():
		for i, h := range cl.Holders() {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "Service %s", h)
			if h.UID != "" {
				fmt.Fprintf(&b, " (uid %s)", h.UID)
			}
		}
		if cl.SharingKey != "" {
			fmt.Fprintf(&b, " (sharing key %q)", cl.SharingKey)
		}
		return b.String()
	}
	fmt.Fprintf(&b, "pod %s", cl.Pod)
	if cl.Pod.UID != "" {
		fmt.Fprintf(&b, " (uid %s)", cl.Pod.UID)
	}
	fmt.Fprintf(&b, " on node %s, container %s", cl.Node, shortID(cl.ContainerID))
	return b.String()
}

// ClaimedError is an IP another holder has: another pod (or another
// sandbox of the same pod), or a Service.
type ClaimedError struct {
	IP     netip.Addr
	Holder Claim
}

func (e *ClaimedError) Error() string {
	return fmt.Sprintf("%s is claimed by %s", e.IP, e.Holder.Describe())
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Indexes of the cache: nodeIndex by spec.node (pods' claims only: a
// Service's claim belongs to no node), useIndex by spec.use.
const (
	nodeIndex = "node"
	useIndex  = "use"
)

// Claims creates, deletes and caches AddressClaims.
type Claims struct {
	dyn      dynamic.Interface
	node     string
	log      *slog.Logger
	informer cache.SharedIndexInformer
	gone     chan struct{}
	services chan struct{} // a Service's claim came, changed or went
}

// New builds the client and takes the (cluster-wide) informer of
// AddressClaims from f, for the agent of node. log nil: slog.Default().
func New(f *kubeclient.Factory, dyn dynamic.Interface, node string, log *slog.Logger) *Claims {
	if log == nil {
		log = slog.Default()
	}
	inf := f.Informer(GVR.String(), func() cache.SharedIndexInformer {
		inf := kubeclient.NewDynamicInformer(dyn, GVR, nil)
		// Before it runs, so it cannot fail.
		_ = inf.AddIndexers(cache.Indexers{
			nodeIndex: func(obj any) ([]string, error) {
				n, ok := podNode(obj)
				if !ok {
					return nil, nil
				}
				return []string{n}, nil
			},
			useIndex: func(obj any) ([]string, error) {
				u, ok := obj.(*unstructured.Unstructured)
				if !ok {
					return nil, nil
				}
				use, _, _ := unstructured.NestedString(u.Object, "spec", "use")
				return []string{use}, nil
			},
		})
		return inf
	})
	c := &Claims{dyn: dyn, node: node, log: log, informer: inf, gone: make(chan struct{}, 1), services: make(chan struct{}, 1)}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.serviceEvent,
		UpdateFunc: func(_, n any) { c.serviceEvent(n) },
		DeleteFunc: func(obj any) { c.deleted(obj); c.serviceEvent(obj) },
	})
	return c
}

// podNode is the spec.node of a pod's claim object; ok false for anything
// else (a Service's claim: it belongs to no node).
func podNode(obj any) (string, bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", false
	}
	if use, _, _ := unstructured.NestedString(u.Object, "spec", "use"); use == v1alpha1.UseLoadBalancer {
		return "", false
	}
	n, _, _ := unstructured.NestedString(u.Object, "spec", "node")
	return n, true
}

// deleted signals Changed for this node's claims that leave the API.
func (c *Claims) deleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if n, ok := podNode(obj); !ok || n != c.node {
		return
	}
	select {
	case c.gone <- struct{}{}:
	default:
	}
}

// serviceEvent signals ServicesChanged for a Service's claim.
func (c *Claims) serviceEvent(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if _, pod := podNode(obj); pod {
		return
	}
	select {
	case c.services <- struct{}{}:
	default:
	}
}

// ServicesChanged receives a value (coalesced) after a Service's claim
// came, changed or went: the nodes advertise a LoadBalancer address only
// while the Service in whose status it stands holds its claim.
func (c *Claims) ServicesChanged() <-chan struct{} { return c.services }

// Changed receives a value (coalesced) after a claim of this node left the
// API, released or deleted by someone else: the agent claims again what
// a live pod still needs.
func (c *Claims) Changed() <-chan struct{} { return c.gone }

func (c *Claims) res() dynamic.ResourceInterface { return c.dyn.Resource(GVR) }

// check validates a claim and returns it normalized.
func (c *Claims) check(cl Claim) (Claim, error) {
	if !cl.IP.IsValid() {
		return cl, errors.New("address claim: no IP")
	}
	if cl.IP.Zone() != "" {
		return cl, fmt.Errorf("address claim %s: an IP with a zone cannot be claimed", cl.IP)
	}
	cl.IP = cl.IP.Unmap()
	switch cl.Use {
	case v1alpha1.UseLoadBalancer:
		return cl, checkService(cl)
	case v1alpha1.UsePod, v1alpha1.UseAddresses:
	default:
		return cl, fmt.Errorf("address claim %s: use %q: want %q, %q or %q", cl.IP, cl.Use, v1alpha1.UsePod, v1alpha1.UseAddresses, v1alpha1.UseLoadBalancer)
	}
	if cl.Service != nil {
		return cl, fmt.Errorf("address claim %s for pod %s: service %q: a claim of use %q is a pod's, not a Service's", cl.IP, cl.Pod, cl.Service, cl.Use)
	}
	if cl.SharingKey != "" || len(cl.Sharers) > 0 {
		return cl, fmt.Errorf("address claim %s for pod %s: sharing key %q: a pod's claim is never shared", cl.IP, cl.Pod, cl.SharingKey)
	}
	if cl.Pod.Namespace == "" || cl.Pod.Name == "" {
		return cl, fmt.Errorf("address claim %s: pod %q: namespace and name are required", cl.IP, cl.Pod)
	}
	if cl.ContainerID == "" {
		return cl, fmt.Errorf("address claim %s for pod %s: no container ID", cl.IP, cl.Pod)
	}
	if cl.Node == "" {
		cl.Node = c.node
	}
	if cl.Node == "" {
		return cl, fmt.Errorf("address claim %s for pod %s: no node", cl.IP, cl.Pod)
	}
	return cl, nil
}

// object is the AddressClaim to create for cl.
func object(cl Claim) (*unstructured.Unstructured, error) {
	ac := v1alpha1.AddressClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.AddressClaimKind},
		ObjectMeta: metav1.ObjectMeta{
			Name:   ClaimName(cl.IP),
			Labels: map[string]string{},
		},
		Spec: v1alpha1.AddressClaimSpec{
			IP:          cl.IP.String(),
			Use:         cl.Use,
			Pool:        cl.Pool,
			Node:        cl.Node,
			ContainerID: cl.ContainerID,
		},
	}
	if cl.Pod != (podmeta.ID{}) {
		ac.Spec.Pod = &v1alpha1.ClaimPod{Namespace: cl.Pod.Namespace, Name: cl.Pod.Name, UID: cl.Pod.UID, StaticUID: cl.Pod.StaticUID}
	}
	if s := cl.Service; s != nil {
		ac.Spec.Service = &v1alpha1.ClaimService{Namespace: s.Namespace, Name: s.Name, UID: s.UID, Terms: s.Terms}
	}
	ac.Spec.SharingKey = cl.SharingKey
	for _, s := range cl.Sharers {
		ac.Spec.Sharers = append(ac.Spec.Sharers, v1alpha1.ClaimService{Namespace: s.Namespace, Name: s.Name, UID: s.UID, Terms: s.Terms})
	}
	for k, v := range map[string]string{LabelNode: cl.Node, LabelPool: cl.Pool} {
		if v != "" && len(validation.IsValidLabelValue(v)) == 0 {
			ac.Labels[k] = v
		}
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&ac)
	if err != nil {
		return nil, fmt.Errorf("address claim %s: %w", ac.Name, err)
	}
	// Server-set; the converter writes creationTimestamp: null.
	unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
	return &unstructured.Unstructured{Object: m}, nil
}

// ClaimOf converts an AddressClaim object. It is lenient: a spec.ip that
// does not parse is taken from the object's name, so an object that exists
// always reports its IP as taken.
func ClaimOf(u *unstructured.Unstructured) (Claim, error) {
	var ac v1alpha1.AddressClaim
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ac); err != nil {
		ip, _ := ParseClaimName(u.GetName())
		return Claim{IP: ip, Created: u.GetCreationTimestamp().Time}, fmt.Errorf("address claim %s: %w", u.GetName(), err)
	}
	cl := Claim{
		Use:         ac.Spec.Use,
		Pool:        ac.Spec.Pool,
		SharingKey:  ac.Spec.SharingKey,
		Node:        ac.Spec.Node,
		ContainerID: ac.Spec.ContainerID,
		Created:     ac.CreationTimestamp.Time,
	}
	for _, s := range ac.Spec.Sharers {
		cl.Sharers = append(cl.Sharers, ServiceRef{Namespace: s.Namespace, Name: s.Name, UID: s.UID, Terms: s.Terms})
	}
	if p := ac.Spec.Pod; p != nil {
		cl.Pod = podmeta.ID{Namespace: p.Namespace, Name: p.Name, UID: p.UID, StaticUID: p.StaticUID}
	}
	if s := ac.Spec.Service; s != nil {
		cl.Service = &ServiceRef{Namespace: s.Namespace, Name: s.Name, UID: s.UID, Terms: s.Terms}
	}
	ip, err := netip.ParseAddr(ac.Spec.IP)
	if err != nil {
		cl.IP, _ = ParseClaimName(ac.Name)
		return cl, fmt.Errorf("address claim %s: spec.ip %q: %w", ac.Name, ac.Spec.IP, err)
	}
	cl.IP = ip.Unmap()
	return cl, nil
}

// maxAttempts bounds the loops that race other writers (a claim released
// and re-created between our create and get, a delete precondition that
// failed because the object changed).
const maxAttempts = 3

// sameHolder tells whether holder, an existing claim, is cl's own: for a
// pod, the same container ID on the same node (a retried ADD, or a crash
// between create and commit); for a Service, the same Service among its
// holders (see ServiceRef.Same). A pod never holds a Service's claim, nor
// the reverse.
func sameHolder(holder, cl Claim) bool {
	if cl.isService() {
		return holder.HeldBy(*cl.Service)
	}
	return !holder.isService() && holder.ContainerID == cl.ContainerID && holder.Node == cl.Node
}

// Claim claims c.IP for the pod (or, use loadBalancer, the Service: see
// ClaimService): it creates the AddressClaim, which fails if the IP is
// held. A claim that already exists for the same holder is ours (see
// sameHolder) and Claim returns nil; any other holder is a *ClaimedError.
func (c *Claims) Claim(ctx context.Context, cl Claim) error {
	cl, err := c.check(cl)
	if err != nil {
		return err
	}
	obj, err := object(cl)
	if err != nil {
		return err
	}
	name := obj.GetName()
	for range maxAttempts {
		_, err := c.res().Create(ctx, obj, metav1.CreateOptions{})
		if err == nil {
			c.log.Debug("address claimed", "ip", cl.IP, "claim", name, "holder", cl.Describe(), "pool", cl.Pool, "use", cl.Use)
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return c.readBack(ctx, cl, name, fmt.Errorf("claim %s for %s: create AddressClaim %s: %w", cl.IP, cl.who(), name, err))
		}
		u, err := c.res().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // released since our create: try again
		}
		if err != nil {
			return fmt.Errorf("claim %s for %s: AddressClaim %s exists, reading it: %w", cl.IP, cl.who(), name, err)
		}
		holder, err := ClaimOf(u)
		if err != nil {
			return fmt.Errorf("claim %s for %s: it is held by an unreadable claim: %w", cl.IP, cl.who(), err)
		}
		if cl.isService() {
			if again, err := c.joinService(ctx, u, holder, cl); !again {
				return err
			}
			continue
		}
		if sameHolder(holder, cl) {
			c.log.Debug("address already claimed by this holder", "ip", cl.IP, "claim", name, "holder", cl.Describe())
			return nil
		}
		return &ClaimedError{IP: cl.IP, Holder: holder}
	}
	return fmt.Errorf("claim %s for %s: AddressClaim %s kept changing (released, re-created or updated) while we tried (%d attempts); giving up", cl.IP, cl.who(), name, maxAttempts)
}

// readBackTimeout bounds reading a claim back after a create whose answer
// was lost (the create's own context may be what expired).
const readBackTimeout = 2 * time.Second

// ErrAmbiguous is wrapped by a Claim error when the API server may have
// created the claim after all: the caller must Release it (or let the GC).
var ErrAmbiguous = errors.New("the API server may have created the claim")

// readBack decides a create that failed without a definite answer: the
// API server may have committed it and the answer got lost (a timeout, a
// reset connection, a 5xx). A claim of the same holder (sameHolder: this
// container on this node, or this Service) is ours: the create went
// through. One that names someone else is theirs. None: the create
// failed. No answer: ErrAmbiguous.
func (c *Claims) readBack(ctx context.Context, cl Claim, name string, createErr error) error {
	if definite(createErr) {
		return createErr
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readBackTimeout)
	defer cancel()
	u, err := c.res().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return createErr
	case err != nil:
		return fmt.Errorf("%w; %w (reading it back: %v)", createErr, ErrAmbiguous, err)
	}
	holder, err := ClaimOf(u)
	if err != nil {
		return fmt.Errorf("%w; it is held by an unreadable claim: %v", createErr, err)
	}
	if sameHolder(holder, cl) {
		c.log.Info("address claim created despite the error (read back)", "ip", cl.IP, "claim", name, "holder", cl.Describe(), "err", createErr)
		return nil
	}
	return &ClaimedError{IP: cl.IP, Holder: holder}
}

// definite tells whether a create error means it was not committed: the
// API server refused the request (4xx, but a request timeout).
func definite(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	code := st.Status().Code
	return code >= 400 && code < 500 && code != 408
}

// Release deletes the claim of ip if containerID holds it. A claim that
// does not exist, or that someone else holds, is not ours to delete:
// Release returns nil. The delete carries the UID and resourceVersion it
// read as preconditions, so a claim re-created meanwhile survives.
func (c *Claims) Release(ctx context.Context, ip netip.Addr, containerID string) error {
	if containerID == "" {
		return fmt.Errorf("release address claim %s: no container ID", ip)
	}
	return c.release(ctx, ip, "container "+shortID(containerID), func(h Claim) (Claim, bool) {
		return Claim{}, !h.isService() && h.ContainerID == containerID
	})
}

// release gives up the releaser's (who, for the logs) hold on the claim
// of ip: leave says whether the claim as read is the releaser's (ours)
// and what is left of it without the releaser (rest; no Service: nobody,
// the claim is deleted, else updated to rest, as a shared address's is).
// The delete carries the UID and resourceVersion it read as
// preconditions, the update its resourceVersion: a claim changed or
// re-created meanwhile is read again.
func (c *Claims) release(ctx context.Context, ip netip.Addr, who string, leave func(holder Claim) (rest Claim, ours bool)) error {
	if !ip.IsValid() {
		return errors.New("release address claim: no IP")
	}
	name := ClaimName(ip)
	for range maxAttempts {
		u, err := c.res().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("release %s: get AddressClaim %s: %w", ip, name, err)
		}
		holder, _ := ClaimOf(u) // lenient: a broken claim is not ours
		rest, ours := leave(holder)
		if !ours {
			c.log.Debug("address claim held by someone else; not releasing", "ip", ip, "claim", name, "releaser", who, "holder", holder.Describe())
			return nil
		}
		if rest.Service == nil {
			err = c.deleteExact(ctx, u)
		} else {
			err = c.updateHolders(ctx, u, rest)
		}
		switch {
		case err == nil:
			c.log.Debug("address claim released", "ip", ip, "claim", name, "releaser", who, "holder", holder.Describe())
			return nil
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			continue // changed since our get: look again
		default:
			return fmt.Errorf("release %s for %s: AddressClaim %s: %w", ip, who, name, err)
		}
	}
	return fmt.Errorf("release %s: AddressClaim %s kept changing under us (%d attempts)", ip, name, maxAttempts)
}

// deleteExact deletes the object if it is still the version u shows.
func (c *Claims) deleteExact(ctx context.Context, u *unstructured.Unstructured) error {
	uid, rv := u.GetUID(), u.GetResourceVersion()
	pre := &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}
	return c.res().Delete(ctx, u.GetName(), metav1.DeleteOptions{Preconditions: pre})
}

// Taken returns the claim holding ip, from the informer's cache (which may
// lag the API by a watch event: Claim is the authority, Taken only keeps
// conflicts rare).
func (c *Claims) Taken(ip netip.Addr) (Claim, bool) {
	if !ip.IsValid() {
		return Claim{}, false
	}
	obj, ok, err := c.informer.GetStore().GetByKey(ClaimName(ip))
	if err != nil || !ok {
		return Claim{}, false
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return Claim{}, false
	}
	cl, _ := ClaimOf(u) // exists: taken, whatever else it says
	if !cl.IP.IsValid() {
		cl.IP = ip.Unmap().WithZone("")
	}
	return cl, true
}

// Node returns this node's claims from the cache, sorted by IP: its pods'
// claims (a Service's claim belongs to no node).
func (c *Claims) Node() []Claim { return c.indexed(nodeIndex, c.node) }

// indexed returns the cached claims whose index has value, sorted by IP.
func (c *Claims) indexed(index, value string) []Claim {
	objs, err := c.informer.GetIndexer().ByIndex(index, value)
	if err != nil {
		return nil
	}
	out := make([]Claim, 0, len(objs))
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		cl, err := ClaimOf(u)
		if err != nil {
			c.log.Warn("address claim does not convert", "claim", u.GetName(), "err", err)
			if !cl.IP.IsValid() {
				continue
			}
		}
		out = append(out, cl)
	}
	slices.SortFunc(out, func(a, b Claim) int { return a.IP.Compare(b.IP) })
	return out
}

// all returns every cached claim object.
func (c *Claims) all() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c.informer.GetStore().List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

// CountByPool counts the cached claims by spec.pool, pods' and Services'
// alike (claims without a pool are not counted).
func (c *Claims) CountByPool() map[string]int {
	out := map[string]int{}
	for _, u := range c.all() {
		if p, _, _ := unstructured.NestedString(u.Object, "spec", "pool"); p != "" {
			out[p]++
		}
	}
	return out
}
