// Package loadbalancers assigns addresses to Services of type
// LoadBalancer of flock's class: one writer at a time cluster-wide (the
// flock-policy holding the Lease, see package elect), each address
// claimed cluster-wide before it is written to the Service's status, so it
// can never be a pod's or another Service's (unless they share it by
// MetalLB's rules). The decisions are k8s/lbassign's; this package feeds
// it from the API and carries its answers out: claims, status, Events.
//
// The allocator is the leader's truth about which Service holds which
// address; the claims and the statuses follow it:
//
//   - A shared address has one claim, held by all its sharers under their
//     sharing key, each with the terms it holds it under (lbassign.Terms:
//     ports, traffic policy, selector). A Service joins it by claiming,
//     and leaving releases only its own hold: the claim goes with the
//     last holder. So every sharer holds it, and the nodes advertise it
//     for each.
//   - sync carries out what Assign gives a Service in order: claims,
//     status, then the holds it gives up; a claim or status write that
//     fails puts the Service back to what it had (rollback). An address
//     it keeps stays claimed under its former terms until the status is
//     written. So the allocator holds for a Service what its status says,
//     but for the sync under way.
//   - A new term restores each Service's status addresses under the terms
//     its claims record (granted): an edit the last leader did not carry
//     out, or refused, changes nothing, and the order in which Services
//     are restored does not decide who keeps a shared address.
//   - A Service's hold on a claim that neither the allocator (an
//     assignment in flight: Assign records it before the claim is made)
//     nor the Service's status backs is an orphan: a leader that died
//     between claim and status, a Service deleted or re-created while
//     nobody led, a sharer that moved on. Every full pass releases those
//     (collect), and a claim that refuses a Service because of one is
//     freed on the spot. A pod's claim is never touched.
//   - Only pods' claims reserve addresses, and a full pass resets the
//     reservations to exactly those: a claim that failed never keeps an
//     address from its owners, and a Service's claim never makes the
//     Services it shares with move.
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
	// Terms are what it holds a shared address under besides the key
	// (lbassign.Terms), recorded in the claim; not part of its identity.
	Terms string
}

func (r ServiceRef) String() string { return r.Namespace + "/" + r.Name }

// Claims is what the assigner needs of the cluster-wide AddressClaims.
type Claims interface {
	// Claim takes ip for the Service under its sharing key (its
	// allow-shared-ip annotation; "": not shared): nil when it already
	// holds it, or joins the Services holding it under the same
	// non-empty key. An IP someone else holds is a *HeldError.
	Claim(ctx context.Context, ip netip.Addr, pool string, svc ServiceRef, sharingKey string) error
	// Release gives up the Service's hold on ip (missing is fine): the
	// claim goes with its last holder.
	Release(ctx context.Context, ip netip.Addr, svc ServiceRef) error
	// Services are the IPs claimed by Services, with their holders (every
	// sharer of a shared one).
	Services() map[netip.Addr][]ServiceRef
	// Others are the IPs claimed by anything else (pods), with a
	// description of the holder.
	Others() map[netip.Addr]string
}

// HeldError is an IP another holder has claimed.
type HeldError struct {
	IP     netip.Addr
	Holder string
	// Services holding it, when a Service's claim refused (none: a pod's).
	Services []ServiceRef
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
	Services cache.SharedIndexInformer // every Service (the term's informer)
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
	st := a.newState()
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
		keys, all := a.take()
		st.pass(ctx, keys, all)
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

// take empties the queue: the Services marked, and whether a full pass
// was asked for.
func (a *Assigner) take() (keys []string, all bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	keys = make([]string, 0, len(a.dirty))
	for k := range a.dirty {
		keys = append(keys, k)
	}
	clear(a.dirty)
	all, a.all = a.all, false
	return keys, all
}

// newState starts a leadership term from what the Services' statuses
// say, so a new leader never moves an address in use.
func (a *Assigner) newState() *state {
	st := &state{Assigner: a, alloc: lbassign.New(a.cfg.Pools()), uids: map[string]string{}}
	st.alloc.DefaultFamily = a.cfg.DefaultFamily
	st.reserve()
	// Restore every Service before the first Assign: one handled early
	// must not take the address of one not seen yet.
	claimed := st.cfg.Claims.Services()
	for _, s := range a.services() {
		if st.ours(s) {
			st.uids[services.Key(s)] = string(s.UID)
			st.alloc.Restore(granted(st.input(s), s, claimed))
		}
	}
	return st
}

// granted is what a new term restores of s (in is its input): its status
// addresses, as they were given, whatever edit of its spec is not carried
// out yet (a bad one changes nothing, across terms too). The families
// are the addresses'; the sharing terms those its claims record (see
// lbassign.Terms), or none if they record none (it was given them
// unshared). A status address whose claim names other holders only is
// left out: a status written by someone else.
func granted(in lbassign.Service, s *corev1.Service, claimed map[netip.Addr][]ServiceRef) lbassign.Service {
	in.Current = slices.DeleteFunc(in.Current, func(ip netip.Addr) bool {
		hs, ok := claimed[ip]
		if !ok {
			return false
		}
		i := slices.IndexFunc(hs, func(h ServiceRef) bool { return names(h, s) })
		// A claim that names another namespace before s (written before
		// sharing stayed within one) is the earlier namespace's: s joined
		// it second, and whatever order the Services are restored in, s
		// is the one that gives it up.
		return i < 0 || slices.ContainsFunc(hs[:i], func(h ServiceRef) bool { return h.Namespace != s.Namespace })
	})
	in.Families, in.Requested, in.Pools = nil, nil, nil
	for _, ip := range in.Current {
		f := corev1.IPv6Protocol
		if ip.Is4() {
			f = corev1.IPv4Protocol
		}
		if !slices.Contains(in.Families, f) {
			in.Families = append(in.Families, f)
		}
	}
	in.Policy = corev1.IPFamilyPolicySingleStack
	if len(in.Families) > 1 {
		in.Policy = corev1.IPFamilyPolicyPreferDualStack
	}
	// Its claims may record two terms (a leader died after updating one
	// claim, before the status): the one that fits every other holder of
	// its addresses is what it holds them under.
	var cands []string
	for _, ip := range in.Current {
		for _, h := range claimed[ip] {
			if names(h, s) && !slices.Contains(cands, h.Terms) {
				cands = append(cands, h.Terms)
			}
		}
	}
	if len(cands) == 0 {
		return in // no claim to go by: as the spec says
	}
	parse := func(terms, namespace string) lbassign.Service {
		t, err := lbassign.ParseTerms(terms)
		if terms == "" || err != nil {
			return lbassign.Service{} // given it unshared
		}
		t.Namespace = namespace
		return t
	}
	t := parse(cands[0], s.Namespace)
	for _, c := range cands {
		ct := parse(c, s.Namespace)
		if !slices.ContainsFunc(in.Current, func(ip netip.Addr) bool {
			return slices.ContainsFunc(claimed[ip], func(h ServiceRef) bool {
				return !names(h, s) && !lbassign.MayShare(ct, parse(h.Terms, h.Namespace))
			})
		}) {
			t = ct
			break
		}
	}
	in.SharingKey, in.Ports, in.Local, in.Selector = t.SharingKey, t.Ports, t.Local, t.Selector
	return in
}

// names tells whether the claim holder h is s (an empty UID: any
// incarnation).
func names(h ServiceRef, s *corev1.Service) bool {
	return h.Namespace == s.Namespace && h.Name == s.Name && (h.UID == "" || h.UID == string(s.UID))
}

// pass syncs the Services keys names; a full one (all) first re-reads the
// pools and the pods' claims, syncs every Service (and the marked ones:
// a deleted Service is only marked) and then collects the orphan claims.
func (st *state) pass(ctx context.Context, keys []string, all bool) {
	if all {
		st.alloc.SetPools(st.cfg.Pools())
		st.reserve()
		for _, s := range st.services() {
			keys = append(keys, services.Key(s))
		}
		keys = append(keys, st.alloc.Stale()...)
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		st.sync(ctx, k)
	}
	// Once more for those their sharers' claim refused: a sharer synced
	// since may have updated the claim's key (see sync).
	again := st.refused
	st.refused = nil
	for _, k := range again {
		st.sync(ctx, k)
	}
	st.refused = nil // the next full pass tries again
	if all {
		st.collect(ctx)
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
	// uids: the incarnation of each Service this term restored or synced,
	// so that a deleted one's release names the right holder.
	uids map[string]string
	// refused: Services whose claim their sharers' refused this pass.
	refused []string
}

func (st *state) ours(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && st.cfg.Ours(s)
}

// reserve keeps the allocator off exactly the IPs pods hold: any other
// reservation (a claim that failed since the last full pass) is dropped,
// so it cannot keep an address from its owners for good.
func (st *state) reserve() {
	pods := st.cfg.Claims.Others()
	for ip := range st.alloc.Reserved() {
		if _, ok := pods[ip]; !ok {
			st.alloc.Unreserve(ip)
		}
	}
	for ip, by := range pods {
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

// sync brings one Service's assignment, claims and status in line. What
// the allocator gives it is carried out in order — claims, status, then
// the claims of what it leaves — and undone (back to what it had, see
// rollback) if a claim or the status write fails: the allocator never
// holds for a Service what its status does not say, but for the sync
// under way.
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
	if uid, ok := st.uids[key]; ok && uid != string(s.UID) {
		// Re-created under its name (both events seen as one): the
		// predecessor's addresses and claims are not this one's.
		st.release(ctx, key)
	}
	st.uids[key] = string(s.UID)
	in := st.input(s)
	before := st.alloc.Addrs(key)
	prev, had := st.alloc.Recorded(key)
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
		if !slices.Equal(before, in.Current) {
			// It keeps what it has: what of its status a new term
			// restored (not what someone else's claim holds).
			st.setIngress(ctx, s, in.Current, before)
		}
		return
	}
	// Claim first: the claim is the cluster-wide test-and-set. An address
	// a pod took meanwhile is reserved and the Service assigned again. An
	// address it keeps stays claimed under what it had (prev) until the
	// status is written: a claim records what its status holds it under.
	kept := func(ip netip.Addr) bool { return had && slices.Contains(prev.Current, ip) }
	for i, ip := range addrs {
		under := in
		if kept(ip) {
			under = prev
		}
		err := st.claim(ctx, ip, s, under)
		if err == nil {
			continue
		}
		st.cfg.Events.Event(ref(s), true, ReasonClaimFailed, err.Error())
		st.failed(ReasonClaimFailed)
		st.rollback(ctx, s, prev, in.Current, addrs[:i])
		var held *HeldError
		switch {
		case errors.As(err, &held) && len(held.Services) == 0:
			st.alloc.Reserve(ip, held.Holder) // until a full pass re-reads the pods' claims
			st.mark(key)
		case errors.As(err, &held):
			// Services this term backs hold it under a key their claim
			// has not caught up with (an older claim, or an update
			// under way): their own sync updates it; retried once this
			// pass. Reserving the address would move them.
			st.cfg.Log.Warn("LoadBalancer address claim refused by its sharers' claim", "service", key, "err", err)
			st.refused = append(st.refused, key)
		default:
			st.mark(key) // retried on the next pass
		}
		return
	}
	if !st.setIngress(ctx, s, slices.Concat(before, in.Current), addrs) {
		// Not its addresses while its status does not say so: the next
		// full pass assigns it again.
		st.rollback(ctx, s, prev, in.Current, addrs)
		return
	}
	// Its now: what it kept is held under its new key and terms.
	if had && (prev.SharingKey != in.SharingKey || lbassign.Terms(prev) != lbassign.Terms(in)) {
		for _, ip := range addrs {
			if kept(ip) {
				if err := st.claim(ctx, ip, s, in); err != nil {
					st.cfg.Log.Warn("LoadBalancer address claim not updated (the next pass tries again)", "service", key, "ip", ip, "err", err)
					st.mark(key)
				}
			}
		}
	}
}

// setIngress makes addrs s's addresses: it writes the status if it
// differs, then gives up s's hold on the others it had (its own hold
// only: a sharer keeps the claim). False: the status write failed, and
// nothing was given up.
func (st *state) setIngress(ctx context.Context, s *corev1.Service, had, addrs []netip.Addr) bool {
	current := st.input(s).Current
	if !slices.Equal(addrs, current) {
		if err := st.cfg.Status.SetIngress(ctx, ref(s), addrs); err != nil {
			st.cfg.Events.Event(ref(s), true, ReasonStatusFailed, err.Error())
			st.failed(ReasonStatusFailed)
			st.cfg.Log.Warn("LoadBalancer status not written", "service", services.Key(s), "err", err)
			return false
		}
		if len(addrs) > 0 {
			st.cfg.Events.Event(ref(s), false, ReasonAssigned, fmt.Sprintf("assigned %s", join(addrs)))
			st.cfg.Log.Info("LoadBalancer address assigned", "service", services.Key(s), "addresses", addrs)
		} else {
			st.cfg.Events.Event(ref(s), false, ReasonReleased, fmt.Sprintf("released %s", join(current)))
			st.cfg.Log.Info("LoadBalancer addresses released", "service", services.Key(s), "addresses", current)
		}
	}
	for _, ip := range had {
		if !slices.Contains(addrs, ip) {
			_ = st.releaseIP(ctx, ip, ref(s))
		}
	}
	return true
}

// rollback puts s back to what it had (prev, as Recorded before the
// Assign; none: nothing) and gives up its hold on the addresses it
// claimed that this and its status (current) leave out.
func (st *state) rollback(ctx context.Context, s *corev1.Service, prev lbassign.Service, current, claimed []netip.Addr) {
	st.alloc.Release(services.Key(s))
	if prev.Key != "" {
		st.alloc.Restore(prev)
	}
	for _, ip := range claimed {
		if !slices.Contains(prev.Current, ip) && !slices.Contains(current, ip) {
			_ = st.releaseIP(ctx, ip, ref(s))
		}
	}
}

// claim claims ip for s under its sharing key and terms (which a
// claim it already holds is updated to). A Service's hold that this term
// does not back (see holds) is an orphan, released so that it does not
// keep the address from s: otherwise a claim left by a dead leader, or by
// a Service since re-created, would refuse it for good.
func (st *state) claim(ctx context.Context, ip netip.Addr, s *corev1.Service, in lbassign.Service) error {
	pool := st.poolOf(ip, s.Namespace)
	svc := ref(s)
	svc.Terms = lbassign.Terms(in)
	err := st.cfg.Claims.Claim(ctx, ip, pool, svc, in.SharingKey)
	var held *HeldError
	if !errors.As(err, &held) || len(held.Services) == 0 {
		return err
	}
	freed := false
	for _, h := range held.Services {
		if st.holds(ip, h) {
			continue
		}
		if rerr := st.releaseIP(ctx, ip, h); rerr != nil {
			return fmt.Errorf("%w; releasing the orphan hold of Service %s: %w", err, h, rerr)
		}
		freed = true
	}
	if !freed {
		return err
	}
	return st.cfg.Claims.Claim(ctx, ip, pool, svc, in.SharingKey)
}

// holds tells whether the claim holder h is backed by this term: h is
// the incarnation of a Service still ours that has ip in its status (the
// hold goes only once the status no longer says so), or that the
// allocator lists as an owner of ip (an assignment in flight: Assign
// records it before the claim is made, and the status follows).
func (st *state) holds(ip netip.Addr, h ServiceRef) bool {
	obj, exists, _ := st.cfg.Services.GetStore().GetByKey(h.String())
	s, ok := obj.(*corev1.Service)
	if !exists || !ok || !names(h, s) || !st.ours(s) {
		return false
	}
	return slices.Contains(st.alloc.Owners(ip), h.String()) || slices.Contains(st.input(s).Current, ip)
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

// release forgets a Service that went or is no longer ours, and gives up
// its hold on its addresses (a shared one stays with its other sharers).
func (st *state) release(ctx context.Context, key string) {
	addrs := st.alloc.Addrs(key)
	if len(addrs) == 0 {
		return
	}
	st.alloc.Release(key)
	ns, name, _ := strings.Cut(key, "/")
	holder := ServiceRef{Namespace: ns, Name: name, UID: st.uids[key]}
	delete(st.uids, key)
	for _, ip := range addrs {
		_ = st.releaseIP(ctx, ip, holder)
	}
	st.cfg.Log.Info("LoadBalancer addresses released", "service", key, "addresses", addrs)
}

func (st *state) releaseIP(ctx context.Context, ip netip.Addr, holder ServiceRef) error {
	if err := st.cfg.Claims.Release(ctx, ip, holder); err != nil {
		st.cfg.Log.Warn("LoadBalancer address claim not released (the next full pass tries again)", "ip", ip, "service", holder, "err", err)
		return err
	}
	return nil
}

// collect gives up every Service's hold on a claim that this term does
// not back (see holds), whether or not the Service still exists: a
// leader that died between claim and status, a Service deleted or
// re-created while nobody led, a sharer that moved on and whose release
// failed. Only Services' claims are looked at, never a pod's.
func (st *state) collect(ctx context.Context) {
	for ip, holders := range st.cfg.Claims.Services() {
		for _, h := range holders {
			if !st.holds(ip, h) {
				_ = st.releaseIP(ctx, ip, h)
			}
		}
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
