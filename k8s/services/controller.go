package services

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// Clients are the typed clients the informers list and watch with (all
// namespaces).
type Clients struct {
	Services       kubeclient.ListerWatcher[*corev1.ServiceList]
	EndpointSlices kubeclient.ListerWatcher[*discoveryv1.EndpointSliceList]
}

// byService indexes EndpointSlices by the Service they belong to.
const byService = "service"

// Controller follows Services and EndpointSlices and keeps this node's
// Service routes: an event marks its Service, and Run recomputes only the
// marked ones (a flip of one EndpointSlice costs one Service's decision,
// however many Services there are). Use: New, run the factory, go Run,
// then Routes/Addresses after each Changed.
type Controller struct {
	svcs cache.SharedIndexInformer
	// svcsSynced: the Services' handler has been told of the first list.
	svcsSynced cache.InformerSynced
	eps        *sliceSource
	log        *slog.Logger

	mu      sync.Mutex
	opts    Options
	dirty   map[string]struct{} // Service keys to recompute
	all     bool                // recompute every Service (options changed)
	rows    map[string][]Address
	routes  map[netip.Prefix]Route
	wake    chan struct{}
	changed chan struct{}
	changes uint64 // route set changes published
	// held are the Services with an address kept back for kube-proxy;
	// retrying says a retry of them is scheduled.
	held     map[string]bool
	retrying bool
	// heldSince is when each held address (by Service) began to wait;
	// only Run's goroutine touches it.
	heldSince map[string]map[netip.Addr]time.Time
	synced    chan struct{} // see Synced
}

// proxyRetry is how soon a Service whose address waits for kube-proxy is
// decided again.
const proxyRetry = 100 * time.Millisecond

// proxyHoldMax bounds the wait for kube-proxy: an address it has not
// taken by then goes out as decided (a table left by a kube-proxy that
// is gone would otherwise hold every new address). A variable for tests.
var proxyHoldMax = 30 * time.Second

// New takes the informers from f and registers the handlers (before f
// runs).
func New(f *kubeclient.Factory, c Clients, o Options, log *slog.Logger) *Controller {
	if log == nil {
		log = slog.Default()
	}
	k := &Controller{
		log: log, opts: o, dirty: map[string]struct{}{}, rows: map[string][]Address{}, routes: map[netip.Prefix]Route{},
		wake: make(chan struct{}, 1), changed: make(chan struct{}, 1), heldSince: map[string]map[netip.Addr]time.Time{},
		synced: make(chan struct{}),
	}
	k.svcs = f.Informer("services", func() cache.SharedIndexInformer {
		inf := kubeclient.NewInformer(c.Services, &corev1.Service{}, func(o *metav1.ListOptions) {
			o.LabelSelector, o.FieldSelector = serviceLabels, serviceFields
		})
		_ = inf.SetTransform(trimService)
		return inf
	})
	k.eps = newSliceSource(c.EndpointSlices, log, k.handler(sliceService), func() {
		k.mu.Lock()
		k.all = true
		k.mu.Unlock()
		k.poke()
	})
	// One handler follows which Services want slices, then marks them:
	// a pass woken by the mark sees the wanted set that goes with it.
	mark := k.handler(func(obj any) string {
		if s, ok := obj.(*corev1.Service); ok {
			return Key(s)
		}
		return ""
	})
	follow := func(obj any, gone bool) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if s, ok := obj.(*corev1.Service); ok {
			cur := s
			if gone {
				cur = nil
			}
			k.eps.service(Key(s), cur)
		}
	}
	reg, _ := k.svcs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { follow(obj, false); mark.OnAdd(obj, false) },
		UpdateFunc: func(o, n any) { follow(n, false); mark.OnUpdate(o, n) },
		DeleteFunc: func(obj any) { follow(obj, true); mark.OnDelete(obj) },
	})
	k.svcsSynced = reg.HasSynced
	return k
}

// sliceService is the key of the Service an EndpointSlice belongs to (""
// none).
func sliceService(obj any) string {
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelServiceName] != "" {
		return s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
	}
	return ""
}

func (k *Controller) handler(key func(any) string) cache.ResourceEventHandlerFuncs {
	mark := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if s := key(obj); s != "" {
			k.mark(s)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(o, n any) { mark(o); mark(n) }, // a slice may change Service
		DeleteFunc: mark,
	}
}

func (k *Controller) mark(key string) {
	k.mu.Lock()
	k.dirty[key] = struct{}{}
	k.mu.Unlock()
	k.poke()
}

func (k *Controller) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// SetOptions replaces the options (the AddressPools changed, so Authorize
// answers differently; the node's config changed) and recomputes every
// Service.
func (k *Controller) SetOptions(o Options) {
	k.mu.Lock()
	k.opts, k.all = o, true
	k.mu.Unlock()
	k.poke()
}

// Refresh recomputes every Service with the same options (Authorize's
// answers changed behind it).
func (k *Controller) Refresh() {
	k.mu.Lock()
	k.all = true
	k.mu.Unlock()
	k.poke()
}

// Synced is closed once both informers have listed and every Service
// was decided from their caches: Routes is the node's answer from then
// on (before, it is empty because nothing is known, not because nothing
// is delivered).
func (k *Controller) Synced() <-chan struct{} { return k.synced }

// Changed is the coalesced signal that Routes or Addresses changed.
func (k *Controller) Changed() <-chan struct{} { return k.changed }

// Routes returns the node's Service routes (a copy).
func (k *Controller) Routes() map[netip.Prefix]Route {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[netip.Prefix]Route, len(k.routes))
	for p, r := range k.routes {
		r.Owners = slices.Clone(r.Owners)
		out[p] = r
	}
	return out
}

// Addresses returns every Service address and what this node does with
// it, sorted by Service and IP.
func (k *Controller) Addresses() []Address {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []Address
	for _, rows := range k.rows {
		out = append(out, rows...)
	}
	SortAddresses(out)
	return out
}

// Changes counts the route set changes published since start.
func (k *Controller) Changes() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.changes
}

// Run recomputes what events marked until ctx ends.
func (k *Controller) Run(ctx context.Context) error {
	// The watch of the slices of the Services that want them (a
	// LoadBalancer's, external IPs), for as long as Run.
	var wg sync.WaitGroup
	wg.Go(func() { _ = k.eps.Run(ctx, k.svcsSynced) })
	defer wg.Wait()
	k.poke() // the first pass, even with nothing to list
	first := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-k.wake:
		}
		if !k.svcsSynced() {
			// Nothing is decided from a half-listed cache (it would
			// withdraw what the rest of the list still holds).
			if !cache.WaitForCacheSync(ctx.Done(), k.svcsSynced) {
				return nil
			}
		}
		if first && !k.eps.synced() {
			// The slices of every Service that wants them, first: the
			// watch that lists them pokes when it takes over.
			continue
		}
		if first {
			// Every Service, from the synced store: the handlers may
			// not have marked all of the first list yet (they are
			// called after the store has it).
			k.mu.Lock()
			k.all = true
			k.mu.Unlock()
		}
		k.recompute()
		if first {
			first = false
			close(k.synced)
		}
	}
}

// recompute decides the marked Services again and publishes the routes
// when they changed.
func (k *Controller) recompute() {
	var held map[string]bool
	k.mu.Lock()
	o, all := k.opts, k.all
	keys := slices.Collect(maps.Keys(k.dirty))
	clear(k.dirty)
	k.all = false
	k.mu.Unlock()
	if all {
		keys = keys[:0]
		for _, obj := range k.svcs.GetStore().List() {
			if s, ok := obj.(*corev1.Service); ok {
				keys = append(keys, Key(s))
			}
		}
	}
	o.hold, held = k.holder(o)
	rows := make(map[string][]Address, len(keys))
	for _, key := range keys {
		obj, ok, err := k.svcs.GetStore().GetByKey(key)
		if err != nil || !ok {
			rows[key] = nil // gone
			continue
		}
		s := obj.(*corev1.Service)
		rows[key] = ForService(o, s, k.slices(key))
	}
	k.mu.Lock()
	if all {
		clear(k.rows)
	}
	for key, r := range rows {
		if len(r) == 0 {
			delete(k.rows, key)
		} else {
			k.rows[key] = r
		}
	}
	// A Service decided again forgets the waits of addresses no longer
	// held (they start over if they wait again), and one gone forgets
	// them all (a full recompute has no row for a deleted Service).
	if all {
		for key := range k.heldSince {
			if _, ok := rows[key]; !ok {
				delete(k.heldSince, key)
			}
		}
	}
	for key := range rows {
		for ip := range k.heldSince[key] {
			still := false
			for _, a := range rows[key] {
				still = still || a.IP == ip && strings.HasPrefix(a.Reason, ReasonProxyPending)
			}
			if !still {
				k.unhold(key, ip)
			}
		}
	}
	var flat []Address
	for _, r := range k.rows {
		flat = append(flat, r...)
	}
	routes := Routes(k.opts, flat)
	same := maps.EqualFunc(routes, k.routes, func(a, b Route) bool { return a.Path == b.Path && slices.Equal(a.Owners, b.Owners) })
	k.routes = routes
	if !same {
		k.changes++
	}
	if len(held) > 0 {
		if k.held == nil {
			k.held = map[string]bool{}
		}
		maps.Copy(k.held, held)
		if !k.retrying {
			k.retrying = true
			time.AfterFunc(proxyRetry, k.retryHeld)
		}
	}
	k.mu.Unlock()
	k.log.Debug("services: recomputed", "services", len(keys), "all", all, "routes", len(routes))
	if !same {
		k.log.Info("services: routes changed", "routes", len(routes))
		select {
		case k.changed <- struct{}{}:
		default:
		}
	}
}

// holder is the hold of one recompute: it reads the proxy once, on the
// first address that starts being advertised, and records the Services
// whose addresses it keeps back. An address goes out once the proxy
// delivers one of the Service's ports (delivery.Decide advertises on
// one, and kube-proxy writes a Service's ports in one transaction; a
// port without endpoints it never programs), or once it has waited
// proxyHoldMax (a table kube-proxy left behind, or rules this reading
// does not know).
func (k *Controller) holder(o Options) (func(Address, *corev1.Service) string, map[string]bool) {
	if o.ReadProxy == nil {
		return nil, nil
	}
	held := map[string]bool{}
	var (
		read bool
		p    Proxy
	)
	now := time.Now()
	return func(a Address, s *corev1.Service) string {
		key := Key(s)
		// Advertised already: the proxy delivered it. (A draining row
		// went out without asking it.)
		for _, r := range k.rows[key] {
			if r.IP == a.IP && r.State == StateAdvertised {
				return ""
			}
		}
		if !read {
			read = true
			var err error
			if p, err = o.ReadProxy(); err != nil {
				k.log.Warn("services: kube-proxy's rules not read; addresses go out as decided, without waiting for them", "err", err)
				p = nil
			}
		}
		if p == nil {
			return ""
		}
		var waiting []string
		for _, sp := range s.Spec.Ports {
			proto := sp.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			d, known := p.Delivers(a.IP, proto, sp.Port)
			if !known || d {
				k.unhold(key, a.IP)
				return ""
			}
			waiting = append(waiting, fmt.Sprintf("%d/%s", sp.Port, proto))
		}
		if len(waiting) == 0 {
			return "" // no port: nothing for kube-proxy to program
		}
		since, ok := k.heldSince[key][a.IP]
		if !ok {
			if k.heldSince[key] == nil {
				k.heldSince[key] = map[netip.Addr]time.Time{}
			}
			k.heldSince[key][a.IP], since = now, now
		}
		if waited := now.Sub(since); waited >= proxyHoldMax {
			k.log.Warn("services: kube-proxy's rules still do not deliver the address; advertising it as decided", "service", key, "ip", a.IP, "waited", waited.Round(time.Second))
			return ""
		}
		held[key] = true
		return fmt.Sprintf("%s (port %s)", ReasonProxyPending, strings.Join(waiting, ", "))
	}, held
}

// unhold forgets that key's ip waited.
func (k *Controller) unhold(key string, ip netip.Addr) {
	if m := k.heldSince[key]; m != nil {
		delete(m, ip)
		if len(m) == 0 {
			delete(k.heldSince, key)
		}
	}
}

// retryHeld decides the held Services again.
func (k *Controller) retryHeld() {
	k.mu.Lock()
	for key := range k.held {
		k.dirty[key] = struct{}{}
	}
	clear(k.held)
	k.retrying = false
	k.mu.Unlock()
	k.poke()
}

func (k *Controller) slices(key string) []*discoveryv1.EndpointSlice { return k.eps.slices(key) }
