// Package loadbalancers assigns addresses to Services of type
// LoadBalancer of flock's class: one writer at a time cluster-wide (the
// agent holding the Lease, see Elect), each address claimed cluster-wide
// before it is written to the Service's status, so it can never be a pod's
// or another Service's (unless they share it by MetalLB's rules). The
// decisions are k8s/lbassign's; this package feeds it from the API and
// carries its answers out: claims, status, Events.
package loadbalancers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/lbassign"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// ServiceRef names a Service (and its incarnation).
type ServiceRef struct {
	Namespace, Name, UID string
}

func (r ServiceRef) String() string { return r.Namespace + "/" + r.Name }

// Claims is what the assigner needs of the cluster-wide AddressClaims.
type Claims interface {
	// Claim takes ip for the Service; nil when it already holds it. An
	// IP someone else holds is a *HeldError.
	Claim(ctx context.Context, ip netip.Addr, pool string, svc ServiceRef) error
	// Release gives ip back if the Service holds it (missing is fine).
	Release(ctx context.Context, ip netip.Addr, svc ServiceRef) error
	// Services are the IPs claimed by Services, with their holder.
	Services() map[netip.Addr]ServiceRef
	// Others are the IPs claimed by anything else (pods), with a
	// description of the holder.
	Others() map[netip.Addr]string
}

// HeldError is an IP another holder has claimed.
type HeldError struct {
	IP     netip.Addr
	Holder string
}

func (e *HeldError) Error() string { return fmt.Sprintf("%s is claimed by %s", e.IP, e.Holder) }

// Status writes a Service's status.loadBalancer.ingress.
type Status interface {
	SetIngress(ctx context.Context, svc ServiceRef, ips []netip.Addr) error
}

// Recorder records an Event on a Service.
type Recorder interface {
	Event(svc ServiceRef, warning bool, reason, message string)
}

// Event reasons.
const (
	ReasonAssigned = "AddressAssigned"
	ReasonReleased = "AddressReleased"
	// A bad request is reported with the allocator's code (lbassign.Code).
	ReasonClaimFailed  = "AddressClaimFailed"
	ReasonStatusFailed = "StatusUpdateFailed"
	// ReasonExternalIPNotAllowed: an external IP no AddressPool allows.
	ReasonExternalIPNotAllowed = "ExternalIPNotAllowed"
)

// Config is the assigner's wiring.
type Config struct {
	Services cache.SharedIndexInformer // every Service (the agent's informer)
	Claims   Claims
	Status   Status
	Events   Recorder
	// Pools returns the AddressPools of use loadBalancer, ready for the
	// allocator (nil Allows: nobody may use the pool).
	Pools func() []lbassign.Pool
	// Ours tells whether flock serves a LoadBalancer Service (its class).
	Ours func(*corev1.Service) bool
	// DefaultFamily is the cluster's primary family (Services without
	// spec.ipFamilies); empty: IPv6.
	DefaultFamily corev1.IPFamily
	// AuthorizeExternalIP answers whether the namespace may have ip
	// advertised as an external IP; a refused one gets a Warning Event
	// (the nodes do not advertise it either). Nil: not checked.
	AuthorizeExternalIP func(ip netip.Addr, namespace string) error
	// Resync is the period of a full pass (pools and claims changes are
	// also picked up then); 0: 30 s.
	Resync time.Duration
	Log    *slog.Logger
}

// Assigner is the leader's loop. Mark and Refresh may be called at any
// time (informer handlers); Run only while leading.
type Assigner struct {
	cfg   Config
	mu    sync.Mutex
	dirty map[string]struct{}
	all   bool
	wake  chan struct{}

	statsMu  sync.Mutex
	usage    []PoolUsage       // the last pass's, while leading
	failures map[string]uint64 // by Event reason
}

// PoolUsage is one loadBalancer pool's addresses used and in all.
type PoolUsage struct {
	Name       string
	Used, Size uint64
}

// Usage is each pool's use as of the last pass (none unless leading).
func (a *Assigner) Usage() []PoolUsage {
	a.statsMu.Lock()
	defer a.statsMu.Unlock()
	return slices.Clone(a.usage)
}

// Failures counts refused or failed assignments, by reason.
func (a *Assigner) Failures() map[string]uint64 {
	a.statsMu.Lock()
	defer a.statsMu.Unlock()
	out := make(map[string]uint64, len(a.failures))
	for k, v := range a.failures {
		out[k] = v
	}
	return out
}

func (a *Assigner) failed(reason string) {
	a.statsMu.Lock()
	if a.failures == nil {
		a.failures = map[string]uint64{}
	}
	a.failures[reason]++
	a.statsMu.Unlock()
}

// New builds the assigner and registers its handler on the Services
// informer (before the informer runs: the handler only marks).
func New(cfg Config) *Assigner {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Resync == 0 {
		cfg.Resync = 30 * time.Second
	}
	a := &Assigner{cfg: cfg, dirty: map[string]struct{}{}, wake: make(chan struct{}, 1)}
	mark := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if s, ok := obj.(*corev1.Service); ok {
			a.mark(services.Key(s))
		}
	}
	_, _ = cfg.Services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: mark, UpdateFunc: func(_, n any) { mark(n) }, DeleteFunc: mark,
	})
	return a
}

func (a *Assigner) mark(key string) {
	a.mu.Lock()
	a.dirty[key] = struct{}{}
	a.mu.Unlock()
	a.poke()
}

func (a *Assigner) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Refresh asks for a full pass (the pools or the claims changed).
func (a *Assigner) Refresh() {
	a.mu.Lock()
	a.all = true
	a.mu.Unlock()
	a.poke()
}

// Run assigns until ctx ends (leadership lost). It starts from what the
// Services' statuses say, so a new leader never moves an address in use.
func (a *Assigner) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), a.cfg.Services.HasSynced) {
		return nil
	}
	st := &state{Assigner: a, alloc: lbassign.New(a.cfg.Pools()), owned: map[netip.Addr]ServiceRef{}}
	st.alloc.DefaultFamily = a.cfg.DefaultFamily
	st.reserve()
	// Restore every Service before the first Assign: one handled early
	// must not take the address of one not seen yet.
	for _, s := range a.services() {
		if st.ours(s) {
			st.alloc.Restore(st.input(s))
		}
	}
	a.Refresh()
	t := time.NewTicker(a.cfg.Resync)
	defer t.Stop()
	defer func() {
		a.statsMu.Lock()
		a.usage = nil // another agent counts now
		a.statsMu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.wake:
		case <-t.C:
			a.Refresh()
			continue
		}
		a.mu.Lock()
		keys, all := make([]string, 0, len(a.dirty)), a.all
		for k := range a.dirty {
			keys = append(keys, k)
		}
		clear(a.dirty)
		a.all = false
		a.mu.Unlock()
		if all {
			st.alloc.SetPools(a.cfg.Pools())
			st.reserve()
			keys = keys[:0]
			for _, s := range a.services() {
				keys = append(keys, services.Key(s))
			}
			keys = append(keys, st.alloc.Stale()...)
		}
		slices.Sort(keys)
		for _, k := range slices.Compact(keys) {
			st.sync(ctx, k)
		}
		if all {
			st.collect(ctx)
		}
		var usage []PoolUsage
		for _, p := range a.cfg.Pools() {
			used, size := st.alloc.InUse(p.Name)
			usage = append(usage, PoolUsage{Name: p.Name, Used: used, Size: size})
		}
		a.statsMu.Lock()
		a.usage = usage
		a.statsMu.Unlock()
	}
}

func (a *Assigner) services() []*corev1.Service {
	var out []*corev1.Service
	for _, o := range a.cfg.Services.GetStore().List() {
		if s, ok := o.(*corev1.Service); ok {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(x, y *corev1.Service) int { return strings.Compare(services.Key(x), services.Key(y)) })
	return out
}

// state is one leadership term's view.
type state struct {
	*Assigner
	alloc *lbassign.Allocator
	// owned: the Service each address was claimed for this term (so a
	// release names the right holder).
	owned map[netip.Addr]ServiceRef
}

func (st *state) ours(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && st.cfg.Ours(s)
}

// reserve keeps the allocator off every IP a pod holds.
func (st *state) reserve() {
	for ip, by := range st.cfg.Claims.Others() {
		st.alloc.Reserve(ip, by)
	}
}

func ref(s *corev1.Service) ServiceRef {
	return ServiceRef{Namespace: s.Namespace, Name: s.Name, UID: string(s.UID)}
}

// input is what the allocator needs of s.
func (st *state) input(s *corev1.Service) lbassign.Service {
	in := lbassign.Service{
		Key: services.Key(s), Namespace: s.Namespace,
		Families: s.Spec.IPFamilies, Selector: s.Spec.Selector,
		Local:      s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal,
		SharingKey: s.Annotations[lbassign.AnnotationAllowSharedIP],
	}
	if s.Spec.IPFamilyPolicy != nil {
		in.Policy = *s.Spec.IPFamilyPolicy
	}
	if v, ok := s.Annotations[lbassign.AnnotationLoadBalancerIPs]; ok {
		in.Requested, in.RequestedField = splitList(v), lbassign.FieldLoadBalancerIPs
	} else if s.Spec.LoadBalancerIP != "" {
		in.Requested, in.RequestedField = []string{s.Spec.LoadBalancerIP}, lbassign.FieldLoadBalancerIP
	}
	if v, ok := s.Annotations[lbassign.AnnotationAddressPool]; ok {
		in.Pools = splitList(v)
	}
	for _, p := range s.Spec.Ports {
		in.Ports = append(in.Ports, lbassign.Port{Port: p.Port, Protocol: p.Protocol})
	}
	for _, i := range s.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(i.IP); err == nil {
			in.Current = append(in.Current, ip.Unmap())
		}
	}
	return in
}

func splitList(v string) []string {
	var out []string
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// sync brings one Service's assignment, claims and status in line.
func (st *state) sync(ctx context.Context, key string) {
	obj, exists, _ := st.cfg.Services.GetStore().GetByKey(key)
	s, _ := obj.(*corev1.Service)
	if exists && s != nil {
		st.checkExternalIPs(s)
	}
	if !exists || s == nil || !st.ours(s) {
		st.release(ctx, key)
		return
	}
	in := st.input(s)
	before := st.alloc.Addrs(key)
	addrs, err := st.alloc.Assign(in)
	if err != nil {
		var le *lbassign.Error
		reason := "AddressAssignmentFailed"
		if errors.As(err, &le) {
			reason = string(le.Code)
		}
		st.cfg.Events.Event(ref(s), true, reason, err.Error())
		st.cfg.Log.Warn("LoadBalancer address not assigned", "service", key, "err", err)
		st.failed(reason)
		return
	}
	// Claim first: the claim is the cluster-wide test-and-set. An address
	// a pod took meanwhile is reserved and the Service assigned again.
	for _, ip := range addrs {
		err := st.cfg.Claims.Claim(ctx, ip, st.poolOf(ip, s.Namespace), ref(s))
		var held *HeldError
		if errors.As(err, &held) {
			st.alloc.Reserve(ip, held.Holder)
			st.cfg.Events.Event(ref(s), true, ReasonClaimFailed, err.Error())
			st.failed(ReasonClaimFailed)
			st.mark(key)
			return
		}
		if err != nil {
			st.cfg.Events.Event(ref(s), true, ReasonClaimFailed, err.Error())
			st.failed(ReasonClaimFailed)
			st.mark(key) // retried on the next pass
			return
		}
		st.owned[ip] = ref(s)
	}
	if !slices.Equal(addrs, in.Current) {
		if err := st.cfg.Status.SetIngress(ctx, ref(s), addrs); err != nil {
			st.cfg.Events.Event(ref(s), true, ReasonStatusFailed, err.Error())
			st.failed(ReasonStatusFailed)
			st.cfg.Log.Warn("LoadBalancer status not written", "service", key, "err", err)
			return
		}
		st.cfg.Events.Event(ref(s), false, ReasonAssigned, fmt.Sprintf("assigned %s", join(addrs)))
		st.cfg.Log.Info("LoadBalancer address assigned", "service", key, "addresses", addrs)
	}
	// Addresses the Service no longer has, unless another holds them.
	for _, ip := range before {
		if !slices.Contains(addrs, ip) && len(st.alloc.Owners(ip)) == 0 {
			st.releaseIP(ctx, ip, ref(s))
		}
	}
}

// checkExternalIPs warns, on the Service, of every external IP no
// AddressPool allows to its namespace (CVE-2020-8554: no node advertises
// it).
func (st *state) checkExternalIPs(s *corev1.Service) {
	if st.cfg.AuthorizeExternalIP == nil {
		return
	}
	for _, raw := range s.Spec.ExternalIPs {
		ip, err := netip.ParseAddr(raw)
		if err == nil {
			err = st.cfg.AuthorizeExternalIP(ip.Unmap(), s.Namespace)
		}
		if err != nil {
			st.cfg.Events.Event(ref(s), true, ReasonExternalIPNotAllowed, fmt.Sprintf("spec.externalIPs %q is not advertised: %v", raw, err))
		}
	}
}

// release forgets a Service that went or is no longer ours, and gives
// back the addresses nobody else shares.
func (st *state) release(ctx context.Context, key string) {
	addrs := st.alloc.Addrs(key)
	if len(addrs) == 0 {
		return
	}
	st.alloc.Release(key)
	for _, ip := range addrs {
		if len(st.alloc.Owners(ip)) > 0 {
			continue
		}
		holder, ok := st.owned[ip]
		if !ok {
			holder = st.cfg.Claims.Services()[ip]
		}
		st.releaseIP(ctx, ip, holder)
	}
	st.cfg.Log.Info("LoadBalancer addresses released", "service", key, "addresses", addrs)
}

func (st *state) releaseIP(ctx context.Context, ip netip.Addr, holder ServiceRef) {
	if err := st.cfg.Claims.Release(ctx, ip, holder); err != nil {
		st.cfg.Log.Warn("LoadBalancer address claim not released (the next pass tries again)", "ip", ip, "service", holder, "err", err)
		return
	}
	delete(st.owned, ip)
}

// collect gives back claims no Service of this term holds (a leader
// that crashed between claim and status, a Service deleted while nobody
// led), and reserves what pods hold.
func (st *state) collect(ctx context.Context) {
	for ip, holder := range st.cfg.Claims.Services() {
		key := holder.String()
		if slices.Contains(st.alloc.Owners(ip), key) {
			continue
		}
		obj, exists, _ := st.cfg.Services.GetStore().GetByKey(key)
		if s, ok := obj.(*corev1.Service); exists && ok && string(s.UID) == holder.UID && st.ours(s) {
			continue // its sync claims or releases it
		}
		st.releaseIP(ctx, ip, holder)
	}
}

// poolOf names the pool ip came from (for the claim's label and the
// pool's count).
func (st *state) poolOf(ip netip.Addr, ns string) string {
	for _, p := range st.cfg.Pools() {
		if p.Allows == nil || !p.Allows(ns) {
			continue
		}
		for _, pfx := range p.Prefixes {
			if pfx.Contains(ip) {
				return p.Name
			}
		}
	}
	return ""
}

func join(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}
