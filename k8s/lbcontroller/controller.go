// Package lbcontroller runs flock's LoadBalancer address assigner
// (k8s/loadbalancers) against the API server: the caches it decides from
// (Services, AddressClaims, AddressPools with the namespaces' labels, this
// node's NodeConfig), what it writes through (claims, Service status,
// Events) and the Lease that makes one candidate at a time the writer.
//
// It runs in flock-policy's process, on every node: that process already
// links client-go's typed clientset (kube-network-policies needs it), which
// leader election needs too and the agent does without (it would cost the
// agent +17 MB of binary and +10 MB of RSS).
package lbcontroller

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
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

// Controller is the assigner with its caches and Lease.
type Controller struct {
	cfg      Config
	factory  *kubeclient.Factory
	pools    *addresspools.Watcher
	nc       *nodeconfigs.Watcher
	claims   *claims.Claims
	assigner *loadbalancers.Assigner
	elect    *elect.Elect

	authority    atomic.Pointer[authority]
	defaultClass atomic.Bool
}

// authority is one compilation of the AddressPools.
type authority struct {
	set    *authz.Set
	labels func(ns string) labels.Set
}

// New builds the clients and caches (nothing runs before Run).
func New(rc *rest.Config, cfg Config) (*Controller, error) {
	if cfg.Node == "" {
		return nil, fmt.Errorf("loadbalancers: the node's name is empty (set --node-name or NODE_NAME)")
	}
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("loadbalancers: the Lease's namespace is empty")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
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
	f := kubeclient.NewFactory()
	c := &Controller{
		cfg: cfg, factory: f,
		pools:  addresspools.New(f, dyn, core.Namespaces(), cfg.Log),
		nc:     nodeconfigs.New(f, dyn, cfg.Node),
		claims: claims.New(f, dyn, cfg.Node, cfg.Log),
	}
	svcs := f.Informer("services", func() cache.SharedIndexInformer {
		return kubeclient.NewInformer(core.Services(""), &corev1.Service{}, nil)
	})
	c.assigner = loadbalancers.New(loadbalancers.Config{
		Services:            svcs,
		Claims:              apiClaims{c.claims},
		Status:              apiStatus{dyn},
		Events:              &apiEvents{dyn: dyn, node: cfg.Node, log: cfg.Log.Debug},
		Pools:               c.lbPools,
		Ours:                c.ours,
		AuthorizeExternalIP: c.authorizeExternalIP,
		Resync:              cfg.Resync,
		Log:                 cfg.Log,
	})
	c.elect = &elect.Elect{
		Leases: leases, Namespace: cfg.Namespace, Identity: cfg.Node, Assigner: c.assigner, Log: cfg.Log,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
	}
	return c, nil
}

// Leading tells whether this process assigns the addresses now.
func (c *Controller) Leading() bool { return c.elect.Leading() }

// Run fills the caches, then competes for the Lease and assigns while it
// holds it, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.factory.Run(ctx) })
	g.Go(func() error {
		if err := c.factory.WaitForSync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("loadbalancers: %w", err)
		}
		c.readPools()
		c.readClass()
		g.Go(func() error { return c.follow(ctx) })
		return c.elect.Run(ctx)
	})
	return g.Wait()
}

// follow re-reads what changed and asks the assigner for a full pass: new
// pools, the class default, or a Service's claim that came or went (one
// deleted by hand is claimed again at once, not at the next resync).
func (c *Controller) follow(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.pools.Changed():
			c.readPools()
		case <-c.nc.Changed():
			c.readClass()
		case <-c.claims.ServicesChanged():
		}
		c.assigner.Refresh()
	}
}

func (c *Controller) readPools() {
	set, err := authz.Compile(c.pools.Pools())
	if err != nil {
		c.cfg.Log.Warn("AddressPools ignored", "err", err)
	}
	c.authority.Store(&authority{set: set, labels: c.pools.NamespaceLabels})
}

func (c *Controller) readClass() {
	spec, _, err := c.nc.Current()
	if err != nil {
		// No NodeConfig (yet): only Services of flock's class are ours.
		c.defaultClass.Store(false)
		return
	}
	c.defaultClass.Store(spec.Services.DefaultLoadBalancerClass)
}

// lbPools are the AddressPools of use loadBalancer, for the allocator.
func (c *Controller) lbPools() []lbassign.Pool {
	a := c.authority.Load()
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
func (c *Controller) ours(s *corev1.Service) bool {
	return services.Options{DefaultClass: c.defaultClass.Load()}.Ours(s)
}

// authorizeExternalIP is the nodes' rule (an AddressPool of use
// externalIP allows ip to the namespace), for the Warning Event.
func (c *Controller) authorizeExternalIP(ip netip.Addr, ns string) error {
	a := c.authority.Load()
	if a == nil || a.set == nil {
		return fmt.Errorf("no AddressPools loaded yet")
	}
	_, err := a.set.Authorize(v1alpha1.UseExternalIP, netip.PrefixFrom(ip, ip.BitLen()), ns, a.labels(ns))
	return err
}
