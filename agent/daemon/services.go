package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/dataplane/kubeproxy"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// serviceOptions are the Services controller's options from the running
// config and the current AddressPools.
func (d *daemon) serviceOptions() services.Options {
	d.mu.Lock()
	sv := d.spec.Services
	d.mu.Unlock()
	o := services.Options{
		Node:         d.nodeName,
		DefaultClass: sv.DefaultLoadBalancerClass,
		Weights:      sv.LinkBandwidth,
		Authorize: func(use string, ip netip.Addr, namespace string) error {
			_, err := d.Authorize(use, netip.PrefixFrom(ip, ip.BitLen()), namespace)
			return err
		},
		Aggregate: d.serviceAggregate,
		ReadProxy: d.readKubeProxy,
	}
	if d.kube != nil {
		o.Holder = func(ip netip.Addr, namespace, name, uid string) (bool, string) {
			cl, ok := d.kube.claims.Taken(ip)
			if !ok {
				return false, ""
			}
			return serviceHolds(cl, claims.ServiceRef{Namespace: namespace, Name: name, UID: uid})
		}
	}
	return o
}

// serviceHolds is services.Options.Holder's answer from ip's claim: held
// when svc is among its holders (every sharer of a shared address holds
// it), else who does ("" for a claim no Service holds: a pod's).
func serviceHolds(cl claims.Claim, svc claims.ServiceRef) (bool, string) {
	hs := cl.Holders()
	if len(hs) == 0 {
		return false, ""
	}
	if cl.HeldBy(svc) {
		return true, ""
	}
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = h.String()
	}
	if len(names) == 1 {
		return false, "Service " + names[0]
	}
	return false, "Services " + strings.Join(names, ", ")
}

// serviceAggregate is the CIDR of the aggregating AddressPool of use that
// holds ip (invalid: none aggregates it).
func (d *daemon) serviceAggregate(use string, ip netip.Addr) netip.Prefix {
	v := d.authority.Load()
	if v == nil {
		return netip.Prefix{}
	}
	for _, p := range v.set.Pools() {
		if p.Aggregate && p.Uses(use) {
			if c := p.CIDROf(ip); c.IsValid() {
				return c
			}
		}
	}
	return netip.Prefix{}
}

// applyServiceRoutes hands the controller's routes to the node state,
// whose one desired set the BGP reconciler follows (not once a planned
// stop drains them), and returns the state's generation (0: not handed).
func (d *daemon) applyServiceRoutes() uint64 {
	d.svcMu.Lock()
	defer d.svcMu.Unlock()
	if d.draining.Load() {
		return 0
	}
	routes := d.kube.services.Routes()
	out := make(map[netip.Prefix]nodestate.ServiceRoute, len(routes))
	for p, r := range routes {
		out[p] = nodestate.ServiceRoute{Path: r.Path, Owners: r.Owners}
	}
	return d.state.SetServiceRoutes(out)
}

// serviceRoutesWait bounds how long the peers wait for the Service
// routes at start (the Services not listable: RBAC, an API server that
// does not answer): meanwhile a graceful-restart peer keeps the agent
// before's routes (120 s by default), but a new pod's route waits too.
var serviceRoutesWait = 30 * time.Second

// waitServiceRoutes returns once the Services controller decided every
// Service from its first lists and the speaker holds the answer, or
// after serviceRoutesWait (a warning: the peers come up without the
// Service routes, which follow once listed). Only the Service routes
// wait for the Services' lists, never CNI.
func (d *daemon) waitServiceRoutes(ctx context.Context) {
	if d.kube == nil || d.kube.services == nil {
		return
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, serviceRoutesWait)
	defer cancel()
	select {
	case <-d.kube.services.Synced():
	case <-wctx.Done():
		if ctx.Err() == nil {
			d.log.Warn("services: Services and EndpointSlices not listed yet; adding the BGP peers without the Service routes (they follow once listed)", "waited", serviceRoutesWait)
		}
		return
	}
	gen := d.applyServiceRoutes()
	if err := d.bgpLoop.Wait(wctx, gen); err != nil {
		if ctx.Err() == nil {
			d.log.Warn("services: the Service routes did not reach the speaker in time; adding the BGP peers anyway", "err", err)
		}
		return
	}
	d.log.Info("services: Service routes decided; adding the BGP peers", "routes", len(d.state.ServiceRoutes()), "after", time.Since(start).Round(time.Millisecond))
}

// Services is what `flockctl services` shows: every Service address and
// what this node does with it (none in standalone mode).
func (d *daemon) Services() []services.Address {
	if d.kube == nil || d.kube.services == nil {
		return []services.Address{}
	}
	out := d.kube.services.Addresses()
	if out == nil {
		out = []services.Address{}
	}
	return out
}

// drainServices is a planned stop's first step when the config asks for
// it (spec.services.drainOnStopSeconds): every Service route goes out
// again with GRACEFUL_SHUTDOWN, and the stop waits that long, so the
// fabric moves new flows to other nodes before this one stops. wait is
// time.Sleep but for tests.
func (d *daemon) drainServices(wait func(time.Duration)) {
	d.mu.Lock()
	secs := d.spec.Services.DrainOnStopSeconds
	d.mu.Unlock()
	if secs <= 0 {
		return
	}
	d.svcMu.Lock()
	d.draining.Store(true)
	routes := d.state.ServiceRoutes()
	for p, r := range routes {
		r.Path.Drain = true
		routes[p] = r
	}
	gen := d.state.SetServiceRoutes(routes)
	d.svcMu.Unlock()
	if len(routes) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := d.bgpLoop.Wait(ctx, gen)
	cancel()
	d.log.Info("planned stop: Service routes draining (GRACEFUL_SHUTDOWN)", "routes", len(routes), "wait", time.Duration(secs)*time.Second, "sent", err == nil)
	wait(time.Duration(secs) * time.Second)
}

// readKubeProxy answers from kube-proxy's rules in this network
// namespace, asked for each address port when it is.
func (d *daemon) readKubeProxy() (services.Proxy, error) {
	return kubeProxy{&d.kubeProxy, d.log}, nil
}

// kubeProxy answers services.Proxy from kube-proxy's rules.
type kubeProxy struct {
	r   *kubeproxy.Reader
	log *slog.Logger
}

// Delivers: unknown when the rules could not be read (the address goes
// out as decided, as where there is no kube-proxy to wait for).
func (p kubeProxy) Delivers(ip netip.Addr, proto corev1.Protocol, port int32) (bool, bool) {
	n, ok := map[corev1.Protocol]uint8{corev1.ProtocolTCP: unix.IPPROTO_TCP, corev1.ProtocolUDP: unix.IPPROTO_UDP, corev1.ProtocolSCTP: unix.IPPROTO_SCTP}[proto]
	if !ok || port < 1 || port > 65535 {
		return false, false
	}
	d, known, err := p.r.Delivers(kubeproxy.Key{Addr: ip, Proto: n, Port: uint16(port)})
	if err != nil {
		p.log.Warn("services: kube-proxy's rules not read; the address goes out as decided, without waiting for them", "ip", ip, "port", port, "err", err)
		return false, false
	}
	return d, known
}
