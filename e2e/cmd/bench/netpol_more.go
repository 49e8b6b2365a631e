package main

// The NetworkPolicy section's figures beyond one client's TCP connects:
// many distinct sources each connecting once, DNS-like UDP (a new source
// port per request), and how soon a policy change holds for new
// connections.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

const (
	// npDistinct source addresses on the client pod's eth0, in a /112
	// that bench-000 allows by ipBlock: clients from outside the cluster.
	npDistinct = 1000
	// npChanges is how many policy changes are timed.
	npChanges = 20
)

// distinctPrefix is the /112 of the client's extra source addresses.
func (l *npLab) distinctPrefix() netip.Prefix {
	c := l.pods[podClient].ip.As16()
	c[10], c[11], c[12], c[13], c[14], c[15] = 0, 1, 0, 0, 0, 0
	return netip.PrefixFrom(netip.AddrFrom16(c), 112)
}

// distinctSources puts npDistinct addresses on the client's eth0, each
// with a permanent neighbour entry on the node's side of the link (no
// neighbour discovery in the figure, and no garbage collection: the
// node's table is bounded by gc_thresh3).
func (l *npLab) distinctSources() ([]netip.Addr, error) {
	c := l.pods[podClient]
	var mac net.HardwareAddr
	if err := c.ns.Do(func(h *netlink.Handle) error {
		link, err := h.LinkByName("eth0")
		if err == nil {
			mac = link.Attrs().HardwareAddr
		}
		return err
	}); err != nil {
		return nil, err
	}
	var out []netip.Addr
	a := l.distinctPrefix().Addr()
	for range npDistinct {
		a = a.Next()
		if err := c.ns.AddrAdd("eth0", netip.PrefixFrom(a, 128)); err != nil {
			return nil, err
		}
		ip := a
		if err := l.node.Do(func(h *netlink.Handle) error {
			link, err := h.LinkByName(c.nodeIf)
			if err != nil {
				return err
			}
			return h.NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac})
		}); err != nil {
			return nil, fmt.Errorf("neighbour %s on %s: %w", ip, c.nodeIf, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// distinctRate connects once from each source to addr, from npWorkers
// threads, and is the rate.
func distinctRate(from *lab.NS, srcs []netip.Addr, addr string) (float64, error) {
	var next atomic.Int64
	errs := make(chan error, npWorkers)
	start := time.Now()
	for range npWorkers {
		go func() {
			errs <- from.InNS(func() error {
				for {
					i := int(next.Add(1)) - 1
					if i >= len(srcs) {
						return nil
					}
					d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: srcs[i].AsSlice()}}
					c, err := d.Dial("tcp", addr)
					if err != nil {
						return fmt.Errorf("from %s: %w", srcs[i], err)
					}
					closeReset(c)
				}
			})
		}()
	}
	var err error
	for range npWorkers {
		err = errors.Join(err, <-errs)
	}
	return float64(len(srcs)) / time.Since(start).Seconds(), err
}

// distinctRates: to the selected and the unselected server, in the order
// selected, unselected, unselected, selected, every source once a run.
func (l *npLab) distinctRates(p *policyProc, srcs []netip.Addr) (sel, unsel float64, err error) {
	var s, u []float64
	for _, target := range []string{podServer, podOpen, podOpen, podServer} {
		r, err := distinctRate(l.pods[podClient].ns, srcs, l.pods[target].addr())
		if err == nil {
			err = p.exited()
		}
		if err != nil {
			return nan(), nan(), fmt.Errorf("to %s: %w", target, err)
		}
		if target == podServer {
			s = append(s, r)
		} else {
			u = append(u, r)
		}
	}
	return (s[0] + s[1]) / 2, (u[0] + u[1]) / 2, nil
}

// udpServer answers each datagram with itself.
type udpServer struct{ c net.PacketConn }

func udpServeIn(ns *lab.NS, addr string) (*udpServer, error) {
	var c net.PacketConn
	if err := ns.InNS(func() error {
		var err error
		c, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("listen on udp %s in %s: %w", addr, ns.Name, err)
	}
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteTo(buf[:n], from)
		}
	}()
	return &udpServer{c}, nil
}

func (s *udpServer) Close() { _ = s.c.Close() }

// udpRate: npWorkers clients, each request from a new socket (a new
// source port: a new flow, as a DNS resolver's queries are), for d.
func udpRate(from *lab.NS, addr string, d time.Duration) (float64, error) {
	var done atomic.Int64
	errs := make(chan error, npWorkers)
	deadline := time.Now().Add(d)
	start := time.Now()
	for range npWorkers {
		go func() {
			errs <- from.InNS(func() error {
				buf := make([]byte, 64)
				for time.Now().Before(deadline) {
					c, err := net.Dial("udp", addr)
					if err != nil {
						return err
					}
					_ = c.SetDeadline(time.Now().Add(time.Second))
					if _, err := c.Write([]byte("q")); err != nil {
						c.Close()
						return err
					}
					if _, err := c.Read(buf); err != nil {
						c.Close()
						return fmt.Errorf("no answer from %s: %w", addr, err)
					}
					c.Close()
					done.Add(1)
				}
				return nil
			})
		}()
	}
	var err error
	for range npWorkers {
		err = errors.Join(err, <-errs)
	}
	return float64(done.Load()) / time.Since(start).Seconds(), err
}

func (l *npLab) udpRates(p *policyProc, d time.Duration) (sel, unsel float64, err error) {
	var s, u float64
	for _, target := range []string{podServer, podOpen, podOpen, podServer} {
		r, err := udpRate(l.pods[podClient].ns, l.pods[target].addr(), d/2)
		if err == nil {
			err = p.exited()
		}
		if err != nil {
			return nan(), nan(), fmt.Errorf("to %s: %w", target, err)
		}
		if target == podServer {
			s += r / 2
		} else {
			u += r / 2
		}
	}
	return s, u, nil
}

// changePolicy lets the intruder reach the server (allow true) or takes
// that back.
func changePolicy(ctx context.Context, cs kubernetes.Interface, allow bool) error {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bench-change", Namespace: npNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "intruder"}}}}}},
		}}
	if allow {
		_, err := cs.NetworkingV1().NetworkPolicies(npNamespace).Create(ctx, np, metav1.CreateOptions{})
		return err
	}
	return cs.NetworkingV1().NetworkPolicies(npNamespace).Delete(ctx, np.Name, metav1.DeleteOptions{})
}

// changeLatency times npChanges policy changes each way: from the API's
// answer to the first new connection of the intruder that the change
// decides (connected once allowed, dropped once taken back), trying a
// connection with a 10 ms timeout after another.
func (l *npLab) changeLatency(ctx context.Context, cs kubernetes.Interface, p *policyProc) (allow, deny []time.Duration, err error) {
	intruder, addr := l.pods[podIntruder].ns, l.pods[podServer].addr()
	try := func() (bool, error) {
		var ok bool
		err := intruder.InNS(func() error {
			c, err := net.DialTimeout("tcp", addr, 10*time.Millisecond)
			var ne net.Error
			switch {
			case err == nil:
				closeReset(c)
				ok = true
				return nil
			case errors.As(err, &ne) && ne.Timeout():
				return nil
			}
			return err
		})
		return ok, err
	}
	for range npChanges {
		for _, want := range []bool{true, false} {
			if err := changePolicy(ctx, cs, want); err != nil {
				return nil, nil, err
			}
			start := time.Now()
			for {
				ok, err := try()
				if err != nil {
					return nil, nil, err
				}
				if ok == want {
					break
				}
				if time.Since(start) > 10*time.Second {
					return nil, nil, fmt.Errorf("a policy change (allow %v) not in effect after 10 s\n--- flock-policy log (tail) ---\n%s", want, p.logTail())
				}
			}
			if want {
				allow = append(allow, time.Since(start))
			} else {
				deny = append(deny, time.Since(start))
			}
		}
	}
	return allow, deny, p.exited()
}
