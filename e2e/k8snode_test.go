package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// The node's Ready condition through what a node lives through: the
// installer on old and current chained plugins, a planned agent restart,
// an agent crash, and a reboot — with containerd 2 asking every plugin of
// the chain for CNI STATUS when the conflist says 1.1.0.

const (
	conflistPath  = cniConfDir + "/01-flock.conflist"
	installerJSON = "/run/flock/installer.json"
	restartMarker = "/run/flock/cni.sock.restarting"
	agentSelector = "app.kubernetes.io/name=flock"
)

// readySample is the node's Ready condition at one moment, with whether
// the planned-restart marker was there.
type readySample struct {
	at     time.Time
	status string // True, False, Unknown
	marker bool
}

// sampleReady records the node's Ready condition every 250 ms until stop
// is called, which returns the samples.
func sampleReady(t *testing.T, e *k8sEnv) (stop func() []readySample) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu      sync.Mutex
		samples []readySample
		wg      sync.WaitGroup
	)
	wg.Go(func() {
		for ctx.Err() == nil {
			out, err := e.c.Kubectl(ctx, "get", "node", k8sNode, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			_, merr := os.Stat(restartMarker)
			if err == nil {
				mu.Lock()
				samples = append(samples, readySample{at: time.Now(), status: strings.TrimSpace(out), marker: merr == nil})
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	return func() []readySample {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return samples
	}
}

// notReady sums the time the samples saw the node not Ready, and counts
// the samples that saw the marker.
func notReady(samples []readySample) (down time.Duration, downSamples, markerSamples int) {
	for i, s := range samples {
		if s.marker {
			markerSamples++
		}
		if s.status == "True" {
			continue
		}
		downSamples++
		if i+1 < len(samples) {
			down += samples[i+1].at.Sub(s.at)
		}
	}
	return down, downSamples, markerSamples
}

// conflistVersion is the cniVersion of the conflist the installer wrote.
func conflistVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(conflistPath)
	if err != nil {
		t.Fatalf("the installer's conflist: %v", err)
	}
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", conflistPath, err)
	}
	return c.CNIVersion
}

// installerReport is what the installer wrote next to the agent socket.
func installerReport(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(installerJSON)
	if err != nil {
		t.Fatalf("installer report: %v", err)
	}
	return string(b)
}

// restartAgent rolls the agent out again (as an upgrade or a config
// change does) and waits until the new one is Ready.
func (e *k8sEnv) restartAgent() {
	e.t.Helper()
	e.kubectl("-n", "flock-system", "rollout", "restart", "daemonset/flock")
	e.kubectl("-n", "flock-system", "rollout", "status", "daemonset/flock", "--timeout=180s")
	e.waitPods("the restarted agent", "-n", "flock-system", "-l", agentSelector)
}

// setChainedPlugins points the node's portmap and bandwidth at dir's.
func setChainedPlugins(t *testing.T, dir string) {
	t.Helper()
	for _, p := range []string{"portmap", "bandwidth"} {
		link := filepath.Join(cniBinDir, p)
		if err := os.Remove(link); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(dir, p), link); err != nil {
			t.Fatal(err)
		}
	}
}

// agentPID is the host PID of the running flock-agent process.
func agentPID(t *testing.T) int { return hostPID(t, "/usr/local/bin/flock-agent") }

// hostPID is the host PID of the running process of binary (a container's).
func hostPID(t *testing.T, binary string) int {
	t.Helper()
	return findPID(t, binary, "")
}

// findPID is the host PID of a running process of binary; with node set,
// the one whose environment has NODE_NAME=node (every lab node's
// containers share the host's PID namespace).
func findPID(t *testing.T, binary, node string) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !strings.HasPrefix(string(b), binary+"\x00") {
			continue
		}
		if node != "" {
			env, err := os.ReadFile(filepath.Join(d, "environ"))
			if err != nil || !strings.Contains("\x00"+string(env), "\x00NODE_NAME="+node+"\x00") {
				continue
			}
		}
		if pid, err := strconv.Atoi(filepath.Base(d)); err == nil {
			return pid
		}
	}
	if node != "" {
		t.Fatalf("no %s process of node %s", binary, node)
	}
	t.Fatalf("no %s process on the host", binary)
	return 0
}

// The installer wrote the highest conflist version the current chained
// plugins and the runtime run (1.1.0 on containerd 2, 1.0.0 on 1.7),
// reported it, and left nothing the runtime's watcher trips over.
func testInstallerCurrentPlugins(t *testing.T, e *k8sEnv) {
	if v, want := conflistVersion(t), e.c.Opts.Release.CNIVersion(); v != want {
		t.Errorf("conflist cniVersion %s with current chained plugins on %s, want %s; installer: %s", v, e.c.Opts.Release, want, installerReport(t))
	}
	// Staged for the agent, which published it (TestKubernetes checks the
	// conf dir's copy is the staged one).
	if r := installerReport(t); !strings.Contains(r, `"staged"`) {
		t.Errorf("installer report: %s", r)
	}
	entries, _ := os.ReadDir(cniConfDir)
	for _, en := range entries {
		if strings.HasSuffix(en.Name(), ".tmp") {
			t.Errorf("a temp file in the conf dir: %s", en.Name())
		}
	}
	if errs := e.c.LogErrors("containerd", 200); strings.Contains(errs, "failed to reload cni configuration") {
		t.Errorf("containerd tripped over the install:\n%s", errs)
	}
}

// A planned restart of the agent (a rollout) keeps the node Ready; the
// plugin's STATUS stands in for the agent while the marker says it is
// coming back. A pod deleted after the restart leaves nothing behind.
func testPlannedRestartKeepsReady(t *testing.T, e *k8sEnv) {
	e.apply(restartPod)
	e.waitPods("restarter", "restarter")
	stop := sampleReady(t, e)
	start := time.Now()
	e.restartAgent()
	took := time.Since(start)
	time.Sleep(6 * time.Second) // containerd polls STATUS every few seconds: give it two looks
	samples := stop()
	down, downN, markerN := notReady(samples)
	t.Logf("planned restart: rollout %s; %d samples, marker seen in %d, node not Ready in %d (%s)", took.Round(100*time.Millisecond), len(samples), markerN, downN, down.Round(100*time.Millisecond))
	record(t, reliabilityRow{Section: "Kubernetes node", Fault: "planned agent restart (kubectl rollout restart)", ToR: "containerd " + e.c.Opts.Release.Containerd,
		Done: "the node's Ready condition sampled every 250 ms", Times: 1, Survived: "the node stayed Ready: the plugin's STATUS stands in while the restart marker is fresh",
		Figures: map[string]string{"rollout took": took.Round(100 * time.Millisecond).String(), "node not Ready": down.Round(100 * time.Millisecond).String()}})
	if downN > 0 {
		t.Errorf("a planned agent restart marked the node not Ready for %s", down)
	}
	if markerN == 0 {
		t.Error("the restart marker was never seen: nothing stood in for the agent")
	}
	if _, err := os.Stat(restartMarker); !os.IsNotExist(err) {
		t.Errorf("the restart marker outlived the restart: %v", err)
	}
	// DEL after the restart: the new agent restored the allocation.
	e.kubectl("delete", "pod", "restarter", "--wait=true")
	testutil.EventuallyWithin(t, 60*time.Second, "restarter's allocation and veth to go", func() (bool, string) {
		for _, p := range hostPods(t) {
			if p.Name == "restarter" {
				return false, fmt.Sprintf("%+v", p)
			}
		}
		return true, ""
	})
}

// An agent kept away after a planned stop (its DaemonSet moved off the
// node) leaves the node Ready while the marker is fresh; without the
// marker (removed here, as its expiry would) the node goes NotReady — so
// the marker is what kept it Ready — and is Ready again once an agent is
// back. The times are measured and recorded.
func testAgentAway(t *testing.T, e *k8sEnv) {
	away := `{"spec":{"template":{"spec":{"nodeSelector":{"flock.fritzlab.net/e2e-away":"true"}}}}}`
	back := `{"spec":{"template":{"spec":{"nodeSelector":null}}}}`
	stop := sampleReady(t, e)
	e.kubectl("-n", "flock-system", "patch", "daemonset", "flock", "--type=merge", "-p", away)
	testutil.EventuallyWithin(t, 60*time.Second, "the agent gone and its marker there", func() (bool, string) {
		_, err := os.Stat(restartMarker)
		return agentPIDOrZero() == 0 && err == nil, fmt.Sprintf("agent pid %d, marker %v", agentPIDOrZero(), err)
	})
	time.Sleep(12 * time.Second) // two of kubelet's runtime status checks and more
	held := stop()
	down, downN, markerN := notReady(held)
	if downN > 0 || markerN == 0 {
		t.Errorf("agent away after a planned stop: node not Ready in %d of %d samples (%s), marker in %d", downN, len(held), down, markerN)
	}
	if err := os.Remove(restartMarker); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	var notReadyAfter time.Duration
	if e.c.Opts.Release.CNIVersion() == "1.1.0" {
		testutil.EventuallyWithin(t, 60*time.Second, "the node NotReady without agent or marker", func() (bool, string) {
			out, _ := e.c.Kubectl(context.Background(), "get", "node", k8sNode, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			return strings.TrimSpace(out) != "True", out
		})
		notReadyAfter = time.Since(removed)
	} else {
		// Below 1.1.0 the runtime never asks STATUS: the node stays
		// Ready with no agent (ADDs fail until one is back).
		stop := sampleReady(t, e)
		time.Sleep(12 * time.Second)
		if _, downN, _ := notReady(stop()); downN > 0 {
			t.Errorf("node not Ready in %d samples on a %s conflist: nothing asks STATUS there", downN, e.c.Opts.Release.CNIVersion())
		}
	}
	e.kubectl("-n", "flock-system", "patch", "daemonset", "flock", "--type=merge", "-p", back)
	returned := time.Now()
	if err := e.c.WaitNodeReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	readyAfter := time.Since(returned)
	waitAgentAnswers(t)
	e.waitPods("the agent back", "-n", "flock-system", "-l", agentSelector)
	t.Logf("agent away: node Ready for %s with the marker; NotReady %s after the marker went; Ready %s after the agent was let back",
		held[len(held)-1].at.Sub(held[0].at).Round(100*time.Millisecond), notReadyAfter.Round(100*time.Millisecond), readyAfter.Round(100*time.Millisecond))
	record(t, reliabilityRow{Section: "Kubernetes node", Fault: "agent kept away after a planned stop (DaemonSet moved off the node)", ToR: "containerd " + e.c.Opts.Release.Containerd,
		Done: "Ready sampled every 250 ms while away with the marker; the marker then removed", Times: 1,
		Survived: "Ready while the marker was fresh; NotReady without it; Ready again once an agent is back",
		Figures: map[string]string{"Ready while away (marker)": held[len(held)-1].at.Sub(held[0].at).Round(100 * time.Millisecond).String(),
			"NotReady after the marker went": notReadyAfter.Round(100 * time.Millisecond).String(),
			"Ready after the agent was back": readyAfter.Round(100 * time.Millisecond).String()}})
}

// A crashed agent (SIGKILL: no marker) makes STATUS fail until kubelet
// has it back; how long the node was not Ready is measured and recorded.
func testCrashMeasured(t *testing.T, e *k8sEnv) {
	stop := sampleReady(t, e)
	pid := agentPID(t)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 120*time.Second, "a new agent process", func() (bool, string) {
		n := agentPIDOrZero()
		return n != 0 && n != pid, strconv.Itoa(n)
	})
	restarted := time.Since(killed)
	waitAgentAnswers(t)
	e.waitPods("the agent after its crash", "-n", "flock-system", "-l", agentSelector)
	back := time.Since(killed)
	if err := e.c.WaitNodeReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second) // and it stays Ready
	samples := stop()
	down, downN, markerN := notReady(samples)
	t.Logf("agent SIGKILL: a new agent process after %s, its pod Ready after %s; node not Ready in %d of %d samples (%s)",
		restarted.Round(100*time.Millisecond), back.Round(100*time.Millisecond), downN, len(samples), down.Round(100*time.Millisecond))
	record(t, reliabilityRow{Section: "Kubernetes node", Fault: "agent crash (SIGKILL: no restart marker)", ToR: "containerd " + e.c.Opts.Release.Containerd,
		Done: "the node's Ready condition sampled every 250 ms until the agent was back", Times: 1, Survived: "the node Ready again once the agent is back",
		Figures: map[string]string{"new agent process after": restarted.Round(100 * time.Millisecond).String(),
			"agent pod Ready after": back.Round(100 * time.Millisecond).String(), "node not Ready": down.Round(100 * time.Millisecond).String()}})
	if markerN > 0 {
		t.Errorf("a crash left a restart marker (%d samples)", markerN)
	}
	if last := samples[len(samples)-1]; last.status != "True" {
		t.Errorf("node %s after the agent came back", last.status)
	}
}

func agentPIDOrZero() int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "cmdline")); err == nil && strings.HasPrefix(string(b), "/usr/local/bin/flock-agent\x00") {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}

// A node whose chained plugins are old (Debian 12's containernetworking-
// plugins 1.1.1: portmap and bandwidth up to 1.0.0, no STATUS): the
// installer writes 1.0.0, the node is Ready and stays Ready, and a
// hostPort goes through the old portmap. Back on current plugins the
// installer writes 1.1.0 again.
func testOldChainedPlugins(t *testing.T, e *k8sEnv, current string) {
	setChainedPlugins(t, "/usr/lib/cni")
	t.Cleanup(func() { setChainedPlugins(t, current) })
	// The 1.1.0 conflist in place cannot run the old portmap: containerd's
	// STATUS of it fails, and the node goes NotReady until the installer
	// runs again (the agent's restart).
	e.restartAgent()
	if v := conflistVersion(t); v != "1.0.0" {
		t.Fatalf("conflist cniVersion %s with Debian's plugins, want 1.0.0; installer: %s", v, installerReport(t))
	}
	var rep struct {
		Plugins []struct {
			Type     string   `json:"type"`
			Versions []string `json:"versions"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(installerReport(t)), &rep); err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Plugins {
		if slices.Contains(p.Versions, "1.1.0") {
			t.Errorf("the report has %s at %v: not Debian's old one", p.Type, p.Versions)
		}
	}
	if len(rep.Plugins) != 2 {
		t.Errorf("the report lists %d chained plugins, want portmap and bandwidth", len(rep.Plugins))
	}
	if err := e.c.WaitNodeReady(context.Background()); err != nil {
		t.Fatalf("node not Ready on old chained plugins: %v", err)
	}
	stop := sampleReady(t, e)
	e.apply(hostPortPod("hp-old", 18081))
	e.waitPods("hp-old", "hp-old")
	dialHostPort(t, e, 18081)
	e.kubectl("delete", "pod", "hp-old", "--wait=true")
	_, downN, _ := notReady(stop())
	if downN > 0 {
		t.Errorf("node not Ready in %d samples on old chained plugins", downN)
	}

	setChainedPlugins(t, current)
	e.restartAgent()
	if v, want := conflistVersion(t), e.c.Opts.Release.CNIVersion(); v != want {
		t.Errorf("conflist cniVersion %s back on current plugins, want %s", v, want)
	}
	if err := e.c.WaitNodeReady(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// After a reboot (every container killed, the pods' network namespaces
// gone), the agent reaps what it held, containerd's DELs of the dead
// sandboxes succeed, the pods come back with addresses, and nothing leaks.
func testReboot(t *testing.T, e *k8sEnv) {
	e.apply(restartPod)
	e.waitPods("restarter", "restarter")
	before := e.podIPs("default", "restarter")
	rebooted := time.Now()
	if err := e.c.Reboot(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitAgentAnswers(t)
	e.waitPods("the agent after the reboot", "-n", "flock-system", "-l", agentSelector)
	if err := e.c.WaitNodeReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.waitPods("restarter after the reboot", "restarter")
	testutil.EventuallyWithin(t, 90*time.Second, "one allocation (restarter's) and one veth", func() (bool, string) {
		var names []string
		for _, p := range hostPods(t) {
			names = append(names, p.Name)
		}
		v := hostVeths(t)
		return len(names) == 1 && names[0] == "restarter" && len(v) == 1, fmt.Sprintf("allocations %v veths %v", names, v)
	})
	t.Logf("restarter's IPs before the reboot %v, after %v", before, e.podIPs("default", "restarter"))
	// The runtime tears the dead sandboxes down before the agent pod is
	// back: those DELs (their network namespaces gone) must succeed.
	for _, l := range strings.Split(e.c.LogErrors("containerd", 400), "\n") {
		if strings.Contains(l, "failed to destroy network") && logTime(l).After(rebooted) {
			t.Errorf("a DEL after the reboot failed: %s", l)
		}
	}
	e.kubectl("delete", "pod", "restarter", "--wait=true")
}

var restartPod = sleepPod("restarter")

// sleepPod is a busybox pod that only sleeps.
func sleepPod(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: docker.io/local/busybox:1.35
    imagePullPolicy: Never
    command: ["sleep", "3600"]
`, name)
}

func hostPortPod(name string, port int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: docker.io/local/busybox:1.35
    imagePullPolicy: Never
    command: ["sh", "-c", "while true; do echo flock-hostport | nc -l -p 8080; done"]
    ports: [{containerPort: 8080, hostPort: %[2]d, protocol: TCP}]
`, name, port)
}

// dialHostPort expects the hostPort pod's answer on the node's address,
// from the ToR.
func dialHostPort(t *testing.T, e *k8sEnv, port int) {
	t.Helper()
	testutil.EventuallyWithin(t, 30*time.Second, "a TCP answer on the hostPort", func() (bool, string) {
		var conn net.Conn
		err := e.tor.InNS(func() error {
			var err error
			conn, err = net.DialTimeout("tcp", net.JoinHostPort(hostV4.String(), strconv.Itoa(port)), 2*time.Second)
			return err
		})
		if err != nil {
			return false, err.Error()
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		b := make([]byte, 64)
		n, _ := conn.Read(b)
		got := strings.TrimSpace(string(b[:n]))
		return got == "flock-hostport", got
	})
}

// waitAgentAnswers waits until an agent answers on the admin socket.
func waitAgentAnswers(t *testing.T) {
	t.Helper()
	testutil.EventuallyWithin(t, 120*time.Second, "an agent answering flockctl", func() (bool, string) {
		out, err := exec.Command(filepath.Join(binDir, "flockctl"), "--socket", "/run/flock/admin.sock", "status").CombinedOutput()
		return err == nil && strings.Contains(string(out), "serving"), string(out)
	})
}

// logTime is the time="…" of a containerd log line (zero if none).
func logTime(line string) time.Time {
	_, rest, ok := strings.Cut(line, `time="`)
	if !ok {
		return time.Time{}
	}
	ts, _, _ := strings.Cut(rest, `"`)
	t, _ := time.Parse(time.RFC3339Nano, ts)
	return t
}
