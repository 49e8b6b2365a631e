package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/agent/policyips"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// NetworkPolicy through flock-policy (kube-network-policies' engine) on
// what the upstream suite never sees: a pod's anycast and `addresses` IPs,
// which are in no status.podIPs. Traffic to and from them must obey the
// pod's policies exactly like its pod IPs, in both families.

const npAddressesPool4 = `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: np-addresses4}
spec:
  cidrs: [198.51.100.192/27]
  use: [addresses]
  namespaces: [default]
`

// npPod is a busybox pod with labels, flock annotations and a command;
// NET_ADMIN lets the test set a source hint on its routes.
func npPod(name, role, anycast, addresses string, server bool) string {
	ann := ""
	if anycast != "" || addresses != "" {
		ann = "\n  annotations:"
		if anycast != "" {
			ann += fmt.Sprintf("\n    flock.fritzlab.net/anycast: %q", anycast)
		}
		if addresses != "" {
			ann += fmt.Sprintf("\n    flock.fritzlab.net/addresses: %q", addresses)
		}
	}
	cmd := `["sleep", "3600"]`
	if server {
		// httpd serves each connection on its own: no gap between
		// connections reads as a refusal. -vv logs each request's source
		// ("[2001:db8::1]:port: url:/", IPv4 as ::ffff:a.b.c.d) to the
		// container's log: what the policy judged (serverSaw).
		cmd = `["sh", "-c", "mkdir -p /www && echo np-ok > /www/index.html && exec httpd -f -vv -p 8080 -h /www"]`
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
  labels: {role: %s}%s
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: bb
    image: docker.io/local/busybox:1.35
    imagePullPolicy: Never
    command: %s
    securityContext: {capabilities: {add: ["NET_ADMIN"]}}
`, name, role, ann, cmd)
}

// verdict of one connection attempt: allowed (the server answered),
// blocked (timed out: the policy dropped it), or something else.
type verdict string

const (
	allowed verdict = "allowed"
	blocked verdict = "blocked"
)

// ncGet is a shell command fetching / from ip:8080 with busybox nc (the
// image's static wget crashes resolving); a connection the policy drops
// times out after 2 s ("timed out").
func ncGet(ip netip.Addr) string {
	return fmt.Sprintf(`printf "GET / HTTP/1.0\r\n\r\n" | nc -w 2 %s 8080`, ip)
}

// connect fetches from a pod; a connection the policy drops times out.
func (e *k8sEnv) connect(from string, ip netip.Addr) (verdict, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.c.Kubectl(ctx, "exec", from, "--", "sh", "-c", ncGet(ip)+" 2>&1")
	switch {
	case err == nil && strings.Contains(out, "np-ok"):
		return allowed, out
	case strings.Contains(out, "timed out"):
		return blocked, out
	}
	return verdict("error"), fmt.Sprintf("%v: %s", err, out)
}

// expect waits until every connection has its verdict (policies take
// effect asynchronously), then requires it twice more in a row.
func (e *k8sEnv) expect(t *testing.T, from string, want verdict, ips ...netip.Addr) {
	t.Helper()
	for _, ip := range ips {
		n := 0
		testutil.EventuallyWithin(t, 60*time.Second, fmt.Sprintf("%s → %s %s", from, ip, want), func() (bool, string) {
			v, out := e.connect(from, ip)
			if v == want {
				n++
			} else {
				n = 0
			}
			return n >= 3, fmt.Sprintf("%s (%s)", v, strings.TrimSpace(out))
		})
	}
}

// torConnect dials ip:8080 from the ToR's namespace: a client that is no pod.
func (e *k8sEnv) torConnect(ip netip.Addr) (verdict, string) {
	var v verdict
	var detail string
	err := e.tor.InNS(func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(ip, 8080).String(), 2*time.Second)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				v = blocked
			}
			detail = err.Error()
			return nil
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
		b, _ := io.ReadAll(c)
		if strings.Contains(string(b), "np-ok") {
			v = allowed
		}
		detail = string(b)
		return nil
	})
	if err != nil {
		return "error", err.Error()
	}
	return v, detail
}

// serverSaw counts the requests pod's httpd logged from src.
func (e *k8sEnv) serverSaw(pod string, src netip.Addr) int {
	as := src.String()
	if src.Is4() {
		as = "::ffff:" + as
	}
	return strings.Count(e.kubectl("logs", pod), "["+as+"]:")
}

// routeSource is the source address pod from's kernel picks for dst.
func (e *k8sEnv) routeSource(from string, dst netip.Addr) string {
	fam := "-4"
	if dst.Is6() {
		fam = "-6"
	}
	f := strings.Fields(e.kubectl("exec", from, "--", "ip", fam, "route", "get", dst.String()))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "src" {
			return f[i+1]
		}
	}
	return ""
}

// routeVia makes pod from reach dst with src as its source address (a
// route with a source hint through the pod's default gateway) and checks
// that the kernel now picks src for dst.
func (e *k8sEnv) routeVia(t *testing.T, from string, dst, src netip.Addr) {
	t.Helper()
	fam := "-4"
	if dst.Is6() {
		fam = "-6"
	}
	def := strings.Fields(e.kubectl("exec", from, "--", "ip", fam, "route", "show", "default"))
	if len(def) < 5 || def[1] != "via" {
		t.Fatalf("%s: default route %v", from, def)
	}
	e.kubectl("exec", from, "--", "ip", fam, "route", "replace", netip.PrefixFrom(dst, dst.BitLen()).String(), "via", def[2], "dev", def[4], "src", src.String())
	if got := e.routeSource(from, dst); got != src.String() {
		t.Fatalf("%s → %s: the kernel picks source %q, want %s", from, dst, got, src)
	}
}

// unrouteVia removes the routes routeVia set in pod from.
func (e *k8sEnv) unrouteVia(from string, dsts ...netip.Addr) {
	for _, dst := range dsts {
		fam := "-4"
		if dst.Is6() {
			fam = "-6"
		}
		e.kubectl("exec", from, "--", "ip", fam, "route", "del", netip.PrefixFrom(dst, dst.BitLen()).String())
	}
}

func testNetworkPolicyExtraIPs(t *testing.T, e *k8sEnv) {
	e.t = t
	ctx := context.Background()
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, _ = e.c.Kubectl(dctx, "delete", "networkpolicy", "--all", "-n", "default", "--wait=true")
		_, _ = e.c.Kubectl(dctx, "delete", "pod", "np-srv", "np-other", "np-cli", "np-stranger", "-n", "default", "--wait=true", "--timeout=90s")
		_, _ = e.c.Kubectl(dctx, "delete", "addresspool", "np-addresses4", "--wait=true")
	})
	e.apply(npAddressesPool4)
	srvAny6, srvAny4 := netip.MustParseAddr("2001:db8:a::2"), netip.MustParseAddr("203.0.113.2")
	srvAddr6, srvAddr4 := netip.MustParseAddr("2001:db8:b::20"), netip.MustParseAddr("198.51.100.193")
	cliAny6, cliAny4 := netip.MustParseAddr("2001:db8:a::3"), netip.MustParseAddr("203.0.113.3")
	cliAddr6, cliAddr4 := netip.MustParseAddr("2001:db8:b::21"), netip.MustParseAddr("198.51.100.194")
	e.apply(npPod("np-srv", "np-server", srvAny6.String()+","+srvAny4.String(), srvAddr6.String()+","+srvAddr4.String(), true))
	e.apply(npPod("np-other", "np-other", "", "", true))
	e.apply(npPod("np-cli", "np-client", cliAny6.String()+","+cliAny4.String(), cliAddr6.String()+","+cliAddr4.String(), false))
	e.apply(npPod("np-stranger", "np-stranger", "", "", false))
	e.waitPods("the policy test pods", "np-srv", "np-other", "np-cli", "np-stranger")
	srvIPs := e.podIPs("default", "np-srv")
	extras := []netip.Addr{srvAny6, srvAny4, srvAddr6, srvAddr4}
	all := append(append([]netip.Addr{}, srvIPs...), extras...)
	// The ToR reaches the anycast IPs (the pod is Ready) and `addresses`.
	for _, ip := range extras {
		e.waitBird(netip.PrefixFrom(ip, ip.BitLen()), 1)
	}
	policyRestarts := func() string {
		return e.kubectl("-n", "flock-system", "get", "pods", "-l", "app.kubernetes.io/name=flock", "-o", "jsonpath={.items[0].status.containerStatuses[?(@.name==\"policy\")].restartCount}")
	}
	restartsBefore := policyRestarts()

	t.Run("no policy: everyone connects", func(t *testing.T) {
		e.expect(t, "np-stranger", allowed, all...)
	})

	t.Run("ingress to anycast and addresses IPs", func(t *testing.T) {
		e.apply(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-ingress, namespace: default}
spec:
  podSelector: {matchLabels: {role: np-server}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: np-client}}
    - ipBlock: {cidr: %s/128}
    - ipBlock: {cidr: %s/32}
    ports: [{port: 8080, protocol: TCP}]
`, torV6, torV4))
		e.expect(t, "np-stranger", blocked, all...)
		e.expect(t, "np-cli", allowed, all...)
		// A client that is no pod, allowed by an ipBlock: the engine maps
		// the ToR's address to no pod (and does not crash on it).
		for _, ip := range extras {
			testutil.EventuallyWithin(t, 30*time.Second, fmt.Sprintf("ToR → %s allowed", ip), func() (bool, string) {
				v, out := e.torConnect(ip)
				return v == allowed, fmt.Sprintf("%s (%s)", v, out)
			})
		}
	})

	t.Run("egress to anycast and addresses IPs", func(t *testing.T) {
		e.apply(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-egress, namespace: default}
spec:
  podSelector: {matchLabels: {role: np-client}}
  policyTypes: [Egress]
  egress:
  - to:
    - podSelector: {matchLabels: {role: np-server}}
    ports: [{port: 8080, protocol: TCP}]
`)
		// The destination's extra IPs are the server pod's: the selector
		// matches them as it matches its pod IPs.
		e.expect(t, "np-cli", allowed, all...)
		e.expect(t, "np-cli", blocked, e.podIPs("default", "np-other")...)
	})

	t.Run("egress from anycast and addresses IPs", func(t *testing.T) {
		other := e.podIPs("default", "np-other")
		for _, src := range []netip.Addr{cliAny6, cliAny4, cliAddr6, cliAddr4} {
			dst := other[0]
			if dst.Is6() != src.Is6() {
				dst = other[1]
			}
			srv := srvIPs[0]
			if srv.Is6() != src.Is6() {
				srv = srvIPs[1]
			}
			// From the client's extra IP: to the server allowed, to
			// another pod blocked — unchecked, the second would pass.
			e.routeVia(t, "np-cli", dst, src)
			e.routeVia(t, "np-cli", srv, src)
			e.expect(t, "np-cli", blocked, dst)
			e.expect(t, "np-cli", allowed, srv)
		}
		// The server saw the client's extra IP as the source (the hint
		// worked): its httpd access is what the policy judged.
		if out := e.kubectl("exec", "np-cli", "--", "ip", "-6", "route", "get", srvIPs[0].String()); !strings.Contains(out, "src "+cliAddr6.String()) && !strings.Contains(out, "src "+cliAny6.String()) {
			t.Errorf("np-cli's route to %s has no source hint:\n%s", srvIPs[0], out)
		}
	})

	checkRestarts := func() {
		if after := policyRestarts(); after != restartsBefore {
			t.Errorf("flock-policy restarted during the policy tests: restartCount %s → %s", restartsBefore, after)
		}
	}
	checkRestarts()
	t.Run("engine and agent restarts under new connections", func(t *testing.T) {
		// np-ingress lets np-cli in and keeps np-stranger out.
		testPolicyRestarts(t, e, ipOf(srvIPs, true))
		// After them, every extra IP of the client is still its own: a
		// connection from each (allowed by its label) gets through.
		for _, src := range []netip.Addr{cliAny6, cliAny4, cliAddr6, cliAddr4} {
			srv := ipOf(srvIPs, src.Is6())
			e.routeVia(t, "np-cli", srv, src)
			e.expect(t, "np-cli", allowed, srv)
		}
	})
	t.Run("extra IPs stay under policy while the agent waits for its NodeConfig", func(t *testing.T) {
		testPolicyWhileAgentWaits(t, e, srvIPs, srvAny6, srvAddr6, srvAny4, srvAddr4)
	})
	restartsBefore = policyRestarts()

	t.Run("bad input breaks nothing", func(t *testing.T) {
		e.kubectl("delete", "networkpolicy", "np-ingress", "np-egress")
		e.expect(t, "np-stranger", allowed, srvIPs[0], srvAny6)
		// A policy selecting no pod changes nothing.
		e.apply(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-nothing, namespace: default}
spec:
  podSelector: {matchLabels: {role: no-such-pod}}
  policyTypes: [Ingress, Egress]
`)
		e.expect(t, "np-stranger", allowed, srvIPs[0], srvAny6)
		// A named port no container declares allows nothing.
		e.apply(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-named, namespace: default}
spec:
  podSelector: {matchLabels: {role: np-server}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: web, protocol: TCP}]
`)
		e.expect(t, "np-stranger", blocked, srvIPs[0], srvAny4, srvAddr6)
		e.kubectl("delete", "networkpolicy", "np-named")
		// Port ranges: 8000-8079 leaves 8080 out, 8000-8080 takes it in.
		rangePolicy := func(end int) string {
			return fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-range, namespace: default}
spec:
  podSelector: {matchLabels: {role: np-server}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: 8000, endPort: %d, protocol: TCP}]
`, end)
		}
		e.apply(rangePolicy(8079))
		e.expect(t, "np-stranger", blocked, srvIPs[0], srvAddr4)
		e.apply(rangePolicy(8080))
		e.expect(t, "np-stranger", allowed, srvIPs[0], srvAddr4)
		e.kubectl("delete", "networkpolicy", "np-range")
		// An ipBlock over the whole pod, anycast and `addresses` ranges
		// with the stranger's pod IPs excepted.
		st := e.podIPs("default", "np-stranger")
		cli := e.podIPs("default", "np-cli")
		e.apply(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-block, namespace: default}
spec:
  podSelector: {matchLabels: {role: np-server}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - ipBlock: {cidr: %s, except: [%s/128]}
    - ipBlock: {cidr: %s, except: [%s/32]}
    - ipBlock: {cidr: 2001:db8::/32}
    - ipBlock: {cidr: 203.0.113.0/24}
`, k8sSummary6, ipOf(st, true), k8sSummary4, ipOf(st, false)))
		e.expect(t, "np-stranger", blocked, all...)
		// From the client's pod IPs (the hints of the egress test gone).
		e.unrouteVia("np-cli", srvIPs...)
		for _, ip := range srvIPs {
			if src := e.routeSource("np-cli", ip); src != ipOf(cli, ip.Is6()).String() {
				t.Fatalf("np-cli → %s: source %s, want its pod IP %s", ip, src, ipOf(cli, ip.Is6()))
			}
		}
		e.expect(t, "np-cli", allowed, srvIPs...)
		// From the client's extra IPs, each as the source the kernel
		// picks (checked) and the server logs: the ipBlocks judge the
		// source as sent. The anycast IPs and 2001:db8:b::21 are inside
		// an allowed block; 198.51.100.194 (the client's `addresses` IPv4)
		// is in none, so it is blocked whatever pod holds it.
		for _, c := range []struct {
			src  netip.Addr
			want verdict
		}{{cliAny6, allowed}, {cliAddr6, allowed}, {cliAny4, allowed}, {cliAddr4, blocked}} {
			srv := ipOf(srvIPs, c.src.Is6())
			e.routeVia(t, "np-cli", srv, c.src)
			before := e.serverSaw("np-srv", c.src)
			e.expect(t, "np-cli", c.want, srv)
			saw := e.serverSaw("np-srv", c.src) - before
			if c.want == allowed && saw < 3 {
				t.Errorf("source %s: allowed, but np-srv logged %d requests from it (want ≥ 3): the source was not what the policy judged", c.src, saw)
			}
			if c.want == blocked && saw != 0 {
				t.Errorf("source %s: blocked, but np-srv logged %d requests from it", c.src, saw)
			}
		}
		e.unrouteVia("np-cli", srvIPs...)
		e.kubectl("delete", "networkpolicy", "np-block", "np-nothing")
	})

	checkRestarts()
	_ = ctx
}

// connectLoop starts, in pod from, a loop that opens a new connection to
// ip:8080 every 200 ms for d (1 s timeout each) and logs ok or no per
// attempt to /tmp/<name>.log; it returns a func that waits for the loop's
// end and counts the outcomes.
func (e *k8sEnv) connectLoop(t *testing.T, from, name string, ip netip.Addr, d time.Duration) func() (ok, no int) {
	t.Helper()
	script := fmt.Sprintf(`end=$(( $(date +%%s) + %d )); while [ $(date +%%s) -lt $end ]; do if %s 2>&1 | grep -q np-ok; then echo ok; else echo no; fi; sleep 0.2; done > /tmp/%s.log 2>&1`,
		int(d.Seconds()), strings.ReplaceAll(ncGet(ip), "-w 2", "-w 1"), name)
	e.kubectl("exec", from, "--", "sh", "-c", "setsid sh -c '"+script+"' </dev/null >/dev/null 2>&1 &")
	started := time.Now()
	return func() (int, int) {
		time.Sleep(time.Until(started.Add(d + 3*time.Second)))
		out := e.kubectl("exec", from, "--", "cat", "/tmp/"+name+".log")
		return strings.Count(out, "ok"), strings.Count(out, "no")
	}
}

// testPolicyRestarts: the engine (and the agent) restart while clients
// open new connections to a selected pod, one allowed and one blocked.
// The verdicts are the kernel's: no allowed connection is refused and no
// blocked one passes while flock-policy is down.
func testPolicyRestarts(t *testing.T, e *k8sEnv, target netip.Addr) {
	e.t = t
	policyPID := func() int { return hostPID(t, "/usr/local/bin/flock-policy") }
	waitReady := func() {
		e.waitPods("the flock pod after the fault", "-n", "flock-system", "-l", agentSelector)
	}
	for _, f := range []struct {
		fault, done string
		inject      func()
	}{
		{"flock-policy crash (SIGKILL)", "kill -KILL the flock-policy process; kubelet restarts the container", func() {
			if err := unix.Kill(policyPID(), unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
		{"flock-policy stop (SIGTERM)", "kill -TERM the flock-policy process; kubelet restarts the container", func() {
			if err := unix.Kill(policyPID(), unix.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}},
		{"rollout (kubectl rollout restart daemonset/flock)", "the flock pod replaced: agent and flock-policy stop (SIGTERM) and start anew", func() {
			e.kubectl("-n", "flock-system", "rollout", "restart", "daemonset/flock")
			e.kubectl("-n", "flock-system", "rollout", "status", "daemonset/flock", "--timeout=180s")
		}},
		{"agent crash (SIGKILL)", "kill -KILL the flock-agent process; flock-policy keeps running", func() {
			if err := unix.Kill(agentPID(t), unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		const d = 30 * time.Second
		allowedDone := e.connectLoop(t, "np-cli", "allowed", target, d)
		blockedDone := e.connectLoop(t, "np-stranger", "blocked", target, d)
		time.Sleep(5 * time.Second)
		f.inject()
		// Let the fault play out: kubelet restarts what died.
		time.Sleep(2 * time.Second)
		waitReady()
		okA, noA := allowedDone()
		okB, noB := blockedDone()
		record(t, reliabilityRow{Section: "NetworkPolicy", Fault: f.fault, ToR: "containerd " + e.c.Opts.Release.Containerd,
			Done: f.done + "; meanwhile an allowed and a blocked pod each open a new connection every 200 ms (1 s timeout) for 30 s", Times: 1,
			Survived: fmt.Sprintf("blocked connections let through: %d of %d", okB, okB+noB),
			Figures: map[string]string{"allowed connections refused": fmt.Sprintf("%d of %d", noA, okA+noA),
				"allowed refused for about": (time.Duration(noA) * 1200 * time.Millisecond).String()}})
		if okB != 0 {
			t.Errorf("%s: %d blocked connections were let through", f.fault, okB)
		}
		if noA != 0 {
			t.Errorf("%s: %d of %d allowed connections were refused", f.fault, noA, okA+noA)
		}
		if okA == 0 || noB == 0 {
			t.Errorf("%s: the loops did not run (allowed ok %d, blocked no %d)", f.fault, okA, noB)
		}
	}
}

// testPolicyWhileAgentWaits: the agent is SIGKILLed with its NodeConfig
// deleted, so the new one waits for it (as it does, for as long, while the
// API server is unreachable) and does not know its pods. np-srv's anycast
// and `addresses` IPs, in both families, must stay under its policies all
// that time: np-ingress keeps np-stranger out of them, and a deny-all
// egress policy keeps connections sourced from them in. An agent that
// answered "no pods" let all of them through (16 of 16 probes).
func testPolicyWhileAgentWaits(t *testing.T, e *k8sEnv, srvIPs []netip.Addr, any6, addr6, any4, addr4 netip.Addr) {
	e.t = t
	e.apply(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-srv-egress, namespace: default}
spec:
  podSelector: {matchLabels: {role: np-server}}
  policyTypes: [Egress]
`)
	other, cli := e.podIPs("default", "np-other"), e.podIPs("default", "np-cli")
	// One destination per source (a route per destination): np-other
	// answers, np-cli refuses; either is a connection let through, only
	// a timeout is a block.
	type probe struct {
		from    string
		src, to netip.Addr
	}
	egress := []probe{{"np-srv", any6, ipOf(other, true)}, {"np-srv", addr6, ipOf(cli, true)},
		{"np-srv", any4, ipOf(other, false)}, {"np-srv", addr4, ipOf(cli, false)}}
	probes := slices.Clone(egress)
	for _, ip := range []netip.Addr{any6, addr6, any4, addr4} {
		probes = append(probes, probe{from: "np-stranger", to: ip})
	}
	for _, p := range egress {
		e.routeVia(t, "np-srv", p.to, p.src)
	}
	t.Cleanup(func() {
		e.t = t
		e.unrouteVia("np-srv", other[0], other[1], cli[0], cli[1])
		e.kubectl("delete", "networkpolicy", "np-srv-egress", "--ignore-not-found")
	})
	// With the agent serving, every probe is blocked.
	for _, p := range probes {
		e.expect(t, p.from, blocked, p.to)
	}

	// The NodeConfig, to create again.
	var nc map[string]any
	if err := json.Unmarshal([]byte(e.kubectl("get", "nodeconfig", k8sNode, "-o", "json")), &nc); err != nil {
		t.Fatal(err)
	}
	meta := nc["metadata"].(map[string]any)
	keep := map[string]any{"name": meta["name"]}
	for _, k := range []string{"labels", "annotations"} {
		if v, ok := meta[k]; ok && v != nil {
			keep[k] = v
		}
	}
	nc["metadata"] = keep
	delete(nc, "status")
	saved, _ := json.Marshal(nc)
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		e.apply(string(saved))
		e.waitPods("the agent with its NodeConfig back", "-n", "flock-system", "-l", agentSelector)
	}
	t.Cleanup(restore)
	e.kubectl("delete", "nodeconfig", k8sNode)
	if err := unix.Kill(agentPID(t), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The new agent waits: its admin API says it does not know its pods
	// (503), where it used to answer an empty list.
	waiting := func() (bool, string) {
		out, err := e.c.Kubectl(context.Background(), "-n", "flock-system", "exec", "ds/flock", "-c", "agent", "--", "flockctl", "pods")
		return err != nil && strings.Contains(out, "does not know this node's pods yet") && strings.Contains(out, "waiting for NodeConfig"), out
	}
	testutil.EventuallyWithin(t, 120*time.Second, "the restarted agent to wait for its NodeConfig", waiting)
	// flock-policy polls the agent every second: give it a few.
	time.Sleep(3 * policyips.AgentPollInterval)
	var through []string
	n := 0
	for sweep := range 3 {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, p := range probes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, out := e.connect(p.from, p.to)
				mu.Lock()
				defer mu.Unlock()
				n++
				if v != blocked {
					through = append(through, fmt.Sprintf("sweep %d: %s (source %v) → %s: %s %s", sweep, p.from, p.src, p.to, v, strings.TrimSpace(out)))
				}
			}()
		}
		wg.Wait()
	}
	if ok, out := waiting(); !ok {
		t.Errorf("the agent stopped waiting during the probes; they prove nothing: %s", out)
	}
	record(t, reliabilityRow{Section: "NetworkPolicy", Fault: "agent crash (SIGKILL) with its NodeConfig deleted: the new agent waits",
		ToR:   "containerd " + e.c.Opts.Release.Containerd,
		Done:  "kill -KILL the flock-agent process after deleting its NodeConfig; while it waits, connections to a pod's anycast and `addresses` IPs (both families) from a pod its ingress policy blocks, and from them to other pods under a deny-all egress policy",
		Times: 1, Survived: fmt.Sprintf("blocked connections let through: %d of %d", len(through), n)})
	if len(through) > 0 {
		t.Errorf("%d of %d blocked connections to or from extra IPs were let through while the agent waited:\n%s", len(through), n, strings.Join(through, "\n"))
	}
	restore()
	// Back: the same probes are still blocked.
	for _, p := range probes {
		e.expect(t, p.from, blocked, p.to)
	}
}
