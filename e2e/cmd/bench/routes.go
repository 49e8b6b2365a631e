package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/agent/metrics"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/procfs"
)

const (
	podRange      = "2001:db8:100::/112" // cluster-wide pod addresses: a /128 route each
	anycastRange  = "2001:db8:a::/64"    // the scale run's routes
	baselineRange = "2001:db8:b::/64"    // what the bare GoBGP originates
)

// benchNodeConfig is node1's NodeConfig: dual-stack pods from the node's
// summaries (big enough for the scale run), one IPv6 session to the ToR,
// and AddressPools for cluster-wide pod addresses and anycast.
func benchNodeConfig(n *lab.LabNode) string {
	return fmt.Sprintf(`apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: %s
spec:
  asn: %d
  routerID: 10.255.0.%d
  defaults:
    ipv4: true
  pools:
  - cidr: fd00:10:%d::/64
  - cidr: 10.%d.0.0/20
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
  name: bench-pods
spec:
  cidrs: [%s]
  use: [pod]
  namespaces: [default]
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: bench-anycast
spec:
  cidrs: [%s]
  use: [anycast]
  namespaces: [default]
`, n.Name, lab.NodeASN, 10+n.Index, n.Index, 10+n.Index, n.TorV6, lab.TorASN, n.V6, podRange, anycastRange)
}

// nodeLab is one flock node (node1) and a spare node namespace (node2,
// where the bare-GoBGP baseline runs), both peered with a BIRD ToR that
// installs what it learns in its kernel table. The node's UPDATEs are
// captured on the ToR's port.
type nodeLab struct {
	once   sync.Once
	l      *lab.BGPLab
	n      *lab.LabNode
	spare  *lab.LabNode
	cap    *lab.BGPCapture
	fib    *lab.FIBWatch
	binDir string
}

func newNodeLab(prefix, dir, binDir string) (*nodeLab, error) {
	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: prefix, Dir: dir, BinDir: binDir, Nodes: 2,
		NodeConfig: benchNodeConfig, AgentArgs: []string{"--log-level", "info"},
		SkipAgent: func(n *lab.LabNode) bool { return n.Index == 2 }})
	if err != nil {
		return nil, err
	}
	nl := &nodeLab{l: l, n: l.Nodes[0], spare: l.Nodes[1], binDir: binDir}
	ok := false
	defer func() {
		if !ok {
			nl.Close()
		}
	}()
	if nl.cap, err = lab.CaptureBGP(l.Tor, nl.n.TorIf); err != nil {
		return nil, err
	}
	if nl.fib, err = lab.WatchFIB(l.Tor); err != nil {
		return nil, err
	}
	if err := l.StartBird(lab.BirdOptions{GR: true}); err != nil {
		return nil, err
	}
	if err := nl.waitEoR(0, 60*time.Second); err != nil {
		return nil, err
	}
	ok = true
	return nl, nil
}

func (nl *nodeLab) Close() {
	nl.once.Do(func() {
		if nl.cap != nil {
			nl.cap.Close()
		}
		if nl.fib != nil {
			nl.fib.Close()
		}
		_ = nl.l.Close()
	})
}

// waitEoR waits for the node's End-of-RIB (both families) after m.
func (nl *nodeLab) waitEoR(m lab.Mark, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for nl.cap.Since(m).EoRs < 2 {
		if time.Now().After(deadline) {
			return fmt.Errorf("no End-of-RIB from the node within %s; agent log:\n%s", timeout, tail(nl.n.Agent.Log(), 30))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func (nl *nodeLab) flock() plugin {
	return plugin{name: "flock dual-stack", cni: nl.n.CNI, quiesce: nl.vethsGone, agent: nl.pid,
		vethNS: nl.n.NS, vethName: dataplane.HostVethName,
		args: func(i int) [][2]string { return lab.PodArgs("default", fmt.Sprintf("p%d", i)) }}
}

func (nl *nodeLab) flockV4() plugin {
	return plugin{name: "flock IPv4-only", cni: nl.n.CNI, quiesce: nl.vethsGone, agent: nl.pid,
		vethNS: nl.n.NS, vethName: dataplane.HostVethName,
		args: func(i int) [][2]string {
			return lab.PodArgs("default", fmt.Sprintf("p%d", i), "flock.fritzlab.net/ipv6", "false")
		}}
}

// vethsGone waits until no flock veth is left on the node: a DEL returns
// before the kernel has unregistered the pod's veth (ptp's DEL waits for
// it), and the next timed phase must not run beside that.
func (nl *nodeLab) vethsGone() error {
	deadline := time.Now().Add(time.Minute)
	for {
		var left int
		err := nl.n.NS.Do(func(h *netlink.Handle) error {
			links, err := h.LinkList()
			for _, l := range links {
				if strings.HasPrefix(l.Attrs().Name, dataplane.VethPrefix) {
					left++
				}
			}
			return err
		})
		if err != nil || left == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d flock veths still there after a minute", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (nl *nodeLab) pid() int { return nl.n.Agent.Pid() }

// agent is the running agent, for a measurement that must end with it
// alive.
func (nl *nodeLab) agent() (procfs.Proc, error) { return procfs.Watch("flock-agent", nl.pid()) }

// baseline starts the bare GoBGP in the spare node and waits for its
// session.
type baselineProc struct {
	cmd   *exec.Cmd
	stdin interface {
		Write([]byte) (int, error)
		Close() error
	}
	out *lineReader
}

// startBaseline builds and starts the bare GoBGP with GOGC gogc (the
// agent's; empty: the environment's).
func (nl *nodeLab) startBaseline(bin, gogc string) (*baselineProc, error) {
	root, err := lab.RepoRoot()
	if err != nil {
		return nil, err
	}
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./e2e/cmd/gobgp-baseline")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the baseline: %w\n%s", err, out)
	}
	s := nl.spare
	cmd := exec.Command(bin, "-local", s.V6.String(), "-peer", s.TorV6.String(), "-asn", fmt.Sprint(lab.NodeASN), "-peer-asn", fmt.Sprint(lab.TorASN))
	if gogc != "" {
		cmd.Env = append(os.Environ(), "GOGC="+gogc)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := s.NS.InNS(cmd.Start); err != nil {
		return nil, err
	}
	b := &baselineProc{cmd: cmd, stdin: in, out: newLineReader(out)}
	if _, err := b.out.expect("ready", 10*time.Second); err != nil {
		b.stop()
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := nl.l.Bird.Cmd("show protocols " + s.Name)
		if strings.Contains(st, "Established") {
			return b, nil
		}
		if time.Now().After(deadline) {
			b.stop()
			return nil, fmt.Errorf("bare GoBGP: no session with the ToR: %s", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *baselineProc) add(n int, base netip.Addr) error {
	if _, err := fmt.Fprintf(b.stdin, "add %d %s\n", n, base); err != nil {
		return err
	}
	_, err := b.out.expect("ok", time.Minute)
	return err
}

func (b *baselineProc) stop() {
	_ = b.stdin.Close()
	done := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// scalePods ADDs n pods with perPod anycast addresses each (distinct, so
// n×perPod routes) from 8 workers.
func (nl *nodeLab) scalePod(i, perPod int) lab.Pod {
	var any []string
	for k := range perPod {
		any = append(any, fmt.Sprintf("2001:db8:a::%x:%x", i+1, k+1))
	}
	return lab.Pod{ContainerID: fmt.Sprintf("scale%06d", i), Args: lab.PodArgs("default", fmt.Sprintf("scale-%d", i), "flock.fritzlab.net/anycast", strings.Join(any, ","))}
}

// ipv6Of returns the pod's IPv6 address from a CNI result.
func ipv6Of(r types.Result) (netip.Addr, error) {
	res, err := types100.GetResult(r)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Is6() && !a.Is4In6() {
			return a, nil
		}
	}
	return netip.Addr{}, errors.New("no IPv6 address in the result")
}

// routeLatency ADDs and DELs n pods with a cluster-wide address (a /128
// route each), one at a time, and times the UPDATE and the WITHDRAW on the
// wire and the ToR's FIB against the CNI calls.
type routeLat struct {
	addToWire, addRetToWire, addToFIB []time.Duration
	delToWire, delRetToWire, delToFIB []time.Duration
}

func (nl *nodeLab) routeLatency(ctx context.Context, ns *lab.NS, n int) (routeLat, error) {
	var r routeLat
	for i := range n {
		p := lab.Pod{ContainerID: fmt.Sprintf("route%06d", i), NS: ns,
			Args: lab.PodArgs("default", fmt.Sprintf("route-%d", i), "flock.fritzlab.net/cidr6", podRange, "flock.fritzlab.net/ipv4", "false")}
		m := nl.cap.Mark()
		start := time.Now()
		res, err := nl.n.CNI.Add(ctx, p)
		if err != nil {
			return r, fmt.Errorf("ADD %d: %w", i, err)
		}
		ret := time.Since(start)
		ip, err := ipv6Of(res)
		if err != nil {
			return r, err
		}
		pfx := netip.PrefixFrom(ip, 128)
		at, err := nl.cap.WaitFor(m, pfx, false, 10*time.Second)
		if err != nil {
			return r, err
		}
		r.addToWire = append(r.addToWire, at.Sub(start))
		r.addRetToWire = append(r.addRetToWire, at.Sub(start.Add(ret)))
		fat, err := nl.fib.WaitPresent(pfx, 10*time.Second)
		if err != nil {
			return r, err
		}
		r.addToFIB = append(r.addToFIB, fat.Sub(start))

		m = nl.cap.Mark()
		start = time.Now()
		if err := nl.n.CNI.Del(ctx, p); err != nil {
			return r, fmt.Errorf("DEL %d: %w", i, err)
		}
		ret = time.Since(start)
		at, err = nl.cap.WaitFor(m, pfx, true, 10*time.Second)
		if err != nil {
			return r, err
		}
		r.delToWire = append(r.delToWire, at.Sub(start))
		r.delRetToWire = append(r.delRetToWire, at.Sub(start.Add(ret)))
		fat, err = nl.fib.WaitGone(pfx, 10*time.Second)
		if err != nil {
			return r, err
		}
		r.delToFIB = append(r.delToFIB, fat.Sub(start))
	}
	return r, nil
}

// restart stops the agent with sig, starts it again and reports how long
// until it answered STATUS, how long until its End-of-RIB was on the wire,
// and how many prefixes were withdrawn at the ToR meanwhile (on the wire
// and from its FIB).
type restartResult struct {
	ready, eor         time.Duration
	withdrawn, fibLost int
}

func (nl *nodeLab) restart(sig syscall.Signal) (restartResult, error) {
	var r restartResult
	a := nl.n.Agent
	m := nl.cap.Mark()
	nl.fib.ResetLow()
	before := nl.fib.LowWater()
	var err error
	if sig == syscall.SIGKILL {
		err = a.Kill()
	} else {
		err = a.Stop()
	}
	if err != nil {
		return r, err
	}
	start := time.Now()
	if err := a.Start(filepath.Join(nl.binDir, "flock-agent"), 30*time.Second); err != nil {
		return r, err
	}
	r.ready = time.Since(start)
	if err := nl.waitEoR(m, 60*time.Second); err != nil {
		return r, err
	}
	r.eor = time.Since(start)
	time.Sleep(3 * time.Second) // anything withdrawn late would show by now
	r.withdrawn = nl.cap.Since(m).Withdrawn
	r.fibLost = before - nl.fib.LowWater()
	return r, nil
}

func randPrefix() string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 4)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return "fb" + string(b) + "-"
}

func nan() float64 { return math.NaN() }

// agentGOGC is the agent's GOGC as it stands: the Go collector's
// go_gc_gogc_percent on its metrics listener (loopback in the node's
// namespace), as an environment value ("off" for -1).
func (nl *nodeLab) agentGOGC() (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := nl.n.NS.InNS(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
	resp, err := c.Get("http://" + metrics.DefaultAddress + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("agent /metrics: %s", resp.Status)
	}
	return parseGOGC(b)
}

// parseGOGC finds go_gc_gogc_percent in a Prometheus text exposition.
func parseGOGC(b []byte) (string, error) {
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || f[0] != "go_gc_gogc_percent" {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil || v != math.Trunc(v) {
			return "", fmt.Errorf("go_gc_gogc_percent %q", f[1])
		}
		if v < 0 {
			return "off", nil
		}
		return strconv.FormatFloat(v, 'f', 0, 64), nil
	}
	return "", errors.New("no go_gc_gogc_percent in the agent's metrics")
}
