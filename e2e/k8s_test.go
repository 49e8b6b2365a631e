package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// The Kubernetes end-to-end test: a real single-node cluster (etcd,
// kube-apiserver, controller-manager, scheduler, kubelet, containerd, runc)
// on this machine, flock installed with `kubectl apply -k deploy/` from an
// image built offline, and a BIRD ToR in a network namespace joined to the
// host by a veth. The node is the host itself, as on a real cluster.

const (
	k8sNode    = "vm"
	hostTorIf  = "flktor0"
	busybox    = "docker.io/local/busybox:1.35"
	anycast6   = "2001:db8:a::1"
	anycast4   = "203.0.113.1"
	cniBinDir  = "/opt/cni/bin"
	cniConfDir = "/etc/cni/net.d"
)

// k8sImage is the image deploy/ installs: its tag is the file VERSION.
var k8sImage = func() string {
	b, err := os.ReadFile("../VERSION")
	if err != nil {
		panic(err)
	}
	return "docker.io/fritzlab/flock:" + strings.TrimSpace(string(b))
}()

var (
	k8sSummary6 = netip.MustParsePrefix("fd00:10:99::/64")
	k8sSummary4 = netip.MustParsePrefix("198.51.100.0/25")
	hostV6      = netip.MustParseAddr("fd00:0:99::1")
	torV6       = netip.MustParseAddr("fd00:0:99::2")
	hostV4      = netip.MustParseAddr("192.0.2.101")
	torV4       = netip.MustParseAddr("192.0.2.102")
)

const k8sNodeConfig = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: vm
spec:
  asn: 64512
  routerID: 192.0.2.2
  defaults:
    ipv4: true
  pools:
  - cidr: fd00:10:99::/64
  - cidr: 198.51.100.0/25
  bgp:
    listenPort: -1
    peers:
    - address: fd00:0:99::2
      asn: 64513
      localAddress: fd00:0:99::1
      timers: {holdTime: 9, keepaliveTime: 3, connectRetry: 1}
`

const k8sBird = `log "%s/bird.log" all;
router id 10.255.0.1;
protocol device { scan time 2; }
protocol kernel k4 { ipv4 { import none; export where source = RTS_BGP; }; merge paths on; }
protocol kernel k6 { ipv6 { import none; export where source = RTS_BGP; }; merge paths on; }
protocol bgp vm {
  local fd00:0:99::2 as 64513;
  neighbor fd00:0:99::1 as 64512;
  hold time 9; keepalive time 3; connect retry time 1;
  ipv6 { import all; export none; };
  ipv4 { import filter { flock_drain(); accept; }; export none; extended next hop on; };
}
`

const workloads = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
      - name: bb
        image: docker.io/local/busybox:1.35
        imagePullPolicy: Never
        command: ["sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata:
  name: solo
  namespace: default
  annotations:
    flock.fritzlab.net/addresses: "2001:db8:b::10"
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: docker.io/local/busybox:1.35
    imagePullPolicy: Never
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata:
  name: any
  namespace: default
  annotations:
    flock.fritzlab.net/anycast: "2001:db8:a::1,203.0.113.1"
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: docker.io/local/busybox:1.35
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    readinessProbe:
      exec: {command: ["test", "-f", "/tmp/ready"]}
      periodSeconds: 1
      failureThreshold: 1
      successThreshold: 1
---
apiVersion: v1
kind: Pod
metadata: {name: hp, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: docker.io/local/busybox:1.35
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo flock-hostport | nc -l -p 8080; done"]
    ports: [{containerPort: 8080, hostPort: 18080, protocol: TCP}]
`

type k8sEnv struct {
	t    *testing.T
	c    *k8slab.Cluster
	tor  *lab.NS
	bird *lab.Bird
}

func (e *k8sEnv) kubectl(args ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := e.c.Kubectl(ctx, args...)
	if err != nil {
		e.t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// apply applies YAML, retrying while a just-created CRD is not served yet.
func (e *k8sEnv) apply(yaml string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		out, err := e.c.KubectlStdin(ctx, yaml, "apply", "-f", "-")
		if err == nil {
			return
		}
		if !strings.Contains(out, "no matches for kind") && !strings.Contains(out, "ensure CRDs are installed") || ctx.Err() != nil {
			e.t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		time.Sleep(time.Second)
	}
}

// podIPs is status.podIPs in order.
func (e *k8sEnv) podIPs(ns, name string) []netip.Addr {
	e.t.Helper()
	out := e.kubectl("-n", ns, "get", "pod", name, "-o", "jsonpath={.status.podIPs[*].ip}")
	var ips []netip.Addr
	for _, f := range strings.Fields(out) {
		ips = append(ips, netip.MustParseAddr(f))
	}
	return ips
}

func (e *k8sEnv) waitPods(what string, selector ...string) {
	e.t.Helper()
	args := append([]string{"wait", "--for=condition=Ready", "--timeout=180s", "pod"}, selector...)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if out, err := e.c.Kubectl(ctx, args...); err != nil {
		pods, _ := e.c.Kubectl(ctx, "get", "pods", "-A", "-o", "wide")
		ev, _ := e.c.Kubectl(ctx, "get", "events", "-A", "--sort-by=.lastTimestamp")
		e.t.Fatalf("%s not Ready: %v\n%s\n%s\n%s\nkubelet:\n%s", what, err, out, pods, tail(ev, 40), e.c.LogTail("kubelet", 12))
	}
}

func (e *k8sEnv) birdPaths(p netip.Prefix) int {
	out, err := e.bird.Cmd("show route " + p.String() + " all")
	if err != nil && !strings.Contains(out, "Network not found") {
		e.t.Fatal(err)
	}
	return strings.Count(out, "BGP.as_path")
}

func (e *k8sEnv) waitBird(p netip.Prefix, want int) {
	e.t.Helper()
	testutil.EventuallyWithin(e.t, 30*time.Second, fmt.Sprintf("the ToR to hold %d path(s) for %s", want, p), func() (bool, string) {
		n := e.birdPaths(p)
		return n == want, fmt.Sprintf("%d paths", n)
	})
}

// hostFlockctl runs flockctl against the agent's admin socket on the host
// (works while kubelet is down, when kubectl exec does not).
func hostFlockctl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "flockctl"), append([]string{"--socket", "/run/flock/admin.sock"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("flockctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func hostPods(t *testing.T) []struct{ Namespace, Name, ContainerID string } {
	var out []struct{ Namespace, Name, ContainerID string }
	if err := json.Unmarshal([]byte(hostFlockctl(t, "-o", "json", "pods")), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func hostVeths(t *testing.T) []string {
	links, err := netlink.LinkList()
	for i := 0; errors.Is(err, netlink.ErrDumpInterrupted) && i < 200; i++ {
		time.Sleep(5 * time.Millisecond) // pods came or went during the dump
		links, err = netlink.LinkList()
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, dataplane.VethPrefix) && l.Type() == "veth" {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

func dirEntries(dir string) map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		out[e.Name()] = true
	}
	return out
}

// TestKubernetes is flock as a real Kubernetes CNI, end to end.
func TestKubernetes(t *testing.T) {
	ctx := context.Background()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prepareK8sHost(t)

	imageTar := buildFlockImage(t, root, dir)

	t.Log("bringing up the cluster (a cold build of Kubernetes takes minutes)")
	c, err := k8slab.Up(ctx, k8slab.Options{Dir: filepath.Join(dir, "k8s"), NodeName: k8sNode,
		// IPv6-primary dual-stack node: kubelet orders status.podIPs by the
		// node's primary family.
		NodeIP: hostV6.String() + ",192.0.2.2", CNIBinDir: cniBinDir, CNIConfDir: cniConfDir, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	e := &k8sEnv{t: t, c: c}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("FLOCK_E2E_LOGS") != "" {
			out, _ := c.Kubectl(context.Background(), "-n", "flock-system", "logs", "ds/flock", "-c", "agent", "--tail=60")
			t.Logf("agent log:\n%s", out)
			t.Logf("kubelet log:\n%s", c.LogTail("kubelet", 20))
			// Last, where a truncated CI log still shows them: what failed.
			t.Logf("kubelet errors:\n%s", c.LogErrors("kubelet", 15))
			t.Logf("containerd errors:\n%s", c.LogErrors("containerd", 10))
			out, _ = c.Kubectl(context.Background(), "-n", "flock-system", "logs", "ds/flock", "-c", "policy", "--tail=25")
			t.Logf("policy log:\n%s", out)
		}
		// Workloads first (so their DELs reach a running agent), then flock.
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, _ = c.Kubectl(dctx, "delete", "deployment,pod", "--all", "-n", "default", "--wait=true", "--timeout=90s")
		_, _ = c.Kubectl(dctx, "delete", "-k", filepath.Join(root, "deploy"), "--wait=true", "--timeout=60s")
		if err := c.Down(); err != nil {
			t.Errorf("cluster teardown: %v", err)
		}
	})
	if err := c.ImportImage(ctx, imageTar); err != nil {
		t.Fatal(err)
	}

	// The ToR.
	tor := newNS(t, "k8stor-")
	e.tor = tor
	self := &lab.NS{Name: "host", Path: "/proc/self/ns/net"}
	wireLink(t, self, hostTorIf, tor, "to-host", []netip.Prefix{netip.PrefixFrom(hostV6, 64), netip.PrefixFrom(hostV4, 30)},
		[]netip.Prefix{netip.PrefixFrom(torV6, 64), netip.PrefixFrom(torV4, 30)})
	forwarding(t, tor)
	e.startBird(dir, k8sBird)

	t.Log("installing flock: kubectl apply -k deploy/")
	e.kubectl("apply", "-k", filepath.Join(root, "deploy"))
	// Short leak-GC grace for the test (the default is minutes). The
	// installer runs as shipped: it picks the conflist's cniVersion from
	// the chained plugins.
	e.kubectl("-n", "flock-system", "patch", "daemonset", "flock", "--type=json", "-p",
		`[{"op":"add","path":"/spec/template/spec/containers/0/command/-","value":"--leak-gc-grace=5s"}]`)
	e.apply(k8sNodeConfig)
	e.apply(k8sAnycastPool)
	// The patch rolls the DaemonSet when its first pod came before it
	// (CI saw it): wait for the rollout, not for pods by label, which
	// would wait on the replaced pod until the timeout.
	if out, err := c.Kubectl(ctx, "-n", "flock-system", "rollout", "status", "daemonset/flock", "--timeout=180s"); err != nil {
		t.Logf("rollout status: %v\n%s", err, out)
		e.waitPods("the flock agent", "-n", "flock-system", "-l", "app.kubernetes.io/name=flock") // its diagnostics
		t.Fatal("the flock DaemonSet did not roll out")
	}
	if err := c.WaitNodeReady(ctx); err != nil {
		t.Fatalf("node not Ready with flock's CNI config: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cniConfDir, "01-flock.conflist")); err != nil {
		t.Fatalf("flock-installer did not write the conflist: %v", err)
	}
	// The installer staged the conflist and the agent published it once
	// it served: the runtime never saw a conflist whose agent could not
	// answer.
	if rep := installerReport(t); !strings.Contains(rep, `"conflist": "staged"`) || !strings.Contains(rep, `"staged": "/run/flock/01-flock.conflist"`) {
		t.Errorf("the installer did not stage the conflist: %s", rep)
	}
	if staged, err := os.ReadFile("/run/flock/01-flock.conflist"); err != nil {
		t.Errorf("the staged conflist: %v", err)
	} else if in, err := os.ReadFile(filepath.Join(cniConfDir, "01-flock.conflist")); err != nil || string(in) != string(staged) {
		t.Errorf("the conflist in %s differs from the staged one (%v)", cniConfDir, err)
	}
	if logs := e.kubectl("-n", "flock-system", "logs", "ds/flock", "-c", "agent"); !strings.Contains(logs, "the CNI conflist is published") {
		t.Errorf("the agent's log does not say it published the conflist:\n%s", tail(logs, 30))
	}

	t.Run("agent and BGP", func(t *testing.T) {
		e.t = t
		testutil.EventuallyWithin(t, 60*time.Second, "flockctl in the agent pod to show the ToR Established", func() (bool, string) {
			out, err := c.Kubectl(ctx, "-n", "flock-system", "exec", "ds/flock", "-c", "agent", "--", "flockctl", "bgp", "neighbors")
			return err == nil && strings.Contains(out, "Established") && strings.Contains(out, torV6.String()), out
		})
		e.waitBird(k8sSummary6, 1)
		e.waitBird(k8sSummary4, 1)
		testutil.EventuallyWithin(t, 30*time.Second, "NodeConfig status to show the peer", func() (bool, string) {
			out, _ := c.Kubectl(ctx, "get", "nodeconfigs", k8sNode)
			return strings.Contains(out, "1/1"), out
		})
	})

	t.Run("workloads get flock addresses", func(t *testing.T) {
		e.t = t
		e.apply(workloads)
		e.waitPods("web", "-l", "app=web")
		// solo's `addresses` IP needs an AddressPool that comes later.
		testPodWaitsForAddressPool(t, e)
		var all [][]netip.Addr
		// An `addresses` IP is in the CNI result after the pod IPs, but the
		// API allows one pod IP per family, so kubelet keeps it out of
		// status.podIPs: check it is bound, advertised and reachable.
		addr := netip.MustParseAddr("2001:db8:b::10")
		if ips := e.podIPs("default", "solo"); slices.Contains(ips, addr) || len(ips) != 2 {
			t.Errorf("solo: status.podIPs %v", ips)
		}
		if out := e.kubectl("exec", "solo", "--", "ip", "-6", "addr", "show", "dev", "eth0"); !strings.Contains(out, addr.String()) {
			t.Errorf("%s not on solo's eth0:\n%s", addr, out)
		}
		e.waitBird(netip.PrefixFrom(addr, 128), 1)
		ping(t, tor, addr)
		for _, name := range append(podNames(e, "app=web"), "solo") {
			ips := e.podIPs("default", name)
			if len(ips) != 2 || !k8sSummary6.Contains(ips[0]) || !k8sSummary4.Contains(ips[1]) {
				t.Fatalf("pod %s: status.podIPs %v, want [IPv6 in %s, IPv4 in %s]", name, ips, k8sSummary6, k8sSummary4)
			}
			all = append(all, ips)
			for _, ip := range ips {
				ping(t, tor, ip)
			}
		}
		// Pod to pod, inside the cluster, in both families.
		web := podNames(e, "app=web")
		for _, ip := range all[len(all)-1] {
			if out, err := c.Kubectl(ctx, "exec", web[0], "--", "ping", "-c", "1", "-W", "3", ip.String()); err != nil {
				t.Errorf("kubectl exec %s ping %s: %v\n%s", web[0], ip, err, out)
			}
		}
		// Replicas of one Deployment share the app identity; distinct IPs.
		seen := map[netip.Addr]bool{}
		for _, ips := range all {
			if seen[ips[0]] {
				t.Errorf("duplicate address %s", ips[0])
			}
			seen[ips[0]] = true
		}
	})

	t.Run("anycast follows readiness", func(t *testing.T) {
		e.t = t
		a6, a4 := netip.MustParsePrefix(anycast6+"/128"), netip.MustParsePrefix(anycast4+"/32")
		testutil.EventuallyWithin(t, 60*time.Second, "pod any Running", func() (bool, string) {
			out, _ := c.Kubectl(ctx, "get", "pod", "any", "-o", "jsonpath={.status.phase}")
			return out == "Running", out
		})
		if n := e.birdPaths(a6); n != 0 {
			t.Fatalf("anycast advertised while the pod is not Ready (%d paths)", n)
		}
		e.kubectl("exec", "any", "--", "touch", "/tmp/ready")
		e.waitBird(a6, 1)
		e.waitBird(a4, 1)
		ping(t, tor, a6.Addr())
		ping(t, tor, a4.Addr())
		e.kubectl("exec", "any", "--", "rm", "/tmp/ready")
		e.waitBird(a6, 0)
		e.waitBird(a4, 0)
		e.kubectl("exec", "any", "--", "touch", "/tmp/ready")
		e.waitBird(a6, 1)
		e.kubectl("delete", "pod", "any", "--wait=true")
		e.waitBird(a6, 0)
		e.waitBird(a4, 0)
	})

	// NetworkPolicy on what the upstream suite cannot see (issue 19).
	t.Run("NetworkPolicy covers anycast and addresses IPs", func(t *testing.T) { testNetworkPolicyExtraIPs(t, e) })
	t.Run("AdminNetworkPolicy and BaselineAdminNetworkPolicy", func(t *testing.T) { e.t = t; testAdminNetworkPolicy(t, e) })

	t.Run("Service addresses follow their endpoints", func(t *testing.T) { testServices(t, e) })

	t.Run("hostPort through the chained portmap plugin", func(t *testing.T) {
		e.t = t
		e.waitPods("hp", "hp")
		dialHostPort(t, e, 18080)
	})

	t.Run("two nodes claim from one cluster-wide pool", func(t *testing.T) { testTwoNodesClaim(t, e) })

	// The node's Ready condition through what a node lives through (issue
	// 23): containerd 2 asks every chained plugin for CNI STATUS.
	t.Run("installer on current chained plugins", func(t *testing.T) { e.t = t; testInstallerCurrentPlugins(t, e) })
	t.Run("a planned agent restart keeps the node Ready", func(t *testing.T) { e.t = t; testPlannedRestartKeepsReady(t, e) })
	t.Run("an agent crash, measured", func(t *testing.T) { e.t = t; testCrashMeasured(t, e) })
	t.Run("an agent kept away, with the marker and without", func(t *testing.T) { e.t = t; testAgentAway(t, e) })
	t.Run("installer on old chained plugins", func(t *testing.T) { e.t = t; testOldChainedPlugins(t, e, c.PluginsDir) })

	t.Run("deleting pods leaves nothing behind", func(t *testing.T) {
		e.t = t
		e.kubectl("delete", "deployment", "web", "--wait=true")
		e.kubectl("delete", "pod", "solo", "hp", "--wait=true")
		testutil.EventuallyWithin(t, 60*time.Second, "every allocation and veth to be gone", func() (bool, string) {
			p, v := hostPods(t), hostVeths(t)
			return len(p) == 0 && len(v) == 0, fmt.Sprintf("pods %v veths %v", p, v)
		})
		var pools []struct {
			CIDR string `json:"cidr"`
			Used uint64 `json:"used"`
		}
		if err := json.Unmarshal([]byte(hostFlockctl(t, "-o", "json", "ipam")), &pools); err != nil {
			t.Fatal(err)
		}
		for _, p := range pools {
			if p.Used != 0 {
				t.Errorf("pool %s: %d addresses still in use", p.CIDR, p.Used)
			}
		}
	})

	t.Run("leak GC releases a pod deleted while kubelet was down", func(t *testing.T) {
		e.t = t
		e.apply(sleepPod("leaky"))
		e.waitPods("leaky", "leaky")
		if p := hostPods(t); len(p) != 1 || p[0].Name != "leaky" {
			t.Fatalf("allocations: %+v", p)
		}
		if err := c.StopKubelet(); err != nil {
			t.Fatal(err)
		}
		e.kubectl("delete", "pod", "leaky", "--grace-period=0", "--force", "--wait=false")
		testutil.EventuallyWithin(t, 60*time.Second, "the leak GC to release leaky", func() (bool, string) {
			p := hostPods(t)
			return len(p) == 0, fmt.Sprintf("%+v", p)
		})
		if err := c.StartKubelet(); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitNodeReady(ctx); err != nil {
			t.Fatal(err)
		}
		m := scrapeHost(t)
		if !strings.Contains(m, "flock_leaked_allocations_collected_total 1") {
			t.Errorf("leak metric not 1:\n%s", grepLines(m, "flock_leaked"))
		}
		testutil.EventuallyWithin(t, 60*time.Second, "the leaked veth to go once kubelet cleans up the sandbox", func() (bool, string) {
			v := hostVeths(t)
			return len(v) == 0, fmt.Sprint(v)
		})
	})

	t.Run("DEL after a node reboot", func(t *testing.T) { e.t = t; testReboot(t, e) })
}

// wireLink joins a and b with a veth (aIf, bIf) and gives each end its
// addresses.
func wireLink(t *testing.T, a *lab.NS, aIf string, b *lab.NS, bIf string, aAddrs, bAddrs []netip.Prefix) {
	t.Helper()
	if err := lab.Connect(a, aIf, b, bIf); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		ns    *lab.NS
		If    string
		addrs []netip.Prefix
	}{{a, aIf, aAddrs}, {b, bIf, bAddrs}} {
		for _, p := range x.addrs {
			if err := x.ns.AddrAdd(x.If, p); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// forwarding makes the namespaces route, both families.
func forwarding(t *testing.T, nss ...*lab.NS) {
	t.Helper()
	for _, ns := range nss {
		for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
			if err := ns.Sysctl(k, "1"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// startBird starts the ToR's BIRD under dir/tor with conf (a format that
// takes that directory, for its log).
func (e *k8sEnv) startBird(dir, conf string) {
	e.t.Helper()
	birdDir := filepath.Join(dir, "tor")
	if err := os.MkdirAll(birdDir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	bird, err := lab.StartBird(e.tor, birdDir, shippedBirdDrain(e.t)+fmt.Sprintf(conf, birdDir))
	if err != nil {
		e.t.Fatal(err)
	}
	e.bird = bird
	e.t.Cleanup(bird.Stop)
}

// shippedBirdDrain is deploy/tor/bird.conf's function flock_drain (the
// GRACEFUL_SHUTDOWN import policy), as shipped, for the lab's ToR.
func shippedBirdDrain(t *testing.T) string {
	t.Helper()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "tor", "bird.conf"))
	if err != nil {
		t.Fatal(err)
	}
	_, fn, ok := strings.Cut(string(b), "\nfunction flock_drain()")
	end := strings.Index(fn, "\n}\n")
	if !ok || end < 0 {
		t.Fatal("deploy/tor/bird.conf has no function flock_drain()")
	}
	return "function flock_drain()" + fn[:end+3]
}

func podNames(e *k8sEnv, selector string) []string {
	out := e.kubectl("get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}")
	names := strings.Fields(out)
	slices.Sort(names)
	return names
}

// scrapeHost reads the agent's metrics on the host's loopback.
func scrapeHost(t *testing.T) string { return metricsGet(t, nil, "/metrics") }

// sharedNetnsDir makes /run/netns a shared mount point unless it already
// is one; the returned func undoes what it did.
func sharedNetnsDir() (func(), error) {
	const dir = "/run/netns"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 6 && f[4] == dir && strings.Contains(line, "shared:") {
			return func() {}, nil
		}
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return nil, fmt.Errorf("make %s shared: %w", dir, err)
	}
	return func() { _ = unix.Unmount(dir, unix.MNT_DETACH) }, nil
}

// prepareK8sHost readies the host for a lab cluster with flock installed
// from deploy/ (a shared /run/netns) and registers the cleanup that puts
// it back: what the installer and the agent left in the CNI dirs, /run/flock
// and /var/lib/flock, the agent's routes, leftover veths and the ToR link.
func prepareK8sHost(t *testing.T) {
	binBefore, confBefore := dirEntries(cniBinDir), dirEntries(cniConfDir)
	_, optCNIExisted := os.Stat("/opt/cni")
	_, etcCNIExisted := os.Stat("/etc/cni")
	_, runFlockExisted := os.Stat("/run/flock")
	_, libFlockExisted := os.Stat("/var/lib/flock")

	// Host restoration is registered first, so it runs last.
	t.Cleanup(func() {
		for n := range dirEntries(cniBinDir) {
			if !binBefore[n] {
				_ = os.Remove(filepath.Join(cniBinDir, n))
			}
		}
		for n := range dirEntries(cniConfDir) {
			if !confBefore[n] {
				_ = os.Remove(filepath.Join(cniConfDir, n))
			}
		}
		// Directories the test created go too (only if empty: never
		// anything that was there before).
		for _, d := range []struct {
			err  error
			dirs []string
		}{{optCNIExisted, []string{cniBinDir, "/opt/cni"}}, {etcCNIExisted, []string{cniConfDir, "/etc/cni"}}} {
			if os.IsNotExist(d.err) {
				for _, dir := range d.dirs {
					_ = os.Remove(dir)
				}
			}
		}
		if os.IsNotExist(runFlockExisted) {
			_ = os.RemoveAll("/run/flock")
		}
		if os.IsNotExist(libFlockExisted) {
			_ = os.RemoveAll("/var/lib/flock")
		}
		// The agent's blackholes and any veth a failed run left.
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, _ := netlink.RouteListFiltered(fam, &netlink.Route{Protocol: dataplane.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
			for _, r := range rs {
				_ = netlink.RouteDel(&r)
			}
		}
		for _, v := range hostVeths(t) {
			if l, err := netlink.LinkByName(v); err == nil {
				_ = netlink.LinkDel(l)
			}
		}
		if l, err := netlink.LinkByName(hostTorIf); err == nil {
			_ = netlink.LinkDel(l)
		}
	})

	// The agent sees the pod netns the runtime creates after it started
	// through a HostToContainer mount of /var/run/netns, which needs a
	// shared mount there. systemd hosts have / shared; this VM does not, so
	// make /run/netns a shared mount point of its own, as iproute2 does.
	if unmount, err := sharedNetnsDir(); err != nil {
		t.Fatal(err)
	} else {
		t.Cleanup(unmount)
	}

}

// buildFlockImage builds flock's image offline into dir and returns the
// docker-archive's path.
func buildFlockImage(t *testing.T, root, dir string) string {
	t.Log("building the flock image offline")
	imageTar := filepath.Join(dir, "flock-image.tar")
	build := exec.Command("go", "run", "./deploy/imagetar/mkimage", "-tag", k8sImage, "-out", imageTar)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	return imageTar
}
