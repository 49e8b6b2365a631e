// Package lbcontroller runs flock's LoadBalancer address assigner
// (k8s/loadbalancers) against the API server: the caches it decides from
// (Services, AddressClaims, AddressPools with the namespaces' labels, this
// node's NodeConfig), what it writes through (claims, Service status,
// Events) and the Lease that makes one candidate at a time the writer.
//
// It runs in flock-policy's process, a candidate on every node: that
// process already links client-go's typed clientset (kube-network-policies
// needs it), which leader election needs too and the agent does without
// (it would cost the agent +17 MB of binary and +10 MB of RSS). Only the
// Lease's holder has the caches: each term builds them afresh and drops
// them when it ends, so the other candidates watch nothing but the Lease
// (in a large cluster, every Service write would otherwise reach every
// node).
package lbcontroller

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/addresspools"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/lbassign"
	"code.fritzlab.net/fritzlab/flock/k8s/loadbalancers"
	"code.fritzlab.net/fritzlab/flock/k8s/loadbalancers/elect"
	"code.fritzlab.net/fritzlab/flock/k8s/nodeconfigs"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// Config is where the controller runs.
type Config struct {
	// Node is this node's name: the candidate's identity on the Lease,
	// and whose NodeConfig says whether unclassed LoadBalancer Services
	// are flock's (spec.services.defaultLoadBalancerClass; set it alike
	// on every node, as a NodeConfigTemplate does).
	Node string
	// Namespace holds the Lease (flock's namespace).
	Namespace string
	Log       *slog.Logger
	// Lease timings; zero: client-go's defaults for core components.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Resync is the assigner's full-pass period; zero: its default.
	Resync time.Duration
}

// clients are the API the controller reads and writes through.
type clients struct {
	services   kubeclient.ListerWatcher[*corev1.ServiceList] // every namespace's
	namespaces addresspools.Namespaces
	dyn        dynamic.Interface
	leases     coordinationv1.LeasesGetter
}

// Controller is the Lease's candidate; while it holds the Lease, a term
// (the assigner with its caches) runs.
type Controller struct {
	cfg    Config
	api    clients
	events *apiEvents // across terms: a new term does not repeat an Event
	elect  *elect.Elect

	mu       sync.Mutex
	current  *term             // while leading
	failures map[string]uint64 // the ended terms' assigners', by reason
}

// term is one leadership term: its informers (a factory of its own: an
// informer cannot be started again) and the assigner deciding from them.
type term struct {
	log      *slog.Logger
	factory  *kubeclient.Factory
	pools    *addresspools.Watcher
	nc       *nodeconfigs.Watcher
	claims   *claims.Claims
	assigner *loadbalancers.Assigner

	authority    atomic.Pointer[authority]
	defaultClass atomic.Bool
}

// authority is one compilation of the AddressPools.
type authority struct {
	set    *authz.Set
	labels func(ns string) labels.Set
}

// New builds the clients (nothing is listed or watched before Run).
func New(rc *rest.Config, cfg Config) (*Controller, error) {
	if cfg.Node == "" {
		return nil, fmt.Errorf("loadbalancers: the node's name is empty (set --node-name or NODE_NAME)")
	}
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("loadbalancers: the Lease's namespace is empty")
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "flock-loadbalancers/" + cfg.Node
	core, err := kubeclient.New(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	leases, err := coordinationv1.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("leases client: %w", err)
	}
	return newController(clients{services: core.Services(""), namespaces: core.Namespaces(), dyn: dyn, leases: leases}, cfg), nil
}

func newController(api clients, cfg Config) *Controller {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	c := &Controller{cfg: cfg, api: api, failures: map[string]uint64{},
		events: &apiEvents{dyn: api.dyn, node: cfg.Node, log: cfg.Log.Debug}}
	c.elect = &elect.Elect{
		Leases: api.leases, Namespace: cfg.Namespace, Identity: cfg.Node, Term: c.lead, Log: cfg.Log,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
	}
	return c
}

// Leading tells whether this process assigns the addresses now.
func (c *Controller) Leading() bool { return c.elect.Leading() }

// Run competes for the Lease until ctx ends, and assigns while it holds
// it.
func (c *Controller) Run(ctx context.Context) error { return c.elect.Run(ctx) }

// newTerm builds a term's informers and assigner (nothing runs yet).
func (c *Controller) newTerm() *term {
	f := kubeclient.NewFactory()
	t := &term{
		log: c.cfg.Log, factory: f,
		pools: addresspools.New(f, c.api.dyn, c.api.namespaces, c.cfg.Log),
		// This node's only: readClass reads nothing else.
		nc:     nodeconfigs.NewNamed(f, c.api.dyn, c.cfg.Node),
		claims: claims.New(f, c.api.dyn, c.cfg.Node, c.cfg.Log),
	}
	svcs := f.Informer("services", func() cache.SharedIndexInformer {
		return kubeclient.NewInformer(c.api.services, &corev1.Service{}, nil)
	})
	t.assigner = loadbalancers.New(loadbalancers.Config{
		Services:            svcs,
		Claims:              apiClaims{t.claims},
		Status:              apiStatus{c.api.dyn},
		Events:              c.events,
		Pools:               t.lbPools,
		Ours:                t.ours,
		AuthorizeExternalIP: t.authorizeExternalIP,
		Resync:              c.cfg.Resync,
		Log:                 c.cfg.Log,
	})
	return t
}

// lead is one term (elect's Term): it fills the term's caches, then
// assigns until ctx ends. It returns once all of the term has stopped,
// and the term is dropped: the next one lists everything again.
func (c *Controller) lead(ctx context.Context) error {
	t := c.newTerm()
	c.mu.Lock()
	c.current = t
	c.mu.Unlock()
	defer func() {
		// The failures counter goes on across terms.
		c.mu.Lock()
		for reason, n := range t.assigner.Failures() {
			c.failures[reason] += n
		}
		c.current = nil
		c.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return t.factory.Run(ctx) })
	g.Go(func() error {
		defer cancel() // the assigner stopped: so does the term
		if err := t.factory.WaitForSync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("loadbalancers: %w", err)
		}
		t.readPools()
		t.readClass()
		g.Go(func() error { return t.follow(ctx) })
		return t.assigner.Run(ctx)
	})
	return g.Wait()
}

// stats are the current term's pool usage and every term's failures.
func (c *Controller) stats() ([]loadbalancers.PoolUsage, map[string]uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	failures := make(map[string]uint64, len(c.failures))
	for reason, n := range c.failures {
		failures[reason] = n
	}
	if c.current == nil {
		return nil, failures
	}
	for reason, n := range c.current.assigner.Failures() {
		failures[reason] += n
	}
	return c.current.assigner.Usage(), failures
}

// follow re-reads what changed and asks the assigner for a full pass: new
// pools, the class default, or a Service's claim that came or went (one
// deleted by hand is claimed again at once, not at the next resync).
func (t *term) follow(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.pools.Changed():
			t.readPools()
		case <-t.nc.Changed():
			t.readClass()
		case <-t.claims.ServicesChanged():
		}
		t.assigner.Refresh()
	}
}

func (t *term) readPools() {
	set, err := authz.Compile(t.pools.Pools())
	if err != nil {
		t.log.Warn("AddressPools ignored", "err", err)
	}
	t.authority.Store(&authority{set: set, labels: t.pools.NamespaceLabels})
}

func (t *term) readClass() {
	spec, _, err := t.nc.Current()
	if err != nil {
		// No NodeConfig (yet): only Services of flock's class are ours.
		t.defaultClass.Store(false)
		return
	}
	t.defaultClass.Store(spec.Services.DefaultLoadBalancerClass)
}

// lbPools are the AddressPools of use loadBalancer, for the allocator.
func (t *term) lbPools() []lbassign.Pool {
	a := t.authority.Load()
	if a == nil || a.set == nil {
		return nil
	}
	var out []lbassign.Pool
	for _, p := range a.set.Pools() {
		if !p.Uses(v1alpha1.UseLoadBalancer) {
			continue
		}
		out = append(out, lbassign.Pool{Name: p.Name, Prefixes: p.CIDRs, Allows: func(ns string) bool {
			return p.Allows(ns, a.labels(ns))
		}})
	}
	return out
}

// ours tells whether flock serves a LoadBalancer Service's class.
func (t *term) ours(s *corev1.Service) bool {
	return services.Options{DefaultClass: t.defaultClass.Load()}.Ours(s)
}

// authorizeExternalIP is the nodes' rule (an AddressPool of use
// externalIP allows ip to the namespace), for the Warning Event.
func (t *term) authorizeExternalIP(ip netip.Addr, ns string) error {
	a := t.authority.Load()
	if a == nil || a.set == nil {
		return fmt.Errorf("no AddressPools loaded yet")
	}
	_, err := a.set.Authorize(v1alpha1.UseExternalIP, netip.PrefixFrom(ip, ip.BitLen()), ns, a.labels(ns))
	return err
}
