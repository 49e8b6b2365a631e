package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// TestIdempotentAddDelCheck: ADD repeated returns the same IPs, CHECK passes
// and then catches a host route deleted by hand, DEL twice succeeds.
func TestIdempotentAddDelCheck(t *testing.T) {
	n := startNode(t, defaultConfig)
	pod := lab.Pod{ContainerID: "idem01", NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", "idem")}
	ctx := ctxT(t)
	r1, err := n.cni.Add(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := n.cni.Add(ctx, pod)
	if err != nil {
		t.Fatalf("repeated ADD: %v", err)
	}
	ip1, ip2 := podIPs(t, r1), podIPs(t, r2)
	if fmt.Sprint(ip1) != fmt.Sprint(ip2) {
		t.Fatalf("repeated ADD returned %v, first ADD %v", ip2, ip1)
	}
	if err := n.cni.Check(ctx, pod); err != nil {
		t.Fatalf("CHECK on a healthy pod: %v", err)
	}
	// Remove the host /128 by hand: CHECK must notice.
	v6 := ipOf(ip1, true)
	veth := dataplane.HostVethName(pod.ContainerID)
	if err := n.ns.Do(func(h *netlink.Handle) error {
		l, err := h.LinkByName(veth)
		if err != nil {
			return err
		}
		return h.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: netlinkPrefix(netip.PrefixFrom(v6, 128))})
	}); err != nil {
		t.Fatal(err)
	}
	err = n.cni.Check(ctx, pod)
	if err == nil {
		t.Fatal("CHECK passed after the host route was deleted")
	}
	if !strings.Contains(err.Error(), v6.String()) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("CHECK error should name the missing route %s: %v", v6, err)
	}
	for i := range 2 {
		if err := n.cni.Del(ctx, pod); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	// DEL of a container the agent never saw succeeds too.
	if err := n.cni.Del(ctx, lab.Pod{ContainerID: "never-added", NS: pod.NS, Args: pod.Args}); err != nil {
		t.Fatalf("DEL of unknown container: %v", err)
	}
	assertClean(t, n)
}

// TestConcurrentAdds: 50 concurrent ADDs get 50 distinct addresses and a
// consistent store; 50 DELs leave nothing behind.
func TestConcurrentAdds(t *testing.T) {
	n := startNode(t, defaultConfig)
	ctx := ctxT(t)
	const count = 50
	pods := make([]lab.Pod, count)
	for i := range pods {
		pods[i] = lab.Pod{ContainerID: fmt.Sprintf("conc%02d", i), NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", fmt.Sprintf("p%d", i))}
	}
	results := make([][]netip.Addr, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			r, err := n.cni.Add(ctx, pods[i])
			if err != nil {
				errs[i] = err
				return
			}
			results[i] = podIPs(t, r)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]string{}
	for i, ips := range results {
		if len(ips) != 2 {
			t.Fatalf("pod %d: %v", i, ips)
		}
		for _, ip := range ips {
			if prev, dup := seen[ip]; dup {
				t.Fatalf("%s handed to both %s and %s", ip, prev, pods[i].ContainerID)
			}
			seen[ip] = pods[i].ContainerID
		}
	}
	recs := records(t, n.agent)
	if len(recs) != count {
		t.Fatalf("store holds %d records, want %d", len(recs), count)
	}
	for _, r := range recs {
		if r.State != "committed" {
			t.Errorf("record %s is %s", r.ContainerID, r.State)
		}
		for _, ip := range r.IPs {
			if seen[ip] != r.ContainerID {
				t.Errorf("store says %s owns %s, CNI result says %s", r.ContainerID, ip, seen[ip])
			}
		}
	}
	if v := flockVeths(t, n.ns); len(v) != count {
		t.Errorf("%d veths, want %d", len(v), count)
	}
	u := used(t, n.agent)
	if u["fd00:10:1::/64"] != count || u["10.1.1.0/24"] != count {
		t.Errorf("IPAM usage %v, want %d in each summary", u, count)
	}
	for i := range pods {
		wg.Go(func() { errs[i] = n.cni.Del(ctx, pods[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	assertClean(t, n)
}

// TestBadInputLeavesNothing: each malformed annotation, a cidr6 outside the
// pools, a forbidden pool and pool exhaustion fail ADD with a message that
// names the key or pool and the value, and nothing is left behind.
func TestBadInputLeavesNothing(t *testing.T) {
	n := startNode(t, defaultConfig)
	ctx := ctxT(t)
	podNS := newNS(t, "flkp-")
	cases := []struct {
		name      string
		args      [][2]string
		wantInErr []string
	}{
		{"ipv6 not bool", lab.PodArgs("default", "p", "flock.fritzlab.net/ipv6", "yes"), []string{"flock.fritzlab.net/ipv6", `"yes"`}},
		{"ipv4 not bool", lab.PodArgs("default", "p", "flock.fritzlab.net/ipv4", "1"), []string{"flock.fritzlab.net/ipv4", `"1"`}},
		{"cidr6 garbage", lab.PodArgs("default", "p", "flock.fritzlab.net/cidr6", "fd00::zz/64"), []string{"flock.fritzlab.net/cidr6", "fd00::zz/64"}},
		{"cidr6 is v4", lab.PodArgs("default", "p", "flock.fritzlab.net/cidr6", "10.1.1.0/24"), []string{"flock.fritzlab.net/cidr6", "10.1.1.0/24"}},
		{"cidr4 host bits", lab.PodArgs("default", "p", "flock.fritzlab.net/cidr4", "10.1.1.1/24"), []string{"flock.fritzlab.net/cidr4", "10.1.1.1/24", "10.1.1.0/24"}},
		{"ip-algo unknown", lab.PodArgs("default", "p", "flock.fritzlab.net/ip-algo", "roundrobin"), []string{"flock.fritzlab.net/ip-algo", "roundrobin"}},
		{"ip-algo bad field", lab.PodArgs("default", "p", "flock.fritzlab.net/ip-algo", "embed:team/8"), []string{"flock.fritzlab.net/ip-algo", "embed:team/8"}},
		{"anycast not ip", lab.PodArgs("default", "p", "flock.fritzlab.net/anycast", "2001:db8:a::1,nope"), []string{"flock.fritzlab.net/anycast", "nope"}},
		{"addresses link-local", lab.PodArgs("default", "p", "flock.fritzlab.net/addresses", "fe80::5"), []string{"flock.fritzlab.net/addresses", "fe80::5"}},
		{"anycast in pod pool", lab.PodArgs("default", "p", "flock.fritzlab.net/anycast", "fd00:10:1::99"), []string{"flock.fritzlab.net/anycast", "fd00:10:1::99", "fd00:10:1::/64"}},
		{"unknown key", lab.PodArgs("default", "p", "flock.fritzlab.net/ipv44", "true"), []string{"flock.fritzlab.net/ipv44"}},
		{"no family", lab.PodArgs("default", "p", "flock.fritzlab.net/ipv6", "false", "flock.fritzlab.net/ipv4", "false"), []string{"flock.fritzlab.net/ipv6"}},
		{"cidr6 outside pools", lab.PodArgs("default", "p", "flock.fritzlab.net/cidr6", "2001:db8:999::/64"), []string{"flock.fritzlab.net/cidr6", "2001:db8:999::/64", "no AddressPool allows namespace default to use 2001:db8:999::/64 as pod (none covers it)"}},
		{"cidr6 forbidden namespace", lab.PodArgs("dev", "p", "flock.fritzlab.net/cidr6", "2001:db8:100::/120"), []string{"pod dev/p", "no AddressPool allows namespace dev to use 2001:db8:100::/120 as pod", "namespaces prod"}},
		{"missing pod name", [][2]string{{"K8S_POD_NAMESPACE", "default"}}, []string{"K8S_POD_NAME"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := lab.Pod{ContainerID: fmt.Sprintf("bad%02d", i), NS: podNS, Args: tc.args}
			_, err := n.cni.Add(ctx, pod)
			if err == nil {
				_ = n.cni.Del(ctx, pod)
				t.Fatal("ADD succeeded")
			}
			for _, w := range tc.wantInErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q: %v", w, err)
				}
			}
			var te *types.Error
			if !errors.As(err, &te) || te.Code == 0 {
				t.Errorf("want a CNI error with a code, got %T %v", err, err)
			}
			assertClean(t, n)
			assertPodNSEmpty(t, podNS)
		})
	}

	t.Run("pool exhaustion", func(t *testing.T) {
		// 198.51.100.0/29 has 6 usable addresses.
		args := func(i int) [][2]string {
			return lab.PodArgs("default", fmt.Sprintf("ex%d", i), "flock.fritzlab.net/ipv6", "false", "flock.fritzlab.net/cidr4", "198.51.100.0/29")
		}
		var added []lab.Pod
		for i := range 6 {
			p := lab.Pod{ContainerID: fmt.Sprintf("exh%02d", i), NS: newNS(t, "flkp-"), Args: args(i)}
			if _, err := n.cni.Add(ctx, p); err != nil {
				t.Fatalf("ADD %d of 6: %v", i+1, err)
			}
			added = append(added, p)
		}
		extra := lab.Pod{ContainerID: "exh99", NS: podNS, Args: args(99)}
		_, err := n.cni.Add(ctx, extra)
		if err == nil {
			t.Fatal("7th ADD into a 6-address pool succeeded")
		}
		if !strings.Contains(err.Error(), "198.51.100.0/29") || !strings.Contains(err.Error(), "exhausted") {
			t.Errorf("exhaustion error should name the pool: %v", err)
		}
		if r := records(t, n.agent); len(r) != 6 {
			t.Errorf("%d records after the failed ADD, want 6", len(r))
		}
		assertPodNSEmpty(t, podNS)
		for _, p := range added {
			if err := n.cni.Del(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		assertClean(t, n)
	})
}

func assertPodNSEmpty(t *testing.T, ns *lab.NS) {
	t.Helper()
	err := ns.Do(func(h *netlink.Handle) error {
		links, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Attrs().Name != "lo" {
				t.Errorf("pod netns still has %s", l.Attrs().Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCrashBeforeCommit: SIGKILL after the pending write and the netlink
// work, before the commit. On restart the partial veth is gone and the IP
// is free; a normal restart keeps committed pods' IPs and routes.
func TestCrashBeforeCommit(t *testing.T) {
	cfg := strings.Replace(defaultConfig, "    ipv4: true", "    ipv4: true\n    ipAlgo: sequential", 1)
	n := startNode(t, cfg)
	ctx := ctxT(t)
	keep := lab.Pod{ContainerID: "keep01", NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", "keep")}
	r, err := n.cni.Add(ctx, keep)
	if err != nil {
		t.Fatal(err)
	}
	keepIPs := podIPs(t, r)

	// Restart with the hook that blocks every ADD right before the commit.
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	n.agent.Args = []string{"--test-hook", "pause-before-commit"}
	if err := n.agent.Start(filepath.Join(binDir, "flock-agent"), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	crash := lab.Pod{ContainerID: "crash01", NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", "crash")}
	addCtx, cancel := context.WithCancel(ctx)
	addDone := make(chan error, 1)
	go func() { _, err := n.cni.Add(addCtx, crash); addDone <- err }()
	// Wait until the agent has written the pending record and built the veth.
	crashVeth := dataplane.HostVethName(crash.ContainerID)
	var pendingIPs []netip.Addr
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, rec := range records(t, n.agent) {
			if rec.ContainerID == crash.ContainerID && rec.State == "pending" && hasVeth(t, n.ns, crashVeth) {
				pendingIPs = rec.IPs
			}
		}
		if pendingIPs != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pending record and veth for %s; agent log:\n%s", crash.ContainerID, n.agent.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := n.agent.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-addDone; err == nil {
		t.Fatal("ADD succeeded although the agent was killed mid-ADD")
	}
	cancel()
	if !hasVeth(t, n.ns, crashVeth) {
		t.Fatal("the partial veth should still exist after SIGKILL (else the test proves nothing)")
	}

	n.agent.Args = nil
	if err := n.agent.Start(filepath.Join(binDir, "flock-agent"), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if hasVeth(t, n.ns, crashVeth) {
		t.Error("partial veth survived the restart")
	}
	for _, rec := range records(t, n.agent) {
		if rec.ContainerID == crash.ContainerID {
			t.Errorf("pending record survived the restart: %+v", rec)
		}
	}
	assertPodNSEmpty(t, crash.NS)
	// The IP is free again: with sequential allocation the next pod gets it.
	next := lab.Pod{ContainerID: "next01", NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", "next")}
	r, err = n.cni.Add(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if got := podIPs(t, r); fmt.Sprint(got) != fmt.Sprint(pendingIPs) {
		t.Errorf("after recovery the next pod got %v; the crashed ADD's %v should have been free", got, pendingIPs)
	}

	// A normal restart keeps committed pods: same IPs, routes still there,
	// traffic still flows.
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := lab.Ping(n.ns, keepIPs[0], 5*time.Second); err != nil {
		t.Errorf("pod unreachable while the agent is stopped: %v", err)
	}
	if err := n.agent.Start(filepath.Join(binDir, "flock-agent"), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	r, err = n.cni.Add(ctx, keep)
	if err != nil {
		t.Fatal(err)
	}
	if got := podIPs(t, r); fmt.Sprint(got) != fmt.Sprint(keepIPs) {
		t.Errorf("after restart %s has %v, had %v", keep.ContainerID, got, keepIPs)
	}
	if err := n.cni.Check(ctx, keep); err != nil {
		t.Errorf("CHECK after restart: %v", err)
	}
	for _, ip := range keepIPs {
		if err := lab.Ping(n.ns, ip, 5*time.Second); err != nil {
			t.Error(err)
		}
	}
	for _, p := range []lab.Pod{keep, next} {
		if err := n.cni.Del(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, n)
}

func hasVeth(t *testing.T, ns *lab.NS, name string) bool {
	for _, v := range flockVeths(t, ns) {
		if v == name {
			return true
		}
	}
	return false
}

// TestCorruptStoreRefusesStart: a corrupt record stops the agent from
// starting, with an error naming the file, and the file is left untouched.
func TestCorruptStoreRefusesStart(t *testing.T) {
	n := startNode(t, defaultConfig)
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(n.agent.StateDir, "allocations", "broken01.json")
	content := []byte(`{"version":1,"containerID":"broken01","state":"commi`)
	if err := os.WriteFile(bad, content, 0o600); err != nil {
		t.Fatal(err)
	}
	err := n.agent.Start(filepath.Join(binDir, "flock-agent"), 10*time.Second)
	if err == nil {
		t.Fatal("agent started on a corrupt store")
	}
	if !strings.Contains(n.agent.Log(), bad) {
		t.Errorf("agent's error does not name %s:\n%s", bad, n.agent.Log())
	}
	after, rerr := os.ReadFile(bad)
	if rerr != nil || string(after) != string(content) {
		t.Errorf("corrupt file was changed: %q, %v", after, rerr)
	}
}

// TestAgentNotRunning: ADD and STATUS fail at once with a clear error.
func TestAgentNotRunning(t *testing.T) {
	dir := t.TempDir()
	c, err := lab.NewCNI(binDir, filepath.Join(dir, "cache"), filepath.Join(dir, "nobody.sock"), "1.1.0")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	pod := lab.Pod{ContainerID: "orphan01", NS: newNS(t, "flkp-"), Args: lab.PodArgs("default", "orphan")}
	start := time.Now()
	_, err = c.Add(ctx, pod)
	if err == nil || !strings.Contains(err.Error(), "agent is not running") {
		t.Fatalf("ADD without agent: want 'agent is not running', got %v", err)
	}
	err = c.Status(ctx)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable || !strings.Contains(te.Msg, "not running") {
		t.Fatalf("STATUS without agent: want code 50 'not running', got %v", err)
	}
	t.Logf("both calls returned in %s", time.Since(start))
}

func netlinkPrefix(p netip.Prefix) *netIPNet { return toIPNet(p) }
