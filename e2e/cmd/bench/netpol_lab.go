package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/procfs"
)

// npLab is the section's namespaces and servers.
type npLab struct {
	node    *lab.NS
	pods    map[string]*npPod
	order   []*npPod
	servers []*tcpServer
	udp     []*udpServer
}

func newNPLab(prefix string, policies int) (*npLab, error) {
	l := &npLab{pods: map[string]*npPod{}}
	ok := false
	defer func() {
		if !ok {
			l.Close()
		}
	}()
	var err error
	if l.node, err = lab.NewNS(prefix + "node"); err != nil {
		return nil, err
	}
	for _, k := range []string{"net.ipv6.conf.all.forwarding", "net.ipv6.conf.default.forwarding"} {
		if err := l.node.Sysctl(k, "1"); err != nil {
			return nil, err
		}
	}
	for i, s := range npPodSpecs(policies) {
		k := i + 1
		p := &npPod{name: s.name, labels: s.labels,
			ip: netip.MustParseAddr(fmt.Sprintf("fd00:6e70:0:%x::2", k)),
			gw: netip.MustParseAddr(fmt.Sprintf("fd00:6e70:0:%x::1", k))}
		if p.ns, err = lab.NewNS(prefix + s.name); err != nil {
			return nil, err
		}
		l.pods[s.name] = p
		l.order = append(l.order, p)
		nodeIf := fmt.Sprintf("np%d", k)
		p.nodeIf = nodeIf
		if err := lab.Connect(l.node, nodeIf, p.ns, "eth0"); err != nil {
			return nil, err
		}
		if err := l.node.AddrAdd(nodeIf, netip.PrefixFrom(p.gw, 64)); err != nil {
			return nil, err
		}
		if err := p.ns.AddrAdd("eth0", netip.PrefixFrom(p.ip, 64)); err != nil {
			return nil, err
		}
		if err := p.ns.RouteAdd(netip.MustParsePrefix(npNet), p.gw); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{podServer, podOpen} {
		s, err := serveIn(l.pods[name].ns, l.pods[name].addr())
		if err != nil {
			return nil, err
		}
		l.servers = append(l.servers, s)
		u, err := udpServeIn(l.pods[name].ns, l.pods[name].addr())
		if err != nil {
			return nil, err
		}
		l.udp = append(l.udp, u)
	}
	ok = true
	return l, nil
}

// Close stops the servers and deletes the namespaces (flock-policy's
// table, which outlives the process on purpose, goes with the node's).
func (l *npLab) Close() {
	for _, s := range l.servers {
		s.Close()
	}
	for _, s := range l.udp {
		s.Close()
	}
	for _, p := range l.order {
		if err := p.ns.Delete(); err != nil {
			logf("netpol: delete %s: %v", p.ns.Name, err)
		}
	}
	if l.node != nil {
		if err := l.node.Delete(); err != nil {
			logf("netpol: delete %s: %v", l.node.Name, err)
		}
	}
}

// createObjects makes the Namespace (labelled), its ServiceAccount (no
// controller does in the API-only lab, and pods need it), the Node and
// the pods, each with its IP in status.podIPs.
func (l *npLab) createObjects(ctx context.Context, cs kubernetes.Interface) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: npNamespace, Labels: map[string]string{npBenchLabel: "netpol"}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Namespace: %w", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: npNamespace}}
	if _, err := cs.CoreV1().ServiceAccounts(npNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ServiceAccount: %w", err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: npNode, Labels: map[string]string{"kubernetes.io/hostname": npNode}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Node: %w", err)
	}
	for _, p := range l.order {
		if err := createPod(ctx, cs, p.name, p.labels, npNode, p.ip); err != nil {
			return err
		}
	}
	return nil
}

// createPod creates a pod on node and gives it ip (as kubelet would
// report it: status.podIP, status.podIPs, Running and Ready).
func createPod(ctx context.Context, cs kubernetes.Interface, name string, labels map[string]string, node string, ip netip.Addr) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: npNamespace, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "none",
			Ports: []corev1.ContainerPort{{ContainerPort: npPort, Protocol: corev1.ProtocolTCP}}}}},
	}
	created, err := cs.CoreV1().Pods(npNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Pod %s: %w", name, err)
	}
	now := metav1.Now()
	st := &created.Status // what the apiserver set (the QoS class) stays
	st.Phase, st.PodIP, st.PodIPs, st.StartTime = corev1.PodRunning, ip.String(), []corev1.PodIP{{IP: ip.String()}}, &now
	st.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	if _, err := cs.CoreV1().Pods(npNamespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("status of Pod %s: %w", name, err)
	}
	return nil
}

// createFillers creates n more pods from 8 workers: the API of a cluster
// of that size, spread over ten nodes (a tenth on the bench's node), in
// twenty deployments' worth of labels, none of which a policy selects.
func createFillers(ctx context.Context, cs kubernetes.Interface, n int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					errs <- nil
					return
				}
				node := npNode
				if i%10 != 0 {
					node = fmt.Sprintf("bench-other-%d", i%10)
				}
				labels := map[string]string{"app": fmt.Sprintf("filler-%02d", i%20), "tier": []string{"web", "backend", "batch"}[i%3]}
				ip := netip.MustParseAddr(fmt.Sprintf("fd00:6e70:ff::%x", i+1))
				if err := createPod(ctx, cs, fmt.Sprintf("filler-%04d", i), labels, node, ip); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// freeLoopbackPort is a loopback address with a port nothing in the node
// namespace listens on.
func (l *npLab) freeLoopbackPort() (string, error) {
	var addr string
	err := l.node.InNS(func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		addr = ln.Addr().String()
		return ln.Close()
	})
	return addr, err
}

// httpClient reaches addresses as seen from the node namespace (the
// metrics listener is on its loopback).
func (l *npLab) httpClient() *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := l.node.InNS(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
}

// dial makes one connection from pod from to server to, and closes it.
func (l *npLab) dial(from, to string, timeout time.Duration) error {
	addr := l.pods[to].addr()
	return l.pods[from].ns.InNS(func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		closeReset(c)
		return nil
	})
}

// refused is nil if a connection from pod from to server to times out
// (its SYN dropped: what a policy that does not allow it does).
func (l *npLab) refused(from, to string) error {
	err := l.dial(from, to, 1500*time.Millisecond)
	var ne net.Error
	switch {
	case err == nil:
		return fmt.Errorf("%s → %s connected", from, to)
	case errors.As(err, &ne) && ne.Timeout():
		return nil
	default:
		return fmt.Errorf("%s → %s: %w (want a timeout)", from, to, err)
	}
}

// waitEnforced waits until the policies are in effect, all of them: the
// intruder's SYN to the selected server is dropped, and the probe, which
// only the last policy created allows, and the client connect.
func (l *npLab) waitEnforced(p *policyProc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := p.exited(); err != nil {
			return err
		}
		why := l.refused(podIntruder, podServer)
		if why == nil {
			if err := l.dial(podProbe, podServer, 1500*time.Millisecond); err != nil {
				why = fmt.Errorf("probe → server (only the last policy allows it): %w", err)
			} else if err := l.dial(podClient, podServer, 1500*time.Millisecond); err != nil {
				why = fmt.Errorf("client → server: %w", err)
			} else {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("policies not in effect after %s: %w\n--- flock-policy log (tail) ---\n%s", timeout, why, p.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// connRates is the rate of new connections from npWorkers clients to the
// selected and to the unselected server, each for d in two halves, the
// order selected, unselected, unselected, selected (the machine's speed
// drifts).
func (l *npLab) connRates(p *policyProc, d time.Duration) (sel, unsel float64, err error) {
	type acc struct {
		n  int
		el time.Duration
	}
	var s, u acc
	client := l.pods[podClient].ns
	for _, target := range []string{podServer, podOpen, podOpen, podServer} {
		budget, err := l.connBudget()
		if err != nil {
			return nan(), nan(), err
		}
		n, el, capped, err := connRate(client, l.pods[target].addr(), npWorkers, d/2, budget)
		if err == nil {
			err = p.exited()
		}
		if err != nil {
			return nan(), nan(), fmt.Errorf("to %s: %w", target, err)
		}
		if capped {
			logf("netpol: the run to %s stopped at %d connections (the node's conntrack table)", target, n)
		}
		a := &s
		if target == podOpen {
			a = &u
		}
		a.n, a.el = a.n+n, a.el+el
	}
	return float64(s.n) / s.el.Seconds(), float64(u.n) / u.el.Seconds(), nil
}

// connBudget is how many connections the next rate run may make without
// filling the node namespace's conntrack table (each closed connection
// stays in it ~10 s): it waits up to 20 s for the earlier runs' entries
// to expire. Without conntrack figures, no limit.
func (l *npLab) connBudget() (int, error) {
	for i := 0; ; i++ {
		limit, count, err := l.conntrack()
		if err != nil {
			return math.MaxInt, nil
		}
		b := connBudget(limit, count)
		if b >= limit/4 || i >= 200 {
			if b == 0 {
				return 0, fmt.Errorf("the node namespace's conntrack table holds %d of %d entries", count, limit)
			}
			return b, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// connBudget is half the conntrack table less what it holds; no limit
// (math.MaxInt) if the table has none.
func connBudget(limit, count int) int {
	if limit <= 0 {
		return math.MaxInt
	}
	return max(limit/2-count, 0)
}

// conntrack reads the node namespace's conntrack limit and count.
func (l *npLab) conntrack() (limit, count int, err error) {
	err = l.node.InNS(func() error {
		read := func(name string) (int, error) {
			b, err := os.ReadFile("/proc/sys/net/netfilter/" + name)
			if err != nil {
				return 0, err
			}
			return strconv.Atoi(strings.TrimSpace(string(b)))
		}
		var err error
		if limit, err = read("nf_conntrack_max"); err != nil {
			return err
		}
		count, err = read("nf_conntrack_count")
		return err
	})
	return limit, count, err
}

// connectLatency makes warm+n connections from one thread in from to each
// address in turn (the order alternating), timing each handshake (dial
// until it returns); the first warm of each are not kept.
func connectLatency(from *lab.NS, addrs []string, n, warm int) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(addrs))
	err := from.InNS(func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		for i := range warm + n {
			for j := range addrs {
				k := j
				if i%2 == 1 {
					k = len(addrs) - 1 - j
				}
				start := time.Now()
				c, err := d.Dial("tcp", addrs[k])
				el := time.Since(start)
				if err != nil {
					return fmt.Errorf("connect %d to %s: %w", i, addrs[k], err)
				}
				closeReset(c)
				if i >= warm {
					out[k] = append(out[k], el)
				}
			}
		}
		return nil
	})
	return out, err
}

// connRate connects to addr from workers threads in from, each opening
// and closing connections one after the other for d (or until budget
// connections were begun), and says how many completed in how long.
func connRate(from *lab.NS, addr string, workers int, d time.Duration, budget int) (n int, el time.Duration, capped bool, err error) {
	var issued, done atomic.Int64
	var ready sync.WaitGroup
	ready.Add(workers)
	start := make(chan struct{})
	var deadline time.Time // written before start is closed
	errs := make(chan error, workers)
	for range workers {
		go func() {
			var once sync.Once
			err := from.InNS(func() error {
				dl := net.Dialer{Timeout: 3 * time.Second}
				once.Do(ready.Done)
				<-start
				for time.Now().Before(deadline) {
					if issued.Add(1) > int64(budget) {
						return nil
					}
					c, err := dl.Dial("tcp", addr)
					if err != nil {
						return err
					}
					closeReset(c)
					done.Add(1)
				}
				return nil
			})
			once.Do(ready.Done) // if the namespace could not be entered
			errs <- err
		}()
	}
	ready.Wait()
	t0 := time.Now()
	deadline = t0.Add(d)
	close(start)
	for range workers {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	return int(done.Load()), time.Since(t0), issued.Load() > int64(budget), err
}

// closeReset closes c with a reset: no TIME_WAIT is left, so that tens of
// thousands of connections do not run out of ports.
func closeReset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// tcpServer accepts connections and closes them at once.
type tcpServer struct {
	l    net.Listener
	done chan struct{}
}

// serveIn listens on addr inside ns.
func serveIn(ns *lab.NS, addr string) (*tcpServer, error) {
	var l net.Listener
	if err := ns.InNS(func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, ns.Name, err)
	}
	s := &tcpServer{l: l, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			c, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(time.Millisecond) // out of descriptors and the like
				continue
			}
			_ = c.Close()
		}
	}()
	return s, nil
}

func (s *tcpServer) Close() {
	_ = s.l.Close()
	<-s.done
}

// policyProc is a flock-policy process the bench started.
type policyProc struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once Wait returned
	err     error         // Wait's, set before done is closed
}

// startPolicy starts bin/flock-policy inside node (a child inherits the
// namespace of the thread that starts it), its log to dir.
func startPolicy(node *lab.NS, binDir, dir, kubeconfig, metrics string, args ...string) (*policyProc, error) {
	logPath := filepath.Join(dir, "flock-policy.log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(binDir, "flock-policy"), append([]string{"--node-name=" + npNode, "--kubeconfig=" + kubeconfig,
		"--metrics-address=" + metrics, "--admin-socket=", "--agent-socket="}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := node.InNS(cmd.Start); err != nil {
		return nil, fmt.Errorf("start flock-policy in %s: %w", node.Name, err)
	}
	p := &policyProc{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *policyProc) pid() int { return p.cmd.Process.Pid }

func (p *policyProc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	return tail(string(b), 30)
}

// exited is nil while the process runs, else says how it ended (its
// log's tail on the next lines).
func (p *policyProc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("flock-policy (pid %d) exited: %v\n--- flock-policy log (tail) ---\n%s", p.pid(), p.err, p.logTail())
	default:
		return nil
	}
}

// waitReady polls url (/readyz) until it answers 200.
func (p *policyProc) waitReady(c *http.Client, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := p.exited(); err != nil {
			return err
		}
		var last string
		resp, err := c.Get(url)
		if err != nil {
			last = err.Error()
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status + ": " + strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("flock-policy not ready after %s (%s)\n--- flock-policy log (tail) ---\n%s", timeout, last, p.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rss waits settle, then reads the process's VmRSS in MB; an error if it
// exited meanwhile (or while it was read): a dead process has no figure.
func (p *policyProc) rss(settle time.Duration) (float64, error) {
	select {
	case <-p.done:
		return nan(), p.exited()
	case <-time.After(settle):
	}
	if err := p.exited(); err != nil {
		return nan(), err
	}
	b, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	// Still ours and running after the read: the pid was not reaped (and
	// so not reused) while it was read.
	if err := p.exited(); err != nil {
		return nan(), err
	}
	if rerr != nil {
		return nan(), rerr
	}
	st, err := procfs.ParseStatus(b)
	if err != nil {
		return nan(), fmt.Errorf("flock-policy (pid %d): %w", p.pid(), err)
	}
	mb, err := st.LiveRSSMB("flock-policy")
	if err != nil {
		return nan(), fmt.Errorf("pid %d: %w", p.pid(), err)
	}
	return mb, nil
}

// stop sends SIGTERM and waits; SIGKILL after 10 s.
func (p *policyProc) stop() {
	if p.exited() != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		logf("netpol: flock-policy (pid %d) ignored SIGTERM for 10 s; killing it", p.pid())
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
