package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/procfs"
)

// rackAnycast holds one /128 a pod (2001:db8:a:<node>::<pod>): the routes
// a rack's pods originate, beside the nodes' summaries.
const rackAnycast = "2001:db8:a::/48"

// rackTors are the ToRs a rack cold start runs against.
var rackTors = []string{"BIRD", "FRR (dynamic neighbours)"}

// rackResult is one cold start of a rack.
type rackResult struct {
	tor          string
	nodes, pods  int
	sessions     time.Duration // the ToR started → every node's summary in its FIB
	adds         time.Duration // the first ADD → the last ADD returned
	fib          time.Duration // the last ADD returned → every pod's route in the ToR's FIB
	rssMax       float64       // MB, the largest agent's, after the last route
	rssMedian    float64
	err          error
	routesInFIB  int
	routesWanted int
}

// rackNodeConfig is a rack node's NodeConfig: pods from its summaries, an
// anycast AddressPool for the pods' routes, one session to the ToR.
func rackNodeConfig(n *lab.LabNode) string {
	return fmt.Sprintf(`apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: %s
spec:
  asn: %d
  routerID: 10.255.1.%d
  pools:
  - cidr: %s
  bgp:
    peers:
    - address: %s
      asn: %d
      localAddress: %s
      timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: rack-anycast
spec:
  cidrs: [%s]
  use: [anycast]
  namespaces: [default]
`, n.Name, lab.NodeASN, n.Index, n.Summary6, n.TorV6, lab.TorASN, n.V6, rackAnycast)
}

// rackColdStart starts nodes agents peering one ToR (tor: one of
// rackTors), then ADDs pods on every node at once, each pod with an
// anycast /128, and times every route into the ToR's FIB.
func rackColdStart(ctx context.Context, o options, workDir, tor string, nodes, pods int) (r rackResult) {
	r.tor, r.nodes, r.pods, r.routesWanted = tor, nodes, pods, nodes*pods
	logf("rack: %d agents × %d pods, %s ToR", nodes, pods, tor)
	dir := filepath.Join(workDir, fmt.Sprintf("rack-%d", slices.Index(rackTors, tor)))
	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: "fk", Dir: dir, BinDir: o.binDir, Nodes: nodes,
		NodeConfig: rackNodeConfig, AgentArgs: []string{"--log-level", "info"}})
	if err != nil {
		r.err = err
		return r
	}
	defer l.Close()
	fib, err := lab.WatchFIB(l.Tor)
	if err != nil {
		r.err = err
		return r
	}
	defer fib.Close()
	t0 := time.Now()
	if tor == rackTors[0] {
		err = l.StartBird(lab.BirdOptions{})
	} else {
		err = l.StartFRRWith(lab.FRROptions{Dynamic: true})
	}
	if err != nil {
		r.err = err
		return r
	}
	at, err := fib.WaitCount(netip.MustParsePrefix("fd00:10::/32"), nodes, 2*time.Minute)
	if err != nil {
		r.err = fmt.Errorf("the nodes' summaries: %w", err)
		logf("rack: the ToR's sessions:\n%s", torSessions(l))
		return r
	}
	r.sessions = at.Sub(t0)
	logf("rack: every node's summary in the ToR's FIB %s after it started", r.sessions.Round(time.Millisecond))

	// The pods' namespaces, made before the clock starts (a runtime's
	// sandboxes are not flock's cost).
	nss := make([][]*lab.NS, nodes)
	defer func() {
		for _, row := range nss {
			for _, ns := range row {
				_ = ns.Delete()
			}
		}
	}()
	for i := range nodes {
		for k := range pods {
			ns, err := lab.NewNS(fmt.Sprintf("fk%dp%d", i+1, k))
			if err != nil {
				r.err = err
				return r
			}
			nss[i] = append(nss[i], ns)
		}
	}
	// Every node ADDs its pods at once, 4 at a time (kubelet starts a
	// node's pods in parallel).
	var last atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, nodes)
	start := time.Now()
	for i, n := range l.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work := make(chan int)
			var inner sync.WaitGroup
			var once sync.Once
			for range 4 {
				inner.Add(1)
				go func() {
					defer inner.Done()
					for k := range work {
						any := fmt.Sprintf("2001:db8:a:%x::%x", n.Index, k+1)
						p := lab.Pod{ContainerID: fmt.Sprintf("rack%03d%05d", n.Index, k), NS: nss[i][k],
							Args: lab.PodArgs("default", fmt.Sprintf("rack-%d-%d", n.Index, k), "flock.fritzlab.net/anycast", any)}
						if _, err := n.CNI.Add(ctx, p); err != nil {
							once.Do(func() { errs <- fmt.Errorf("node %d: ADD %d: %w", n.Index, k, err) })
							continue
						}
						last.Store(time.Now().UnixNano())
					}
				}()
			}
			for k := range pods {
				work <- k
			}
			close(work)
			inner.Wait()
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		r.err = errors.Join(r.err, e)
	}
	if r.err != nil {
		return r
	}
	lastAdd := time.Unix(0, last.Load())
	r.adds = lastAdd.Sub(start)
	logf("rack: %d ADDs took %s", nodes*pods, r.adds.Round(time.Millisecond))
	at, err = fib.WaitCount(netip.MustParsePrefix(rackAnycast), r.routesWanted, 5*time.Minute)
	if err != nil {
		r.err = err
		return r
	}
	// The last route may be in before the last ADD returns (the agent
	// advertises before it answers): that is no wait at all.
	r.fib = max(at.Sub(lastAdd), 0)
	r.routesInFIB = r.routesWanted
	var rss []float64
	for _, n := range l.Nodes {
		v, err := procfs.RSSMB(n.Agent.Pid())
		if err != nil {
			r.err = fmt.Errorf("RSS of node %d's agent: %w", n.Index, err)
			return r
		}
		rss = append(rss, v)
	}
	slices.Sort(rss)
	r.rssMax, r.rssMedian = rss[len(rss)-1], rss[len(rss)/2]
	logf("rack: every route in the ToR's FIB %s after the last ADD; agent RSS median %.1f MB, largest %.1f MB", r.fib.Round(time.Millisecond), r.rssMedian, r.rssMax)
	return r
}

// torSessions is the ToR's view of its sessions and its log's tail, for a
// rack that did not come up.
func torSessions(l *lab.BGPLab) string {
	var out string
	var err error
	switch {
	case l.FRR != nil:
		out, err = l.FRR.Vtysh("show bgp summary")
		for _, c := range []string{"show bgp ipv6 unicast", "show ipv6 route"} {
			o, _ := l.FRR.Vtysh(c)
			out += "\n--- " + c + " ---\n" + tail(o, 3000)
		}
		out += "\n--- bgpd.log (tail) ---\n" + tail(l.FRR.Log(), 4000)
	case l.Bird != nil:
		out, err = l.Bird.Cmd("show protocols")
	}
	if err != nil {
		out += "\n" + err.Error()
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
