package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// birdTable returns every route BIRD learnt from the lab's nodes, with the
// number of paths per prefix.
func birdTable(t *testing.T, l *lab.BGPLab) map[netip.Prefix]int {
	t.Helper()
	out, err := l.Bird.Cmd("show route")
	if err != nil {
		t.Fatalf("birdc show route: %v\n%s", err, out)
	}
	return parseBird(out)
}

// kernelHostRoutes lists a node's flock gateway routes: prefix → next hops
// ("gw%dev"), sorted.
func kernelHostRoutes(t *testing.T, ns *lab.NS) map[netip.Prefix][]string {
	t.Helper()
	names := map[int]string{}
	if err := ns.Dump(func(h *netlink.Handle) error {
		clear(names)
		links, err := h.LinkList()
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	out := map[netip.Prefix][]string{}
	for _, r := range flockRoutes(t, ns) {
		if r.Gw == nil && len(r.MultiPath) == 0 {
			continue // a pod's own /128 or /32, dev route
		}
		p := prefixOf(r.Dst)
		if r.Gw != nil {
			out[p] = append(out[p], r.Gw.String()+"%"+names[r.LinkIndex])
		}
		for _, m := range r.MultiPath {
			out[p] = append(out[p], m.Gw.String()+"%"+names[m.LinkIndex])
		}
		slices.Sort(out[p])
	}
	return out
}

// rtPod is one pod of the route-truth storm.
type rtPod struct {
	node    *lab.LabNode
	pod     lab.Pod
	ips     []netip.Addr // eth0: IPv6 from a shared range, IPv4 from the summary
	addr    netip.Addr   // its `addresses` IP
	veth    string
	deleted bool
	ready   bool // the last report
}

// runFlockctl is flockctl for goroutines (no t.Fatal).
func runFlockctl(a *lab.Agent, args ...string) error {
	out, err := exec.Command(filepath.Join(binDir, "flockctl"), append([]string{"--socket", a.AdminSocket}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("flockctl %v: %w: %s", args, err, out)
	}
	return nil
}

// TestRouteTruthStorm: two nodes behind a BIRD ToR, anycast replicas on
// both; readiness flaps (flockctl ready) while a DEL storm runs. Afterwards
// the ToR's table and both nodes' kernel routes are exactly what the
// surviving Ready pods imply. Then the reboot case: the agent is killed, a
// pod's netns and veth are deleted by hand, the agent starts, and within
// 2 s neither the ToR nor the node has a route for that pod.
func TestRouteTruthStorm(t *testing.T) {
	l := newLab(t, 2, nil)
	if err := l.StartBird(lab.BirdOptions{GR: true}); err != nil {
		t.Fatal(err)
	}
	tr := birdTor{l}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ToR:\n%s", tr.dump(t))
		}
	})
	for _, n := range l.Nodes {
		waitEstablished(t, n)
		testutil.EventuallyWithin(t, 20*time.Second, "the ToR to see "+n.Name+" Established", func() (bool, string) { return tr.sessionUp(t, n), "" })
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 0))
	any6, any4 := netip.MustParseAddr("2001:db8:a::1"), netip.MustParseAddr("203.0.113.1")
	const perNode = 10
	var pods []*rtPod
	for _, n := range l.Nodes {
		for i := range perNode {
			name := fmt.Sprintf("rt-%s-%d", n.Name, i)
			addr := netip.MustParseAddr(fmt.Sprintf("2001:db8:aa::%d%02d", n.Index, i))
			// Each node its own slice of the shared pool, so no address is
			// handed out twice (cluster-wide uniqueness is issue 8's).
			rng := fmt.Sprintf("2001:db8:100::%d00/120", n.Index)
			p, ips := addPod(t, n, name, "flock.fritzlab.net/anycast", any6.String()+","+any4.String(),
				"flock.fritzlab.net/addresses", addr.String(), "flock.fritzlab.net/cidr6", rng)
			pods = append(pods, &rtPod{node: n, pod: p, ips: ips, addr: addr, veth: dataplane.HostVethName(name), ready: true})
		}
	}
	for _, p := range []netip.Addr{any6, any4} {
		torPaths(t, tr, host(p), 2)
	}

	// The storm: each pod's readiness flaps in its own goroutine (so the
	// last report is known), while two thirds of the pods are deleted.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 10*len(pods))
	for _, p := range pods {
		flaps := 1 + rnd.IntN(6)
		del := rnd.IntN(3) != 0
		final := rnd.IntN(2) == 0
		delay := time.Duration(rnd.IntN(30)) * time.Millisecond
		p.deleted, p.ready = del, final
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range flaps {
				r := i%2 == 1
				if i == flaps-1 {
					r = final
				}
				if err := runFlockctl(p.node.Agent, "ready", "default/"+p.pod.ContainerID, fmt.Sprint(r)); err != nil {
					if !del { // a report racing the pod's own DEL may find it gone
						errs <- err
					}
				}
			}
		}()
		if del {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(delay)
				if err := p.node.CNI.Del(ctx, p.pod); err != nil {
					errs <- fmt.Errorf("DEL %s: %w", p.pod.ContainerID, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// What the survivors imply.
	wantToR := map[netip.Prefix]int{}
	wantKernel := map[*lab.LabNode]map[netip.Prefix][]string{}
	for _, n := range l.Nodes {
		wantToR[n.Summary6], wantToR[n.Summary4] = 1, 1
		wantKernel[n] = map[netip.Prefix][]string{}
	}
	anyNodes := map[netip.Addr]map[*lab.LabNode]bool{any6: {}, any4: {}}
	for _, p := range pods {
		if p.deleted {
			continue
		}
		v6, v4 := ipOf(p.ips, true), ipOf(p.ips, false)
		wantToR[host(v6)] = 1 // shared-pool address: a pod route while it exists
		if !p.ready {
			continue
		}
		wantToR[host(p.addr)] = 1
		anyNodes[any6][p.node], anyNodes[any4][p.node] = true, true
		k := wantKernel[p.node]
		k[host(p.addr)] = append(k[host(p.addr)], v6.String()+"%"+p.veth)
		k[host(any6)] = append(k[host(any6)], v6.String()+"%"+p.veth)
		k[host(any4)] = append(k[host(any4)], v4.String()+"%"+p.veth)
	}
	for ip, nodes := range anyNodes {
		if len(nodes) > 0 {
			wantToR[host(ip)] = len(nodes)
		}
	}
	for _, k := range wantKernel {
		for p := range k {
			slices.Sort(k[p])
		}
	}
	testutil.EventuallyWithin(t, 20*time.Second, "the ToR's table to equal what the surviving Ready pods imply", func() (bool, string) {
		got := birdTable(t, l)
		return fmt.Sprint(got) == fmt.Sprint(wantToR), fmt.Sprintf("\ngot  %v\nwant %v", got, wantToR)
	})
	for _, n := range l.Nodes {
		testutil.EventuallyWithin(t, 10*time.Second, n.Name+"'s kernel host routes to equal what its Ready pods imply", func() (bool, string) {
			got := kernelHostRoutes(t, n.NS)
			return fmt.Sprint(got) == fmt.Sprint(wantKernel[n]), fmt.Sprintf("\ngot  %v\nwant %v", got, wantKernel[n])
		})
		var st struct {
			Reconcilers []struct {
				Target  string `json:"target"`
				Failing bool   `json:"failing"`
			} `json:"reconcilers"`
		}
		flockctlJSON(t, n.Agent, &st, "status")
		if len(st.Reconcilers) != 2 {
			t.Errorf("%s: flockctl status shows reconcilers %+v", n.Name, st.Reconcilers)
		}
		for _, r := range st.Reconcilers {
			if r.Failing {
				t.Errorf("%s: reconciler %s failing after the storm", n.Name, r.Target)
			}
		}
	}
	t.Logf("storm: %d pods, %d deleted, ToR holds %d prefixes", len(pods), countIf(pods, func(p *rtPod) bool { return p.deleted }), len(wantToR))

	// A pod's netns destroyed while the agent runs, without a DEL (a
	// runtime that lost the sandbox): its veth goes, the kernel drops the
	// IPv4 ECMP route of every replica on that node; the agent notices the
	// veth, reaps the pod and puts the other replicas' route back.
	var lost *rtPod
	for _, p := range pods {
		if !p.deleted && p.ready {
			lost = p
			break
		}
	}
	if lost != nil {
		if err := lost.pod.NS.Delete(); err != nil {
			t.Fatal(err)
		}
		lost.deleted = true
		want := map[netip.Prefix][]string{}
		for p, nhs := range wantKernel[lost.node] {
			keep := slices.DeleteFunc(slices.Clone(nhs), func(nh string) bool { return strings.HasSuffix(nh, "%"+lost.veth) })
			if len(keep) > 0 {
				want[p] = keep
			}
		}
		start := time.Now()
		testutil.EventuallyWithin(t, 5*time.Second, "the node to route exactly the remaining Ready pods after a netns vanished", func() (bool, string) {
			got := kernelHostRoutes(t, lost.node.NS)
			return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("\ngot  %v\nwant %v", got, want)
		})
		testutil.EventuallyWithin(t, 5*time.Second, "the ToR to forget the vanished pod", func() (bool, string) {
			for _, p := range []netip.Prefix{host(ipOf(lost.ips, true)), host(lost.addr)} {
				if c := tr.paths(t, p); c != 0 {
					return false, fmt.Sprintf("ToR holds %s", p)
				}
			}
			return true, ""
		})
		t.Logf("netns lost while running: routes repaired %s after", time.Since(start).Round(time.Millisecond))
	}

	// The reboot case, on a surviving Ready pod if there is one.
	var victim *rtPod
	for _, p := range pods {
		if !p.deleted && (victim == nil || p.ready) {
			victim = p
		}
	}
	if victim == nil {
		t.Log("every pod was deleted; adding one for the reboot case")
		p, ips := addPod(t, l.Nodes[0], "rt-victim", "flock.fritzlab.net/addresses", "2001:db8:aa::999", "flock.fritzlab.net/cidr6", "2001:db8:100::100/120")
		victim = &rtPod{node: l.Nodes[0], pod: p, ips: ips, addr: netip.MustParseAddr("2001:db8:aa::999"), veth: dataplane.HostVethName("rt-victim"), ready: true}
	}
	n := victim.node
	if err := n.Agent.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := victim.pod.NS.Delete(); err != nil {
		t.Fatal(err)
	}
	_ = n.NS.Do(func(h *netlink.Handle) error {
		if l, err := h.LinkByName(victim.veth); err == nil {
			return h.LinkDel(l)
		}
		return nil
	})
	gone := []netip.Prefix{host(ipOf(victim.ips, true)), host(victim.addr)}
	for _, p := range gone {
		if tr.paths(t, p) == 0 && victim.ready {
			t.Fatalf("before the restart the ToR should still hold %s (graceful restart), or the test proves nothing", p)
		}
	}
	if err := n.Agent.Start(filepath.Join(binDir, "flock-agent"), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.EventuallyWithin(t, 2*time.Second, "the ToR and the node to forget the rebooted-away pod", func() (bool, string) {
		for _, p := range gone {
			if c := tr.paths(t, p); c != 0 {
				return false, fmt.Sprintf("ToR holds %s (%d paths)", p, c)
			}
		}
		for p, nhs := range kernelHostRoutes(t, n.NS) {
			for _, nh := range nhs {
				if strings.HasSuffix(nh, "%"+victim.veth) || strings.HasSuffix(nh, "%") {
					return false, fmt.Sprintf("node routes %s via %s", p, nh)
				}
			}
			if p == host(victim.addr) {
				return false, fmt.Sprintf("node routes %s", p)
			}
		}
		return true, ""
	})
	t.Logf("reboot case: routes gone %s after the agent answered", time.Since(start).Round(time.Millisecond))
	if m := scrape(t, n); !strings.Contains(m, `flock_allocations_reaped_total{reason="netns-gone"} 1`) {
		t.Errorf("metrics do not count the reaped allocation:\n%s", grepLines(m, "reaped"))
	}
	// The runtime's late DEL succeeds as a no-op.
	if err := n.CNI.Del(ctxT(t), victim.pod); err != nil {
		t.Errorf("late DEL of the reaped pod: %v", err)
	}
}

func countIf[T any](s []T, f func(T) bool) int {
	n := 0
	for _, x := range s {
		if f(x) {
			n++
		}
	}
	return n
}
