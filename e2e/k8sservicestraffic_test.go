package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
)

// Issue 21, with traffic: a cluster with the Service plumbing of a real
// one (kube-proxy in nftables mode, CoreDNS; k8slab Services), flock as
// its CNI peering with a BIRD ToR. Requests come from the ToR's own
// namespace, as a client beyond the fabric's edge would send them: to a
// LoadBalancer Service's IPv6 and IPv4 addresses that flock assigned and
// the node advertises, through kube-proxy to the pods.

// The first node's addresses, on the lab's link (k8slab Services).
var (
	trafficNodeV6 = netip.MustParseAddr("fd00:0:5::2")
	trafficNodeV4 = netip.MustParseAddr("198.19.0.2")
)

const trafficPools = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: traffic-loadbalancers}
spec:
  cidrs: [2001:db8:1b::/120, 203.0.113.128/28]
  use: [loadBalancer]
  namespaces: [default]
`

// trafficWorkload answers GET /cgi-bin/ip with the client's address as
// the pod saw it and the pod's name (busybox httpd with a CGI script). A
// pod deleted keeps serving for 5 s (preStop), as a rolling update's old
// pods do, before httpd gets SIGTERM.
const trafficWorkload = `apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  strategy: {rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 30
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm: {labelSelector: {matchLabels: {app: echo}}, topologyKey: kubernetes.io/hostname}
      containers:
      - name: httpd
        image: docker.io/local/busybox:1.35
        imagePullPolicy: Never
        command:
        - sh
        - -c
        - |
          mkdir -p /www/cgi-bin
          printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho "$REMOTE_ADDR $HOSTNAME"\n' > /www/cgi-bin/ip
          chmod +x /www/cgi-bin/ip
          exec httpd -f -p 8080 -h /www
        ports: [{containerPort: 8080, name: http}]
        readinessProbe:
          tcpSocket: {port: 8080}
          periodSeconds: 1
        lifecycle:
          preStop: {exec: {command: ["sleep", "5"]}}
---
apiVersion: v1
kind: Service
metadata: {name: echo-local, namespace: default}
spec:
  type: LoadBalancer
  loadBalancerClass: flock.fritzlab.net/bgp
  externalTrafficPolicy: Local
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: echo-cluster, namespace: default}
spec:
  type: LoadBalancer
  loadBalancerClass: flock.fritzlab.net/bgp
  externalTrafficPolicy: Cluster
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: http}]
`

// echoGet sends one request from ns to addr on a new connection and
// returns the client address and the pod the answer names.
func echoGet(ns *lab.NS, addr netip.Addr, timeout time.Duration) (client netip.Addr, pod string, err error) {
	return echoGetPort(ns, netip.AddrPortFrom(addr, 80), timeout)
}

// echoGetPort is echoGet to a port of the caller's choosing (a pod's own).
func echoGetPort(ns *lab.NS, to netip.AddrPort, timeout time.Duration) (client netip.Addr, pod string, err error) {
	err = ns.InNS(func() error {
		// Dialled on this goroutine: the socket is made in ns.
		c, err := (&net.Dialer{Timeout: timeout}).Dial("tcp", to.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := io.WriteString(c, "GET /cgi-bin/ip HTTP/1.0\r\nHost: echo\r\n\r\n"); err != nil {
			return err
		}
		b, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		// busybox httpd ends its own header lines with CRLF, the CGI
		// script's with LF.
		resp := strings.ReplaceAll(string(b), "\r\n", "\n")
		status, _, _ := strings.Cut(resp, "\n")
		if !strings.Contains(status, " 200 ") {
			return fmt.Errorf("answer %q", status)
		}
		_, body, ok := strings.Cut(resp, "\n\n")
		f := strings.Fields(body)
		if !ok || len(f) != 2 {
			return fmt.Errorf("answer %q", resp)
		}
		a, err := netip.ParseAddr(strings.Trim(f[0], "[]")) // httpd brackets IPv6
		if err != nil {
			return fmt.Errorf("client address %q: %w", f[0], err)
		}
		client, pod = a.Unmap(), f[1]
		return nil
	})
	return client, pod, err
}

// load sends requests from the ToR to each address in turn, each on a new
// connection (every one a new flow through kube-proxy), until stop.
type load struct {
	mu       sync.Mutex
	sent     int
	failures []failure
	stop     chan struct{}
	done     chan struct{}
}

// failure is one request that failed, and when it was in flight.
type failure struct {
	addr       netip.Addr
	start, end time.Time
	err        error
}

func (f failure) String() string {
	return fmt.Sprintf("%s–%s %s: %v", f.start.Format("15:04:05.000"), f.end.Format("15:04:05.000"), f.addr, f.err)
}

func startLoad(ns *lab.NS, addrs ...netip.Addr) *load {
	l := &load{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			a := addrs[i%len(addrs)]
			start := time.Now()
			_, _, err := echoGet(ns, a, 2*time.Second)
			l.mu.Lock()
			l.sent++
			if err != nil {
				l.failures = append(l.failures, failure{a, start, time.Now(), err})
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// end stops the load and returns what it counted.
func (l *load) end() (sent int, failures []failure) {
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent, l.failures
}

// routeChanges records when the ToR's kernel changed its route to each of
// the prefixes (BIRD moving the next hops), from the ToR's own netlink.
type routeChanges struct {
	mu      sync.Mutex
	at      map[netip.Prefix][]time.Time
	deleted map[netip.Prefix][]time.Time // of those, the deletions
	stop    chan struct{}
}

func watchRoutes(t *testing.T, ns *lab.NS, prefixes []netip.Prefix) *routeChanges {
	t.Helper()
	h, err := netns.GetFromPath(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rc := &routeChanges{at: map[netip.Prefix][]time.Time{}, deleted: map[netip.Prefix][]time.Time{}, stop: make(chan struct{})}
	ch := make(chan netlink.RouteUpdate, 256)
	if err := netlink.RouteSubscribeWithOptions(ch, rc.stop, netlink.RouteSubscribeOptions{Namespace: &h}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for u := range ch {
			if u.Dst == nil {
				continue
			}
			p, ok := netip.AddrFromSlice(u.Dst.IP)
			if !ok {
				continue
			}
			bits, _ := u.Dst.Mask.Size()
			dst := netip.PrefixFrom(p.Unmap(), bits)
			if slices.Contains(prefixes, dst) {
				now := time.Now()
				rc.mu.Lock()
				rc.at[dst] = append(rc.at[dst], now)
				if u.Type == unix.RTM_DELROUTE {
					rc.deleted[dst] = append(rc.deleted[dst], now)
				}
				rc.mu.Unlock()
			}
		}
	}()
	return rc
}

// routeWatchLag bounds how late the watch stamps a route change: the
// stamp is taken when the netlink message is read, after the kernel made
// the change, and on a loaded machine the reader runs late. A flow the
// move reset fails after the kernel moved the route but may fail before
// the watch has read it (CI saw a reset end at 42.456 with no stamp
// before it, the drained node's graceful-shutdown update at 42.448).
const routeWatchLag = 250 * time.Millisecond

// during tells whether the route to p changed while f was in flight.
func (rc *routeChanges) during(f failure) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, at := range rc.at[netip.PrefixFrom(f.addr, f.addr.BitLen())] {
		if !at.Before(f.start) && !at.After(f.end.Add(routeWatchLag)) {
			return true
		}
	}
	return false
}

func (rc *routeChanges) end() { close(rc.stop) }

// String lists the stamps, for the log.
func (rc *routeChanges) String() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for p, at := range rc.at {
		for _, a := range at {
			out = append(out, p.String()+"@"+a.Format("15:04:05.000"))
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// deletions lists the deletions seen, for the log: none means the ToR's
// kernel never lost a route to any of the prefixes.
func (rc *routeChanges) deletions() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for p, at := range rc.deleted {
		for _, a := range at {
			out = append(out, p.String()+"@"+a.Format("15:04:05.000"))
		}
	}
	slices.Sort(out)
	return out
}

// count is the number of changes seen, all prefixes.
func (rc *routeChanges) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, at := range rc.at {
		n += len(at)
	}
	return n
}

// servicesLab is a cluster with the Service plumbing of a real one
// (kube-proxy in nftables mode, CoreDNS; k8slab Services) on two nodes
// behind a BIRD ToR whose ECMP hashes ports too, flock's image (and
// images) imported on both, nothing of flock's applied yet. Its cleanup
// deletes the workloads (their DELs must reach a running agent), then
// flock, then the nodes.
type servicesLab struct {
	e        *k8sEnv
	c        *k8slab.Cluster
	n2       *k8slab.Node
	tor, vm2 *lab.NS
	root     string
	dir      string
}

func upServicesLab(t *testing.T, images func(root, dir string) []string, extra ...route) *servicesLab {
	t.Helper()
	ctx := context.Background()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prepareK8sHost(t)
	tars := append([]string{buildFlockImage(t, root, dir)}, images(root, dir)...)
	tor := newNS(t, "k8stor-")
	vm2 := newNS(t, "k8svm2-")
	// kube-proxy's --cluster-cidr (one range per family) covers both
	// nodes' pools.
	c, err := k8slab.Up(ctx, k8slab.Options{Dir: filepath.Join(dir, "k8s"), NodeName: k8sNode, NodeIP: trafficNodeV6.String() + "," + trafficNodeV4.String(),
		CNIBinDir: cniBinDir, CNIConfDir: cniConfDir, Services: true, PodCIDRs: []string{"fd00:10::/32", "198.51.100.0/24"}, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	l := &servicesLab{e: &k8sEnv{t: t, c: c}, c: c, tor: tor, vm2: vm2, root: root, dir: dir}
	e := l.e
	t.Cleanup(func() {
		if t.Failed() {
			// Every flock pod, terminating ones too, and the kubelets.
			out, _ := c.Kubectl(context.Background(), "-n", "flock-system", "get", "pods", "-o", "wide")
			t.Logf("flock pods:\n%s", out)
			names, _ := c.Kubectl(context.Background(), "-n", "flock-system", "get", "pods", "-o", "jsonpath={.items[*].metadata.name}")
			for _, pod := range strings.Fields(names) {
				// install-cni too: a crash-looping init container says why
				// only there (--previous: the attempt that failed).
				for _, ctr := range []string{"install-cni", "agent", "policy"} {
					out, _ := c.Kubectl(context.Background(), "-n", "flock-system", "logs", pod, "-c", ctr, "--timestamps", "--tail=40")
					t.Logf("%s %s log:\n%s", pod, ctr, out)
					if prev, err := c.Kubectl(context.Background(), "-n", "flock-system", "logs", pod, "-c", ctr, "--timestamps", "--tail=40", "--previous"); err == nil {
						t.Logf("%s %s log, the attempt before:\n%s", pod, ctr, prev)
					}
				}
			}
			if l.n2 != nil {
				t.Logf("vm2 kubelet:\n%s", l.n2.LogTail(k8slab.Kubelet, 40))
			}
			t.Logf("vm kubelet:\n%s", c.LogTail(k8slab.Kubelet, 40))
		}
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Pods too: their DELs must reach a running agent before flock goes.
		_, _ = c.Kubectl(dctx, "delete", "deployment,pod,service,networkpolicy", "--all", "-n", "default", "--wait=true", "--timeout=90s")
		_, _ = c.Kubectl(dctx, "delete", "-k", filepath.Join(root, "deploy"), "--wait=true", "--timeout=60s")
		if l.n2 != nil {
			if err := l.n2.Down(); err != nil {
				t.Errorf("node vm2 teardown: %v", err)
			}
		}
		if err := c.Down(); err != nil {
			t.Errorf("cluster teardown: %v", err)
		}
	})
	for _, tar := range tars {
		if err := c.ImportImage(ctx, tar); err != nil {
			t.Fatal(err)
		}
	}
	// The fabric; the ToR also reaches the first node's addresses (the
	// apiserver's, CoreDNS's) through the host.
	wireTwoNodes(t, e, tor, vm2, append([]route{{tor, netip.PrefixFrom(trafficNodeV6, 128), hostV6}, {tor, netip.PrefixFrom(trafficNodeV4, 32), hostV4}}, extra...)...)
	// The ToR spreads flows over its equal paths by port too (as a
	// fabric does), so both nodes get requests.
	for _, k := range []string{"net.ipv6.fib_multipath_hash_policy", "net.ipv4.fib_multipath_hash_policy"} {
		if err := tor.Sysctl(k, "1"); err != nil {
			t.Fatal(err)
		}
	}
	e.startBird(dir, k8sBirdTwo)
	t.Log("adding node vm2 (its own netns, mounts, containerd, kubelet, kube-proxy)")
	l.n2, err = c.AddNode(ctx, k8slab.NodeOptions{Name: node2, Netns: vm2.Path, NodeIP: node2V6.String() + "," + node2V4.String()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tar := range tars {
		if err := l.n2.ImportImage(ctx, tar); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// install applies deploy (a deploy/ directory), the two NodeConfigs and
// more objects, and waits for flock on both nodes and both nodes Ready.
func (l *servicesLab) install(deploy string, objects ...string) {
	e := l.e
	e.t.Helper()
	e.kubectl("apply", "-k", deploy)
	e.apply(k8sNodeConfig)
	e.apply(node2Config)
	for _, o := range objects {
		e.apply(o)
	}
	e.waitPods("flock on both nodes", "-n", "flock-system", "-l", agentSelector)
	if err := l.c.WaitNodeReady(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	if err := l.n2.WaitReady(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.waitBird(k8sSummary6, 1)
	e.waitBird(node2Summary6, 1)
}

func TestServicesTraffic(t *testing.T) {
	ctx := context.Background()
	l := upServicesLab(t, func(string, string) []string { return nil })
	e, c, tor := l.e, l.c, l.tor
	l.install(filepath.Join(l.root, "deploy"), trafficPools)
	e.apply(trafficWorkload)
	e.waitPods("echo", "-l", "app=echo")

	addrs := map[string][]netip.Addr{}
	for _, svc := range []string{"echo-local", "echo-cluster"} {
		testutil.EventuallyWithin(t, 60*time.Second, svc+"'s IPv6 and IPv4 addresses assigned", func() (bool, string) {
			out, _ := c.Kubectl(ctx, "get", "service", svc, "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}")
			addrs[svc] = nil
			for _, f := range strings.Fields(out) {
				if a, err := netip.ParseAddr(f); err == nil {
					addrs[svc] = append(addrs[svc], a)
				}
			}
			return len(addrs[svc]) == 2 && addrs[svc][0].Is6() && addrs[svc][1].Is4(), out
		})
	}
	local, cluster := addrs["echo-local"], addrs["echo-cluster"]
	nodes := [2]string{k8sNode, node2}
	hopsAre := func(t *testing.T, what string, addrs []netip.Addr, want ...string) {
		t.Helper()
		for _, a := range addrs {
			p := netip.PrefixFrom(a, a.BitLen())
			testutil.EventuallyWithin(t, 60*time.Second, fmt.Sprintf("%s: %s through %v", what, p, want), func() (bool, string) {
				h, err := torHops(e, p)
				if err != nil {
					return false, err.Error()
				}
				ok := len(h) == len(want)
				for _, w := range want {
					_, in := h[w]
					ok = ok && in
				}
				return ok, fmt.Sprint(h)
			})
		}
	}
	t.Run("next hops at the ToR: Local the nodes with a ready endpoint, Cluster every node", func(t *testing.T) {
		e.t = t
		// One pod on each node (the scheduler spreads them).
		out := e.kubectl("get", "pods", "-l", "app=echo", "-o", "jsonpath={.items[*].spec.nodeName}")
		if f := strings.Fields(out); len(f) != 2 || f[0] == f[1] {
			t.Fatalf("echo pods on nodes %q, want one on each", out)
		}
		hopsAre(t, "Local", local, nodes[0], nodes[1])
		hopsAre(t, "Cluster", cluster, nodes[0], nodes[1])
	})

	t.Run("curl from the ToR, both families, Local keeps the client address", func(t *testing.T) {
		e.t = t
		// The ToR's source is its address on the link the flow leaves by.
		tors := map[bool][]netip.Addr{true: {torV6, torNode2V6}, false: {torV4, torNode2V4}}
		for _, tc := range []struct {
			addr       netip.Addr
			preserving bool
		}{{local[0], true}, {local[1], true}, {cluster[0], false}, {cluster[1], false}} {
			testutil.EventuallyWithin(t, 30*time.Second, "an answer from "+tc.addr.String(), func() (bool, string) {
				_, _, err := echoGet(tor, tc.addr, 3*time.Second)
				return err == nil, fmt.Sprint(err)
			})
			// At least 20 flows, spread over both nodes by the ToR, until
			// both pods have answered (30 s at most): a readiness probe
			// missed on a loaded machine takes a pod out of kube-proxy's
			// choice for a moment, and a Cluster flow then goes to the
			// other one, as it should.
			pods := map[string]bool{}
			for n, end := 0, time.Now().Add(30*time.Second); n < 20 || (len(pods) < 2 && time.Now().Before(end)); n++ {
				got, pod, err := echoGet(tor, tc.addr, 3*time.Second)
				if err != nil {
					t.Errorf("%s: %v", tc.addr, err)
					continue
				}
				pods[pod] = true
				fromToR := slices.Contains(tors[tc.addr.Is6()], got)
				// Local: kube-proxy delivers without SNAT, the pod sees the
				// ToR. Cluster: kube-proxy masquerades external traffic.
				if tc.preserving && !fromToR {
					t.Errorf("%s (externalTrafficPolicy Local): the pod saw %s, want one of the ToR's %v", tc.addr, got, tors[tc.addr.Is6()])
				}
				if !tc.preserving && fromToR {
					t.Errorf("%s (externalTrafficPolicy Cluster): the pod saw the client %s unmasqueraded", tc.addr, got)
				}
			}
			if len(pods) != 2 {
				t.Errorf("%s: flows for 30 s reached pods %v, want both (one on each node)", tc.addr, pods)
			}
		}
	})

	// What an operator sees (README's worked example).
	if out, err := c.Kubectl(ctx, "-n", "flock-system", "exec", "ds/flock", "-c", "agent", "--", "flockctl", "services"); err == nil {
		t.Logf("flockctl services:\n%s", out)
	}
	for _, a := range append(append([]netip.Addr{}, local...), cluster...) {
		out, _ := e.bird.Cmd("show route " + netip.PrefixFrom(a, a.BitLen()).String() + " all")
		t.Logf("birdc show route %s all:\n%s", a, out)
	}

	// Each disruption under a request loop from the ToR (both families of
	// the Local Service, a new connection every 20 ms): no request fails,
	// the ToR never loses the path, no address changes.
	// A request in flight at the instant the ToR moves its route (the
	// drained node leaves its ECMP set) goes on to the other node, which
	// has no connection state for it, and is reset: a stateless ECMP
	// fabric moves the flows of a path it stops using, whatever the node
	// does. Those are counted apart (from the ToR's netlink, to the
	// millisecond) where the disruption moves pods between nodes (moves
	// is set); every other request must succeed: no new request ever
	// meets a blackhole. Where nothing should move (restarts), a route
	// change at all is a failure.
	underLoad := func(t *testing.T, what string, moves bool, disrupt func(t *testing.T)) (routeMoves int) {
		t.Helper()
		e.t = t
		var prefixes []netip.Prefix
		for _, a := range local {
			prefixes = append(prefixes, netip.PrefixFrom(a, a.BitLen()))
		}
		routes := watchRoutes(t, tor, prefixes)
		withdrawn := watchWithdrawals(e, local)
		l := startLoad(tor, local...)
		time.Sleep(time.Second)
		disrupt(t)
		time.Sleep(2 * time.Second)
		sent, all := l.end()
		routes.end()
		lost := withdrawn()
		var failed, moved []string
		for _, f := range all {
			if moves && routes.during(f) {
				moved = append(moved, f.String())
			} else {
				failed = append(failed, f.String())
			}
		}
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d requests failed; first: %s", what, len(failed), sent, strings.Join(failed[:min(5, len(failed))], "; "))
		}
		if sent < 50 {
			t.Errorf("%s: only %d requests sent", what, sent)
		}
		if n := routes.count(); !moves && n > 0 {
			t.Errorf("%s: the ToR's route to the Service changed %d times; a restart must move nothing", what, n)
		}
		if lost != "" {
			t.Errorf("%s: the ToR lost a path: %s", what, lost)
		}
		out, _ := c.Kubectl(ctx, "get", "service", "echo-local", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}")
		if out != local[0].String()+" "+local[1].String() {
			t.Errorf("%s: echo-local's addresses changed: %v → %q", what, local, out)
		}
		t.Logf("%s: %d requests, %d failed, %d in flight while the ToR moved the route %v (%d route changes at the ToR: %s)", what, sent, len(failed), len(moved), moved, routes.count(), routes)
		survived := "no request failed, the ToR kept a path, the addresses stayed"
		if len(failed) > 0 || lost != "" {
			survived = "NO"
		}
		record(t, reliabilityRow{Section: "Services under load", Fault: what, ToR: "BIRD; kube-proxy (nftables), containerd " + c.Opts.Release.Containerd,
			Done: "two nodes, a LoadBalancer Service (externalTrafficPolicy Local, IPv6 and IPv4) with a pod on each, a new connection from the ToR every 20 ms, both families in turn, spread over both nodes", Times: 1, Survived: survived,
			Figures: map[string]string{"requests": fmt.Sprint(sent), "failed": fmt.Sprint(len(failed)), "reset in flight as the ToR moved the route": fmt.Sprint(len(moved)), "paths lost at the ToR": fmt.Sprint(lost != "")}})
		return routes.count()
	}

	t.Run("rolling update under load, externalTrafficPolicy Local", func(t *testing.T) {
		underLoad(t, "rolling update (kubectl rollout restart; preStop 5 s)", true, func(t *testing.T) {
			e.t = t
			e.kubectl("rollout", "restart", "deployment/echo")
			e.kubectl("rollout", "status", "deployment/echo", "--timeout=120s")
			// Until the old pods are gone: their preStop and SIGTERM are
			// where a drain done wrong would lose requests.
			testutil.EventuallyWithin(t, 60*time.Second, "the old pods gone", func() (bool, string) {
				out, _ := c.Kubectl(ctx, "get", "pods", "-l", "app=echo", "-o", "name")
				return len(strings.Fields(out)) == 2, out
			})
		})
	})
	t.Run("agent restart under load", func(t *testing.T) {
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
			underLoad(t, "flock agent "+sig.String()+" (kubelet restarts it)", false, func(t *testing.T) {
				restartContainer(t, e, k8sNode, "agent", "/usr/local/bin/flock-agent", sig)
			})
		}
	})
	t.Run("node drain under load, externalTrafficPolicy Local", func(t *testing.T) {
		n := underLoad(t, "node drained (kubectl drain; preStop 5 s)", true, func(t *testing.T) {
			e.kubectl("drain", node2, "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=app=echo", "--timeout=120s")
			hopsAre(t, "Local after the drain", local, nodes[0])
			hopsAre(t, "Cluster after the drain", cluster, nodes[0], nodes[1])
		})
		if n == 0 {
			t.Error("the drain never moved the ToR's route (nor did the route watch see it)")
		}
		e.kubectl("uncordon", node2)
	})
	t.Run("an aggregating pool: Cluster addresses as the pool's CIDR, Local ones on their own", func(t *testing.T) {
		e.t = t
		localPaths := map[netip.Addr]int{}
		for _, a := range local {
			localPaths[a] = e.birdPaths(netip.PrefixFrom(a, a.BitLen()))
		}
		e.apply(strings.Replace(trafficPools, "  namespaces: [default]\n", "  namespaces: [default]\n  aggregate: true\n", 1))
		agg6, agg4 := netip.MustParsePrefix("2001:db8:1b::/120"), netip.MustParsePrefix("203.0.113.128/28")
		e.waitBird(agg6, 2) // both nodes deliver the Cluster Service
		e.waitBird(agg4, 2)
		for _, a := range cluster {
			e.waitBird(netip.PrefixFrom(a, a.BitLen()), 0)
		}
		for _, a := range local {
			if n := e.birdPaths(netip.PrefixFrom(a, a.BitLen())); n != localPaths[a] || n == 0 {
				t.Errorf("%s (Local) not on its own at the ToR: %d paths, %d before", a, n, localPaths[a])
			}
		}
		for _, a := range append(append([]netip.Addr{}, cluster...), local...) {
			if _, _, err := echoGet(tor, a, 3*time.Second); err != nil {
				t.Errorf("%s through the aggregate: %v", a, err)
			}
		}
		e.apply(trafficPools)
		e.waitBird(agg6, 0)
		e.waitBird(agg4, 0)
		for _, a := range cluster {
			e.waitBird(netip.PrefixFrom(a, a.BitLen()), 2)
		}
	})
	t.Run("assigner (flock-policy) restart under load", func(t *testing.T) {
		underLoad(t, "LoadBalancer assigner (flock-policy) killed (kubelet restarts it)", false, func(t *testing.T) {
			leader := e.kubectl("get", "lease", "-n", "flock-system", "flock-loadbalancers", "-o", "jsonpath={.spec.holderIdentity}")
			restartContainer(t, e, leader, "policy", "/usr/local/bin/flock-policy", syscall.SIGKILL)
		})
	})
	t.Run("switched to ClusterIP: address released, claim gone, route withdrawn", func(t *testing.T) {
		e.t = t
		e.kubectl("patch", "service", "echo-cluster", "--type=merge", "-p", `{"spec":{"type":"ClusterIP"}}`)
		for _, a := range cluster {
			e.waitBird(netip.PrefixFrom(a, a.BitLen()), 0)
			name := claims.ClaimName(a)
			testutil.EventuallyWithin(t, 30*time.Second, "the claim of "+a.String()+" gone", func() (bool, string) {
				out, err := c.Kubectl(ctx, "get", "addressclaim", name, "-o", "name")
				return err != nil && strings.Contains(out, "NotFound"), out
			})
		}
		for _, a := range local {
			if n := e.birdPaths(netip.PrefixFrom(a, a.BitLen())); n == 0 {
				t.Errorf("%s (the other Service) left the ToR", a)
			}
		}
	})
	t.Run("the pod relays (deploy/relay) serve both nodes' policy containers", func(t *testing.T) {
		e.t = t
		testRelayInTheCluster(t, e, l.root)
	})
	t.Run("uninstall: both nodes clean, the ToR's routes withdrawn; installing again works", func(t *testing.T) {
		e.t = t
		for _, p := range []netip.Prefix{k8sSummary6, node2Summary6} {
			e.waitBird(p, 1)
		}
		start := time.Now()
		e.kubectl("delete", "-k", filepath.Join(l.root, "deploy"), "--wait=true", "--timeout=120s")
		testutil.EventuallyWithin(t, 90*time.Second, "flock's pods gone", func() (bool, string) {
			out, _ := c.Kubectl(ctx, "get", "pods", "-A", "-l", agentSelector, "-o", "name")
			return strings.TrimSpace(out) == "", out
		})
		// Withdrawn, not left stale for the graceful-restart time (120 s).
		for _, p := range []netip.Prefix{k8sSummary6, k8sSummary4, node2Summary6, node2Summary4} {
			e.waitBird(p, 0)
		}
		t.Logf("uninstalled, the ToR's routes gone, in %s", time.Since(start).Round(100*time.Millisecond))
		for _, n := range []struct {
			name, root string
			ns         *lab.NS
			mounted    []string
		}{
			// The lab pins both nodes' state and run directories (k8slab:
			// the second node's stand on the first's), so the agents can
			// only empty them; agent/daemon's TestLeave removes a plain one.
			{k8sNode, "/", hostNS, []string{"/var/lib/flock", "/run/flock"}},
			{node2, filepath.Join(l.n2.Dir, "private"), l.vm2, []string{"/var/lib/flock", "/run/flock"}},
		} {
			if left := nodeLeftovers(t, n.ns, n.root, n.mounted...); len(left) > 0 {
				t.Errorf("node %s after the uninstall: %v", n.name, left)
			}
		}
		// The echo pods lost their network; installed again, flock gives
		// their successors addresses and the Service its address back.
		l.install(filepath.Join(l.root, "deploy"), trafficPools)
		e.kubectl("rollout", "restart", "deployment/echo")
		e.kubectl("rollout", "status", "deployment/echo", "--timeout=180s")
		for _, a := range local {
			testutil.EventuallyWithin(t, 60*time.Second, "an answer from "+a.String()+" after the reinstall", func() (bool, string) {
				_, _, err := echoGet(tor, a, 3*time.Second)
				return err == nil, fmt.Sprint(err)
			})
		}
	})
}

// restartContainer signals the container's process on node and waits
// until kubelet has it running again.
func restartContainer(t *testing.T, e *k8sEnv, node, container, binary string, sig syscall.Signal) {
	t.Helper()
	get := func(field string) string {
		out, _ := e.c.Kubectl(t.Context(), "-n", "flock-system", "get", "pods", "-l", agentSelector, "--field-selector", "spec.nodeName="+node, "-o",
			fmt.Sprintf(`jsonpath={.items[0].status.containerStatuses[?(@.name=="%s")].%s}`, container, field))
		return out
	}
	count := func() string { return get("restartCount") }
	before := count()
	if err := syscall.Kill(nodePID(t, binary, node), sig); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 90*time.Second, container+" restarted and ready", func() (bool, string) {
		out := get("ready")
		return count() != before && out == "true", "restarts " + count() + ", ready " + out
	})
}

// watchWithdrawals polls the ToR for each address's path until the
// returned function is called; it says which went missing, and when.
func watchWithdrawals(e *k8sEnv, addrs []netip.Addr) func() string {
	var prefixes []netip.Prefix
	for _, a := range addrs {
		prefixes = append(prefixes, netip.PrefixFrom(a, a.BitLen()))
	}
	return watchPrefixWithdrawals(e, prefixes)
}

// watchPrefixWithdrawals is watchWithdrawals for prefixes.
func watchPrefixWithdrawals(e *k8sEnv, prefixes []netip.Prefix) func() string {
	stop, done := make(chan struct{}), make(chan string, 1)
	go func() {
		var lost []string
		for {
			for _, p := range prefixes {
				// Not e.birdPaths: this goroutine must not end the test.
				out, _ := e.bird.Cmd("show route " + p.String() + " all")
				if !strings.Contains(out, "BGP.as_path") {
					lost = append(lost, p.String()+" at "+time.Now().Format("15:04:05.000"))
				}
			}
			select {
			case <-stop:
				done <- strings.Join(lost, ", ")
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() string { close(stop); return <-done }
}

// nodeLeftovers lists what flock left in a node: its veths and routes
// (protocol 70) in the node's network namespace, its nftables table, and
// its files under root (the node's / as the host sees it). A directory
// the node mounts privately (vm2's, in the lab) cannot be removed from
// inside the node, only emptied: mounted says which may stay, empty.
func nodeLeftovers(t *testing.T, ns *lab.NS, root string, mounted ...string) []string {
	t.Helper()
	var left []string
	err := ns.InNS(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "flock") {
				left = append(left, "link "+l.Attrs().Name)
			}
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: 70}, netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				return err
			}
			for _, r := range rs {
				left = append(left, fmt.Sprintf("route %v proto 70", r.Dst))
			}
		}
		out, err := exec.Command("nft", "list", "tables").CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft list tables: %v: %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "flock") || strings.Contains(line, "kube-network-policies") {
				left = append(left, "nftables "+strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: %v", ns.Name, err)
	}
	for _, p := range []string{"/etc/cni/net.d/01-flock.conflist", "/etc/cni/net.d/.flock-install", "/opt/cni/bin/flock", "/var/lib/flock", "/run/flock"} {
		entries, err := os.ReadDir(filepath.Join(root, p))
		switch {
		case os.IsNotExist(err):
		case err == nil && len(entries) == 0 && slices.Contains(mounted, p):
		case err == nil:
			var names []string
			for _, en := range entries {
				names = append(names, en.Name())
			}
			left = append(left, fmt.Sprintf("%s %v", p, names))
		default:
			left = append(left, p) // a file
		}
	}
	return left
}
