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
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/deploy/release"
	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/check"
)

// Issue 31: flock upgraded from the previous release to this tree, and
// downgraded back, while traffic flows. The previous release is the one
// the file VERSION was last set to (release.PreviousRelease), built here
// from that commit's tree. Two nodes behind a BIRD ToR, kube-proxy
// (nftables): new connections all the time from the ToR to pods on both
// nodes and to an `addresses` IP, from pods on each node to pods on the
// other, and to a pod a NetworkPolicy guards, from a pod it allows and
// one it blocks. Through each rollout: no request fails, the ToR loses no
// prefix, no pod IP or AddressClaim changes, no node goes NotReady, no
// blocked connection gets through.
//
// The previous release (v0.20.0) has no Service addresses, so the
// LoadBalancer address (externalTrafficPolicy Local) is under load only
// where both ends have it: through a rollout of this tree once upgraded.
// Before the downgrade it is removed, as CHANGELOG's downgrade notes say.

const (
	upgradeAddr = "2001:db8:b::30" // srv-b's `addresses` IP
	// New connections per second: from the ToR, and from the pods of each
	// node to the other's. Together at least 50 per second, as issue 31
	// asks; each is a goroutine of this test entering a network namespace
	// (-race), on the 2 cores that run the whole lab.
	upgradeToRRate, upgradeNodeRate = 40, 20
	upgradeFloor                    = 50
)

// upgradePod is a pod pinned to node: a server on 8080 (flockctl's
// check probe from this tree's image: a Go server with the kernel's full
// listen backlog, where busybox httpd's backlog of 9 and a fork per
// connection dropped SYNs whenever a rollout took the CPU), or a client
// that sleeps (its marker makes its process findable on the host, whose
// /proc has every node's pods: the test dials from its netns).
func upgradePod(name, node, role, addresses string, marker int) string {
	ann := ""
	if addresses != "" {
		ann = fmt.Sprintf("\n  annotations: {flock.fritzlab.net/addresses: %q}", addresses)
	}
	image, cmd := "docker.io/local/busybox:1.35", fmt.Sprintf(`["sleep", "%d"]`, marker)
	if marker == 0 {
		image, cmd = k8sImage, `["/usr/local/bin/flockctl", "check-probe", "serve", "--port", "8080"]`
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
  labels: {role: %s}%s
spec:
  nodeName: %s
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: %s
`, name, role, ann, node, image, cmd)
}

const upgradeGuard = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: up-guard, namespace: default}
spec:
  podSelector: {matchLabels: {role: up-guarded}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: up-client}}}]
    ports: [{port: 8080, protocol: TCP}]
`

const upgradeLBPool = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: up-loadbalancers}
spec:
  cidrs: [2001:db8:1b::/120, 203.0.113.128/28]
  use: [loadBalancer]
  namespaces: [default]
`

// checkLBPool lets flockctl check have a LoadBalancer address (reached
// from a pod through kube-proxy).
const checkLBPool = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: flock-check-lb}
spec:
  cidrs: [2001:db8:1c::/120]
  use: [loadBalancer]
  namespaceSelector: {matchLabels: {flock.fritzlab.net/check: "true"}}
`

const upgradeLBService = `apiVersion: v1
kind: Service
metadata: {name: up-lb, namespace: default}
spec:
  type: LoadBalancer
  loadBalancerClass: flock.fritzlab.net/bgp
  externalTrafficPolicy: Local
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv6, IPv4]
  selector: {role: up-server}
  ports: [{name: http, port: 80, targetPort: 8080}]
`

// podNS is the network namespace of the process whose command line is
// "sleep <marker>": a pod's.
func podNS(t *testing.T, name string, marker int) *lab.NS {
	t.Helper()
	want := fmt.Sprintf("sleep\x00%d\x00", marker)
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "cmdline")); err == nil && string(b) == want {
			return &lab.NS{Name: name, Path: filepath.Join(d, "ns", "net")}
		}
	}
	t.Fatalf("no process of pod %s (sleep %d)", name, marker)
	return nil
}

// upGet opens a connection from ns to a server of upgradePod's and wants
// its greeting.
func upGet(ns *lab.NS, to netip.AddrPort, timeout time.Duration) error {
	return ns.InNS(func() error {
		// Dialled on this goroutine: the socket is made in ns.
		c, err := (&net.Dialer{Timeout: timeout}).Dial("tcp", to.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		b, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(string(b), check.Greeting) {
			return fmt.Errorf("answer %q", b)
		}
		return nil
	})
}

// flows opens new connections from one namespace at a steady rate, each
// to the next target in turn, each its own request (upGet), until end; a
// slow answer does not slow the rate.
type flows struct {
	name     string
	mu       sync.Mutex
	sent     int
	failures []failure
	started  time.Time
	took     time.Duration
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startFlows(name string, ns *lab.NS, perSecond int, timeout time.Duration, targets ...netip.AddrPort) *flows {
	f := &flows{name: name, stop: make(chan struct{}), started: time.Now()}
	f.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		inFlight := make(chan struct{}, 64)
		var reqs sync.WaitGroup
		defer reqs.Wait()
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
			select {
			case inFlight <- struct{}{}:
			default:
				continue // 64 in flight: the rate shows it
			}
			to := targets[i%len(targets)]
			reqs.Go(func() {
				defer func() { <-inFlight }()
				start := time.Now()
				err := upGet(ns, to, timeout)
				f.mu.Lock()
				defer f.mu.Unlock()
				f.sent++
				if err != nil {
					f.failures = append(f.failures, failure{to.Addr(), start, time.Now(), err})
				}
			})
		}
	})
	return f
}

// timeline is the failures per second since start ("+12s: 30"), for the
// log: when they came tells what caused them.
func (f *flows) timeline(start time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	per := map[int]int{}
	for _, x := range f.failures {
		per[int(x.start.Sub(start).Seconds())]++
	}
	var secs []int
	for s := range per {
		secs = append(secs, s)
	}
	slices.Sort(secs)
	var out []string
	for _, s := range secs {
		out = append(out, fmt.Sprintf("%+ds: %d", s, per[s]))
	}
	return strings.Join(out, ", ")
}

// end stops the flows; it returns how many were opened and which failed.
func (f *flows) end() (sent int, failures []failure) {
	close(f.stop)
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.took = time.Since(f.started)
	return f.sent, f.failures
}

func (f *flows) perSecond() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return float64(f.sent) / f.took.Seconds()
}

// listenDrops sums, over the network namespaces of the test's servers,
// the SYNs their listen queues dropped (TcpExt ListenDrops): connections
// the network delivered and a server starved of CPU did not take. The log
// tells those apart from the network's.
func listenDrops() (drops int) {
	seen := map[string]bool{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !strings.HasPrefix(string(b), "/usr/local/bin/flockctl\x00check-probe\x00serve\x00") {
			continue
		}
		ns, err := os.Readlink(filepath.Join(d, "ns", "net"))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		b, err = os.ReadFile(filepath.Join(d, "net", "netstat"))
		if err != nil {
			continue
		}
		// Two TcpExt lines: the names, then the values.
		var names []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "TcpExt:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			for i, n := range names {
				if n == "ListenDrops" && i < len(f) {
					var v int
					fmt.Sscan(f[i], &v)
					drops += v
				}
			}
		}
	}
	return drops
}

// sampleNodesReady samples every node's Ready condition every 250 ms; stop
// returns the samples that were not Ready ("node=status at time").
func sampleNodesReady(e *k8sEnv) (stop func() (samples int, notReady []string)) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu  sync.Mutex
		n   int
		bad []string
		wg  sync.WaitGroup
	)
	wg.Go(func() {
		for ctx.Err() == nil {
			out, err := e.c.Kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
			if err == nil {
				mu.Lock()
				n++
				for _, f := range strings.Fields(out) {
					if !strings.HasSuffix(f, "=True") {
						bad = append(bad, f+" at "+time.Now().Format("15:04:05.000"))
					}
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	return func() (int, []string) {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return n, bad
	}
}

// upgradeIdentity is what must not change through a rollout: every pod's
// IPs and every AddressClaim (its object, address, use and holder).
func upgradeIdentity(e *k8sEnv) string {
	e.t.Helper()
	pods := e.kubectl("get", "pods", "-n", "default", "-o", `jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.status.podIPs[*].ip}{"\n"}{end}`)
	claims := e.kubectl("get", "addressclaims", "-o", `jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.spec.ip} {.spec.use} {.spec.pod.namespace}/{.spec.pod.name} {.spec.service.namespace}/{.spec.service.name}{"\n"}{end}`)
	return "pods:\n" + pods + "claims:\n" + claims
}

// agentImages is the image each flock pod runs, per node.
func agentImages(e *k8sEnv) string {
	e.t.Helper()
	return e.kubectl("-n", "flock-system", "get", "pods", "-l", agentSelector, "-o", `jsonpath={range .items[*]}{.spec.nodeName}={.spec.containers[0].image} {end}`)
}

// buildRelease builds release v's image from commit's tree (git archive):
// what the previous release's users run. It returns the image tarball and
// the tree's deploy/.
func buildRelease(t *testing.T, root, dir, v, commit string) (image, deploy string) {
	t.Helper()
	tree := filepath.Join(dir, "release-"+v)
	if err := os.MkdirAll(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, tree)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("the tree of %s (%s): %v\n%s", v, commit, err, out)
	}
	t.Logf("building %s's image from %s", v, commit)
	image = filepath.Join(dir, "flock-image-"+v+".tar")
	build := exec.Command("go", "run", "./deploy/imagetar/mkimage", "-out", image)
	build.Dir = tree
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s's image: %v\n%s", v, err, out)
	}
	return image, filepath.Join(tree, "deploy")
}

func TestUpgrade(t *testing.T) {
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	head, err := release.ReadVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	prev, commit := release.PreviousRelease(root, head)
	if prev == "" {
		t.Fatalf("no release before %s in this clone's history (git log -- VERSION): an upgrade needs one to start from (a shallow clone has none)", head)
	}
	t.Logf("upgrade %s (%s) → %s (this tree) → %s", prev, commit, head, prev)
	var prevDeploy string
	l := upServicesLab(t, func(root, dir string) []string {
		img, deploy := buildRelease(t, root, dir, prev, commit)
		prevDeploy = deploy
		return []string{img}
	}, route{hostNS, netip.MustParsePrefix("2001:db8:b::/64"), torV6}, route{hostNS, netip.MustParsePrefix("2001:db8:c::/64"), torV6})
	e := l.e
	headDeploy := filepath.Join(root, "deploy")

	t.Logf("installing %s", prev)
	l.install(prevDeploy, k8sAddressesPool, checkPool)
	if imgs := agentImages(e); strings.Count(imgs, ":"+prev) != 2 {
		t.Fatalf("flock pods run %q, want %s on both nodes", imgs, prev)
	}

	const cliA, cliB, stranger = 360001, 360002, 360003
	e.apply(upgradePod("srv-a", k8sNode, "up-server", "", 0))
	e.apply(upgradePod("srv-b", node2, "up-server", upgradeAddr, 0))
	e.apply(upgradePod("guarded", node2, "up-guarded", "", 0))
	e.apply(upgradePod("cli-a", k8sNode, "up-client", "", cliA))
	e.apply(upgradePod("cli-b", node2, "up-client", "", cliB))
	e.apply(upgradePod("stranger", k8sNode, "up-stranger", "", stranger))
	e.apply(upgradeGuard)
	e.waitPods("the workload", "srv-a", "srv-b", "guarded", "cli-a", "cli-b", "stranger")
	at := func(ips []netip.Addr) (out []netip.AddrPort) {
		for _, ip := range ips {
			out = append(out, netip.AddrPortFrom(ip, 8080))
		}
		return out
	}
	addr := netip.MustParseAddr(upgradeAddr)
	srvA, srvB := at(e.podIPs("default", "srv-a")), at(e.podIPs("default", "srv-b"))
	guarded := at(e.podIPs("default", "guarded"))
	nsCliA, nsCliB, nsStranger := podNS(t, "cli-a", cliA), podNS(t, "cli-b", cliB), podNS(t, "stranger", stranger)
	fromToR := append(append(append([]netip.AddrPort{}, srvA...), srvB...), netip.AddrPortFrom(addr, 8080))
	aToB := append(append([]netip.AddrPort{}, srvB...), netip.AddrPortFrom(addr, 8080))
	// What the ToR must keep: each node's summaries and the `addresses` IP.
	watched := []netip.Prefix{k8sSummary6, k8sSummary4, node2Summary6, node2Summary4, netip.PrefixFrom(addr, 128)}
	for _, p := range watched {
		e.waitBird(p, 1)
	}
	reach := func(t *testing.T, from *lab.NS, to ...netip.AddrPort) {
		for _, ap := range to {
			testutil.EventuallyWithin(t, 60*time.Second, fmt.Sprintf("%s → %s", from.Name, ap), func() (bool, string) {
				err := upGet(from, ap, 2*time.Second)
				return err == nil, fmt.Sprint(err)
			})
		}
	}
	reach(t, l.tor, fromToR...)
	reach(t, nsCliA, aToB...)
	reach(t, nsCliB, srvA...)
	reach(t, nsCliA, guarded...)
	for _, ap := range guarded {
		if err := upGet(nsStranger, ap, 2*time.Second); err == nil {
			t.Fatalf("stranger → guarded %s answered: up-guard does not hold on %s", ap, prev)
		}
	}

	flockctlCheck(t, l.c, prev+" installed")

	// rollout changes flock's DaemonSet (change), waits for its rollout and
	// for both BGP sessions and agents, under the load; then checks.
	rollout := func(t *testing.T, what string, lb []netip.AddrPort, change func()) {
		e.t = t
		before := upgradeIdentity(e)
		dropsBefore := listenDrops()
		routes := watchRoutes(t, l.tor, watched)
		withdrawn := watchPrefixWithdrawals(e, watched)
		ready := sampleNodesReady(e)
		tor := append(append([]netip.AddrPort{}, fromToR...), lb...)
		main := []*flows{
			startFlows("ToR → pods on both nodes"+map[bool]string{true: " and the LoadBalancer address", false: ""}[len(lb) > 0], l.tor, upgradeToRRate, 2*time.Second, tor...),
			startFlows("pod on vm → pod on vm2", nsCliA, upgradeNodeRate, 2*time.Second, aToB...),
			startFlows("pod on vm2 → pod on vm", nsCliB, upgradeNodeRate, 2*time.Second, srvA...),
		}
		rateOf := map[*flows]int{main[0]: upgradeToRRate, main[1]: upgradeNodeRate, main[2]: upgradeNodeRate}
		allowed := startFlows("allowed pod → guarded pod", nsCliA, 5, time.Second, guarded...)
		blocked := startFlows("blocked pod → guarded pod", nsStranger, 5, time.Second, guarded...)
		time.Sleep(2 * time.Second)
		start := time.Now()
		change()
		waitRollout(t, l, 300*time.Second)
		took := time.Since(start)
		e.waitPods("flock on both nodes", "-n", "flock-system", "-l", agentSelector)
		testutil.EventuallyWithin(t, 60*time.Second, "both BGP sessions Established at the ToR", func() (bool, string) {
			out, _ := e.bird.Cmd("show protocols")
			up := 0
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) > 0 && (f[0] == "vm" || f[0] == "vm2") && strings.Contains(line, "Established") {
					up++
				}
			}
			return up == 2, out
		})
		// The restarted speakers' End-of-RIB and the ToR's stale paths
		// settle: a prefix the new agent failed to send would go now.
		time.Sleep(5 * time.Second)
		var failed []string
		rates := map[string]string{}
		sent, total := 0, 0.0
		for _, f := range main {
			n, fails := f.end()
			if len(fails) > 0 {
				t.Logf("%s: %s: failures per second from the change (it took %s): %s", what, f.name, took.Round(100*time.Millisecond), f.timeline(start))
			}
			sent += n
			for _, x := range fails {
				failed = append(failed, f.name+": "+x.String())
			}
			rates[f.name] = fmt.Sprintf("%.0f/s", f.perSecond())
			total += f.perSecond()
			// A loop that fell behind its rate had requests hanging.
			if r := f.perSecond(); r < 0.8*float64(rateOf[f]) {
				t.Errorf("%s: %s: %.1f new connections per second, want about %d", what, f.name, r, rateOf[f])
			}
		}
		if total < upgradeFloor {
			t.Errorf("%s: %.1f new connections per second in all, want ≥ %d", what, total, upgradeFloor)
		}
		triedA, refusedA := allowed.end()
		triedB, notB := blocked.end()
		letThrough := triedB - len(notB)
		routes.end()
		lost := withdrawn()
		samples, notReady := ready()
		deleted := routes.deletions()
		after := upgradeIdentity(e)
		drops := listenDrops() - dropsBefore
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d requests failed (the servers' listen queues dropped %d SYNs meanwhile); first: %s", what, len(failed), sent, drops, strings.Join(failed[:min(30, len(failed))], "; "))
			// What the agents and engines did meanwhile.
			for _, node := range []string{k8sNode, node2} {
				for _, c := range []string{"agent", "policy"} {
					pod := strings.TrimSpace(e.kubectl("-n", "flock-system", "get", "pods", "-l", agentSelector, "--field-selector", "spec.nodeName="+node, "-o", "jsonpath={.items[0].metadata.name}"))
					out, _ := l.c.Kubectl(t.Context(), "-n", "flock-system", "logs", pod, "-c", c, "--timestamps", "--tail=60")
					t.Logf("%s's %s (%s):\n%s", node, c, pod, out)
				}
			}
		}
		if lost != "" || len(deleted) > 0 {
			t.Errorf("%s: the ToR lost a prefix: BIRD %q; kernel deletions %v", what, lost, deleted)
		}
		if before != after {
			t.Errorf("%s: pod IPs or AddressClaims changed:\nbefore\n%s\nafter\n%s", what, before, after)
		}
		if len(notReady) > 0 {
			t.Errorf("%s: a node was not Ready in %d of %d samples: %v", what, len(notReady), samples, notReady[:min(5, len(notReady))])
		}
		if letThrough > 0 {
			t.Errorf("%s: %d of %d connections up-guard blocks were let through", what, letThrough, triedB)
		}
		if triedA-len(refusedA) == 0 || triedB == 0 {
			t.Errorf("%s: the NetworkPolicy loops did not run (allowed %d of %d, blocked tried %d)", what, triedA-len(refusedA), triedA, triedB)
		}
		t.Logf("%s: rollout %s; %d requests (%v), %d failed, servers' listen drops %d; allowed → guarded refused %d of %d; blocked let through %d of %d; ToR route changes %d (%s); node samples %d",
			what, took.Round(100*time.Millisecond), sent, rates, len(failed), drops, len(refusedA), triedA, letThrough, triedB, routes.count(), routes, samples)
		survived := "no request failed, no prefix lost, no pod IP or claim changed, no node NotReady, no blocked connection let through"
		if t.Failed() {
			survived = "NO"
		}
		figures := map[string]string{
			"rollout took":                     took.Round(100 * time.Millisecond).String(),
			"requests":                         fmt.Sprint(sent),
			"failed":                           fmt.Sprint(len(failed)),
			"prefixes lost at the ToR":         fmt.Sprint(len(deleted) + strings.Count(lost, " at ")),
			"node not Ready samples":           fmt.Sprint(len(notReady)),
			"blocked let through":              fmt.Sprintf("%d of %d", letThrough, triedB),
			"allowed to a guarded pod refused": fmt.Sprintf("%d of %d", len(refusedA), triedA),
		}
		for k, v := range rates {
			figures[k] = v
		}
		record(t, reliabilityRow{Section: "Upgrades", Fault: what, ToR: "BIRD; kube-proxy (nftables), containerd " + l.c.Opts.Release.Containerd,
			Done:  fmt.Sprintf("two nodes; new connections %d/s from the ToR to pods (and an `addresses` IP), %d/s from each node's pods to the other's; a NetworkPolicy; the DaemonSet rolls node by node", upgradeToRRate, upgradeNodeRate),
			Times: 1, Survived: survived, Figures: figures})
	}

	t.Run("upgrade "+prev+" → "+head+" under load", func(t *testing.T) {
		rollout(t, "upgrade "+prev+" → "+head, nil, func() { e.kubectl("apply", "-k", headDeploy) })
		if imgs := agentImages(e); strings.Count(imgs, ":"+head) != 2 {
			t.Errorf("after the upgrade flock pods run %q, want %s on both nodes", imgs, head)
		}
		flockctlCheck(t, l.c, "upgraded to "+head)
		// The store says which release wrote it last.
		if b, err := os.ReadFile("/var/lib/flock/format.json"); err != nil || !strings.Contains(string(b), head) {
			t.Errorf("the store's format after the upgrade: %q, %v; want release %s", b, err, head)
		}
	})

	var lb []netip.AddrPort
	t.Run("a LoadBalancer address (externalTrafficPolicy Local) through a rollout of "+head, func(t *testing.T) {
		// In 1 of ~50 LoadBalancer rollouts (about 165,000 connections)
		// one new connection met "no route to host". What was caught:
		// a node advertised the address before its kube-proxy had
		// programmed it, and the SYN it drew left by the node's default
		// route. So the first connections after both nodes advertise
		// must all succeed (the agent waits for kube-proxy's rules).
		e.t = t
		e.apply(upgradeLBPool)
		e.apply(upgradeLBService)
		testutil.EventuallyWithin(t, 60*time.Second, "up-lb's addresses", func() (bool, string) {
			out, _ := l.c.Kubectl(t.Context(), "get", "service", "up-lb", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}")
			lb = nil
			for _, f := range strings.Fields(out) {
				if a, err := netip.ParseAddr(f); err == nil {
					lb = append(lb, netip.AddrPortFrom(a, 80))
				}
			}
			return len(lb) == 2, out
		})
		for _, ap := range lb {
			watched = append(watched, netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen()))
			e.waitBird(netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen()), 2) // a server on each node
			// Once the ToR has both paths, both deliver: new
			// connections (new source ports, spread over the paths) all
			// succeed at the first try. Before the agent waited for
			// kube-proxy's rules, the first ones here could fail.
			for i := range 40 {
				if err := upGet(l.tor, ap, 2*time.Second); err != nil {
					t.Errorf("ToR → %s, connection %d right after both nodes advertised it: %v", ap, i, err)
				}
			}
		}
		stop := lbDebug(t, l.tor, l.vm2, []string{l.c.KubectlPath(), "--kubeconfig", l.c.Kubeconfig})
		for i := 0; i < lbRepeat(); i++ {
			rollout(t, "rollout of "+head+" (kubectl rollout restart) with a LoadBalancer address", lb, func() {
				e.kubectl("-n", "flock-system", "rollout", "restart", "daemonset/flock")
			})
		}
		stop()
		e.apply(checkLBPool)
		flockctlCheck(t, l.c, "after a rollout of "+head)
		e.kubectl("delete", "addresspool", "flock-check-lb", "--wait=true")
	})

	t.Run("downgrade "+head+" → "+prev+" under load", func(t *testing.T) {
		e.t = t
		// CHANGELOG: before a downgrade, Service addresses and their pools
		// go (the previous release's CRDs do not know them).
		e.kubectl("delete", "service", "up-lb", "--ignore-not-found", "--wait=true")
		testutil.EventuallyWithin(t, 60*time.Second, "up-lb's AddressClaims gone", func() (bool, string) {
			out := e.kubectl("get", "addressclaims", "-o", `jsonpath={range .items[*]}{.spec.use} {end}`)
			return !strings.Contains(out, "loadBalancer"), out
		})
		e.kubectl("delete", "addresspool", "up-loadbalancers", "--ignore-not-found", "--wait=true")
		watched = slices.DeleteFunc(watched, func(p netip.Prefix) bool {
			return slices.ContainsFunc(lb, func(ap netip.AddrPort) bool { return p.Addr() == ap.Addr() })
		})
		rollout(t, "downgrade "+head+" → "+prev, nil, func() { e.kubectl("apply", "-k", prevDeploy) })
		if imgs := agentImages(e); strings.Count(imgs, ":"+prev) != 2 {
			t.Errorf("after the downgrade flock pods run %q, want %s on both nodes", imgs, prev)
		}
		flockctlCheck(t, l.c, "downgraded to "+prev)
	})
}

// waitRollout waits for flock's DaemonSet to roll out; if it does not,
// it logs what each flock pod, its containers and the kubelets said.
func waitRollout(t *testing.T, l *servicesLab, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout+30*time.Second)
	defer cancel()
	out, err := l.c.Kubectl(ctx, "-n", "flock-system", "rollout", "status", "daemonset/flock", fmt.Sprintf("--timeout=%s", timeout))
	if err == nil {
		return
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	pods, _ := l.c.Kubectl(dctx, "-n", "flock-system", "get", "pods", "-o", "wide")
	events, _ := l.c.Kubectl(dctx, "-n", "flock-system", "get", "events", "--sort-by=.lastTimestamp")
	t.Logf("flock pods:\n%s\nevents:\n%s", pods, events)
	names, _ := l.c.Kubectl(dctx, "-n", "flock-system", "get", "pods", "-o", "jsonpath={.items[*].metadata.name}")
	for _, pod := range strings.Fields(names) {
		desc, _ := l.c.Kubectl(dctx, "-n", "flock-system", "describe", "pod", pod)
		t.Logf("%s:\n%s", pod, desc)
		for _, c := range []string{"agent", "policy"} {
			log, _ := l.c.Kubectl(dctx, "-n", "flock-system", "logs", pod, "-c", c, "--timestamps", "--tail=80")
			t.Logf("%s %s log:\n%s", pod, c, log)
		}
	}
	t.Logf("vm kubelet:\n%s", l.c.LogTail(k8slab.Kubelet, 60))
	if l.n2 != nil {
		t.Logf("vm2 kubelet:\n%s", l.n2.LogTail(k8slab.Kubelet, 60))
	}
	t.Fatalf("flock's DaemonSet did not roll out in %s: %v\n%s", timeout, err, out)
}
