package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// The measured node: flock-agent, flock-policy and kube-proxy (nftables
// mode, the baseline: it already pays the Services and EndpointSlices
// fan-out on every node) in one node namespace of a BGP lab, each talking
// to the API server through an apiProxy of its own. flock-relay runs
// there too: flock-policy reads the pods from it, as every node of a
// cluster with deploy/relay does (the cluster runs two, whatever its
// size: its cost is not a node's).
const (
	procAgent  = "flock-agent"
	procPolicy = "flock-policy"
	procProxy  = "kube-proxy"
	procRelay  = "flock-relay"
)

var procNames = []string{procAgent, procPolicy, procProxy, procRelay}

// proxyPort is where a process's apiProxy listens in the node namespace.
var proxyPort = map[string]int{procAgent: 16443, procPolicy: 16444, procProxy: 16445, procRelay: 16446}

// Listen addresses inside the node namespace.
const (
	policyMetrics   = "127.0.0.1:9982"
	relayListen     = "127.0.0.1:16447"
	relayMetrics    = "127.0.0.1:9984"
	kubeProxyHealth = "127.0.0.1:10256"
	kubeProxyMetric = "127.0.0.1:10249"
)

type measuredNode struct {
	l      *lab.BGPLab
	node   *lab.LabNode
	dir    string
	binDir string
	kpBin  string            // kube-proxy, the lab's build
	kcfg   map[string]string // kubeconfig of each process
	// goneLogged are the processes whose end was logged since they started.
	goneLogged map[string]bool
	proxies    map[string]*apiProxy
	policy     *exec.Cmd
	kproxy     *exec.Cmd
	relay      *exec.Cmd
	// relayToken is flock-policy's token for the relay (audience
	// flock-relay), written by register.
	relayToken string
	pdone      map[string]chan struct{}
	cs         kubernetes.Interface // admin's, for the node's own pods
	// policyAdmin is flock-policy's admin socket ("": off, as measured
	// without -profiles).
	policyAdmin string
	// The API server, for the fan-out windows: its URL, the admin's TLS
	// and its PID.
	apiURL string
	apiTLS *tls.Config
	apiPID int
}

// kubeconfigFor writes the admin kubeconfig with its server at port on
// loopback: the process's apiProxy there.
func kubeconfigFor(admin, path string, port int) error {
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		return fmt.Errorf("read %s: %w", admin, err)
	}
	for _, c := range cfg.Clusters {
		c.Server = fmt.Sprintf("https://127.0.0.1:%d", port)
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// upNode builds the lab (ToR and one node, no agent yet) with the three
// proxies in the node's namespace.
func upNode(ctx context.Context, c *k8slab.Cluster, dir, binDir, prefix string) (*measuredNode, error) {
	m := &measuredNode{dir: dir, binDir: binDir, kpBin: filepath.Join(c.BinDir, k8slab.KubeProxy), kcfg: map[string]string{}, proxies: map[string]*apiProxy{}, pdone: map[string]chan struct{}{}}
	pki := filepath.Join(c.Opts.Dir, "pki")
	serverCert, err := tls.LoadX509KeyPair(filepath.Join(pki, "apiserver.crt"), filepath.Join(pki, "apiserver.key"))
	if err != nil {
		return nil, fmt.Errorf("apiserver certificate: %w", err)
	}
	tc, err := c.TLSConfig("")
	if err != nil {
		return nil, err
	}
	var roots *x509.CertPool = tc.RootCAs
	m.apiURL, m.apiTLS, m.apiPID = c.APIServerURL(), tc, c.PID(k8slab.APIServer)
	for _, p := range procNames {
		m.kcfg[p] = filepath.Join(dir, p+".kubeconfig")
		if err := kubeconfigFor(c.Kubeconfig, m.kcfg[p], proxyPort[p]); err != nil {
			return nil, err
		}
	}
	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: prefix, Dir: dir, BinDir: binDir, Nodes: 1,
		SkipAgent: func(*lab.LabNode) bool { return true }})
	if err != nil {
		return nil, err
	}
	m.l, m.node = l, l.Nodes[0]
	for _, p := range procNames {
		px, err := startAPIProxy(p, m.node.NS, fmt.Sprintf("127.0.0.1:%d", proxyPort[p]), c.APIServerURL(), serverCert, tc.Certificates[0], roots)
		if err != nil {
			m.close()
			return nil, err
		}
		m.proxies[p] = px
	}
	if err := l.StartBird(lab.BirdOptions{GR: true}); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

// nodeConfig is the measured node's NodeConfig (the lab's peering with
// its ToR).
func (m *measuredNode) nodeConfig() string {
	nc, _, _ := strings.Cut(lab.DefaultNodeConfig(m.node), "\n---")
	return nc
}

func (m *measuredNode) close() {
	m.stop(procAgent)
	m.stop(procPolicy)
	m.stop(procProxy)
	m.stop(procRelay)
	for _, p := range m.proxies {
		p.close()
	}
	if m.l != nil {
		m.l.Close()
	}
}

// pid of a running process, 0 if none.
func (m *measuredNode) pid(p string) int {
	switch p {
	case procAgent:
		if m.node.Agent != nil {
			return m.node.Agent.Pid()
		}
	case procPolicy:
		if m.policy != nil && m.policy.Process != nil {
			return m.policy.Process.Pid
		}
	case procProxy:
		if m.kproxy != nil && m.kproxy.Process != nil {
			return m.kproxy.Process.Pid
		}
	case procRelay:
		if m.relay != nil && m.relay.Process != nil {
			return m.relay.Process.Pid
		}
	}
	return 0
}

// start starts process p and returns how long it took to be ready:
// flock-agent answering CNI STATUS (what kubelet waits for), flock-policy
// /readyz (its verdicts in the kernel), kube-proxy /healthz (its first
// sync done).
func (m *measuredNode) start(ctx context.Context, p string, timeout time.Duration) (time.Duration, error) {
	delete(m.goneLogged, p)
	t0 := time.Now()
	switch p {
	case procAgent:
		if m.node.Agent == nil {
			dir := filepath.Join(m.dir, m.node.Name)
			a, err := lab.NewAgent(m.node.NS, dir, m.nodeConfig())
			if err != nil {
				return 0, err
			}
			a.Kubeconfig, a.NodeName = m.kcfg[procAgent], m.node.Name
			a.Args = []string{"--metrics-address=", "--log-level=info"}
			m.node.Agent = a
			if m.node.CNI, err = lab.NewCNI(m.binDir, filepath.Join(dir, "cni-cache"), a.CNISocket, "1.1.0"); err != nil {
				return 0, err
			}
		}
		if err := m.node.Agent.Start(filepath.Join(m.binDir, "flock-agent"), timeout); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	case procPolicy:
		cmd, err := m.startCmd(p, filepath.Join(m.binDir, "flock-policy"), "--node-name="+m.node.Name, "--kubeconfig="+m.kcfg[p],
			"--metrics-address="+policyMetrics, "--admin-socket="+m.policyAdmin, "--agent-socket=", "--relay-token-file="+m.relayToken)
		if err != nil {
			return 0, err
		}
		m.policy = cmd
		if err := m.waitHTTP(ctx, p, "http://"+policyMetrics+"/readyz", timeout); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	case procRelay:
		cmd, err := m.startCmd(p, filepath.Join(m.binDir, "flock-relay"), "--kubeconfig="+m.kcfg[p], "--listen="+relayListen,
			"--metrics-address="+relayMetrics, "--namespace=flock-system", "--name=scale-relay", "--advertise=https://"+relayListen)
		if err != nil {
			return 0, err
		}
		m.relay = cmd
		if err := m.waitHTTP(ctx, p, "http://"+relayMetrics+"/readyz", timeout); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	case procProxy:
		cmd, err := m.startCmd(p, m.kpBin,
			"--kubeconfig="+m.kcfg[p], "--hostname-override="+m.node.Name, "--proxy-mode=nftables",
			"--metrics-bind-address="+kubeProxyMetric, "--healthz-bind-address="+kubeProxyHealth,
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
			"--cluster-cidr=2001:db8:4000::/48,198.18.0.0/15", "--v=1")
		if err != nil {
			return 0, err
		}
		m.kproxy = cmd
		if err := m.waitHTTP(ctx, p, "http://"+kubeProxyHealth+"/healthz", timeout); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
	return 0, fmt.Errorf("no process %q", p)
}

func (m *measuredNode) startCmd(p, bin string, args ...string) (*exec.Cmd, error) {
	f, err := os.OpenFile(filepath.Join(m.dir, p+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := m.node.NS.InNS(cmd.Start); err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", p, m.node.NS.Name, err)
	}
	done := make(chan struct{})
	m.pdone[p] = done
	go func() { _ = cmd.Wait(); close(done) }()
	return cmd, nil
}

// stop ends process p (started here, by its PID) and waits for it.
func (m *measuredNode) stop(p string) {
	switch p {
	case procAgent:
		if m.node != nil && m.node.Agent != nil && m.node.Agent.Pid() > 0 {
			if err := m.node.Agent.Stop(); err != nil {
				logf("stop %s: %v", p, err)
			}
		}
		return
	case procPolicy, procProxy, procRelay:
		cmd := map[string]*exec.Cmd{procPolicy: m.policy, procProxy: m.kproxy, procRelay: m.relay}[p]
		if cmd == nil || cmd.Process == nil {
			return
		}
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-m.pdone[p]:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-m.pdone[p]
		}
		switch p {
		case procPolicy:
			m.policy = nil
		case procProxy:
			m.kproxy = nil
		case procRelay:
			m.relay = nil
		}
	}
}

// waitHTTP polls url (in the node namespace) until it answers 200.
func (m *measuredNode) waitHTTP(ctx context.Context, p, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		code, err := m.httpGet(url)
		if err == nil && code == http.StatusOK {
			return nil
		}
		select {
		case <-m.pdone[p]:
			return fmt.Errorf("%s exited before it was ready; log:\n%s", p, m.logTail(p, 30))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s (%s: %d %v); log:\n%s", p, timeout, url, code, err, m.logTail(p, 30))
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpGet makes a GET in the node namespace: the connection is made on a
// thread inside it.
func (m *measuredNode) httpGet(url string) (int, error) {
	code, _, err := m.httpGetBody(url)
	return code, err
}

// httpGetBody is httpGet with the body.
func (m *measuredNode) httpGetBody(url string) (int, []byte, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := m.node.NS.InNS(func() (err error) {
			c, err = (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}, DisableKeepAlives: true}
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (m *measuredNode) logTail(p string, n int) string {
	path := filepath.Join(m.dir, p+".log")
	if p == procAgent && m.node.Agent != nil {
		return tailLines(m.node.Agent.Log(), n)
	}
	b, _ := os.ReadFile(path)
	return tailLines(string(b), n)
}

func tailLines(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// verdictCounters reads flock-policy's counters of what went into the
// kernel (flock_policy_verdict_*: loads, patches, and what asked for
// loads, by cause), by series; nil if they cannot be read.
func (m *measuredNode) verdictCounters() map[string]float64 {
	code, body, err := m.httpGetBody("http://" + policyMetrics + "/metrics")
	if err != nil || code != http.StatusOK {
		return nil
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "flock_policy_verdict_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); i > 0 && err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// countersSince is what grew from was to now, in order of the series.
func countersSince(was, now map[string]float64) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(now)) {
		if d := now[k] - was[k]; d != 0 {
			out = append(out, fmt.Sprintf("%s %g", strings.TrimPrefix(k, "flock_policy_verdict_"), d))
		}
	}
	return strings.Join(out, ", ")
}
