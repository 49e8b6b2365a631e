package agent_test

// Regression tests for the route-truth defects of issue 7: each fails on
// the agent that published routes imperatively from Add, Del, SetPodReady
// and Start, and passes now that routes are derived from the node state.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

func podID(id string) podmeta.ID {
	return podmeta.ID{Namespace: "default", Name: "pod-" + id, UID: "uid-" + id}
}

func (e *env) addPod(id string, extra ...string) store.Allocation {
	e.t.Helper()
	return e.mustAdd(id, append([]string{"K8S_POD_UID=uid-" + id}, extra...)...)
}

// Defect 1: restore ran without the lock while the informer's readiness
// events and `flockctl pods` already ran: concurrent map writes. Now the
// state has one lock; under -race this test hammers it during Restore.
func TestRestoreConcurrentWithReadinessAndReads(t *testing.T) {
	e := newEnv(t)
	const n = 200
	for i := range n {
		id := fmt.Sprintf("r%03d", i)
		putRecord(t, e.dir, store.Allocation{
			ContainerID: id, State: store.Committed, Pod: podID(id),
			IPs:     []netip.Addr{netip.MustParseAddr(fmt.Sprintf("fd00:10:1::%x", i+1))},
			Anycast: []netip.Addr{netip.MustParseAddr("2001:db8:ff::1")},
		})
		e.dp.addVeth(dataplane.HostVethName(id))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("r%03d", (i*7+w)%n)
				e.a.SetPodReady(podID(id), i%2 == 0)
				e.a.Allocations()
				e.a.PodAllocations(podID(id))
				e.state.Attachments()
				e.state.HostRoutes()
			}
		}()
	}
	err := e.run()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// The last word: every pod Ready; all of them route the anycast IP.
	for i := range n {
		e.a.SetPodReady(podID(fmt.Sprintf("r%03d", i)), true)
	}
	e.settled()
	if nhs := e.dp.kernelRoutes()[netip.MustParsePrefix("2001:db8:ff::1/128")]; len(nhs) != n {
		t.Errorf("anycast route has %d next hops, want %d", len(nhs), n)
	}
}

// Defect 2: a readiness report arriving while DEL tears the veth down
// re-published the deleted container: its paths stayed in BGP, its kernel
// route pointed through a dead veth, and the other replica's ECMP route
// then failed to program.
func TestReadinessDuringDelDoesNotResurrect(t *testing.T) {
	s := testSpec()
	s.Pools[2].Namespaces = nil // the shared pool: its pods are advertised as /128
	e := started(t, withSpec(s))
	const any = "2001:db8:ff::1"
	anyP := netip.MustParsePrefix(any + "/128")
	shared := annotations.CIDR6 + "=2001:db8:100::/120"
	r1 := e.mustAdd("c1", "K8S_POD_UID=uid-c1", annotations.Anycast+"="+any, shared)
	e.mustAdd("c2", "K8S_POD_UID=uid-c2", annotations.Anycast+"="+any)
	if _, ok := e.sp.Held()[netip.PrefixFrom(r1.IPs[0], 128)]; !ok {
		t.Fatalf("c1's %s is not advertised", r1.IPs[0])
	}
	for _, id := range []string{"c1", "c2"} {
		e.a.SetPodReady(podmeta.ID{Namespace: "default", Name: "pod-" + id, UID: "uid-" + id}, true)
	}
	e.settled()
	if nhs := e.dp.kernelRoutes()[anyP]; len(nhs) != 2 {
		t.Fatalf("before DEL: %d next hops, want 2", len(nhs))
	}
	// Readiness flaps while DEL tears c1's veth down; by then no route may
	// name the veth any more (IPv4 ECMP routes die with any of their
	// devices, taking the other replicas with them).
	e.dp.set(func(d *fakeDP) {
		d.onTeardown = func(veth string) {
			for p, nhs := range e.dp.kernelRoutes() {
				if slices.ContainsFunc(nhs, func(n dataplane.Nexthop) bool { return n.Dev == veth }) {
					t.Errorf("teardown of %s while kernel route %s still uses it", veth, p)
				}
			}
			for _, r := range []bool{false, true, true} {
				e.a.SetPodReady(podmeta.ID{Namespace: "default", Name: "pod-c1", UID: "uid-c1"}, r)
			}
		}
	})
	if err := e.a.Del(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	e.dp.set(func(d *fakeDP) { d.onTeardown = nil })
	e.settled()
	pod1 := netip.PrefixFrom(r1.IPs[0], 128)
	if k, ok := e.sp.Held()[pod1]; ok {
		t.Errorf("deleted container's %s still advertised (%s)", pod1, k)
	}
	nhs := e.dp.kernelRoutes()[anyP]
	if len(nhs) != 1 || nhs[0].Dev == r1.HostVeth {
		t.Errorf("after DEL the anycast route is via %v, want c2 only", nhs)
	}
	// A third replica programs fine: no next hop names a dead device.
	r3 := e.mustAdd("c3", "K8S_POD_UID=uid-c3", annotations.Anycast+"="+any)
	e.a.SetPodReady(podmeta.ID{Namespace: "default", Name: "pod-c3", UID: "uid-c3"}, true)
	e.settled()
	if nhs := e.dp.kernelRoutes()[anyP]; len(nhs) != 2 || !slices.ContainsFunc(nhs, func(n dataplane.Nexthop) bool { return n.Dev == r3.HostVeth }) {
		t.Errorf("with c2 and c3 Ready the route is via %v", nhs)
	}
	if st := e.kernelLoop.Status(); st.Failing {
		t.Errorf("kernel reconciler failing: %s", st.LastError)
	}
}

// Defect 3: a readiness report landing between ADD's read and its publish
// was lost (1000 pods, 23 advertised although their last report was
// NotReady). Now ADD does not read readiness at all.
func TestLastReadinessWinsUnderConcurrentAdds(t *testing.T) {
	e := started(t)
	const n = 1000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(2)
		id := fmt.Sprintf("p%04d", i)
		any := fmt.Sprintf("2001:db8:ff::%x", i+1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := e.add(id, "K8S_POD_UID=uid-"+id, annotations.IPv4+"=false", annotations.Anycast+"="+any); err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			e.a.SetPodReady(podID(id), true)
			e.a.SetPodReady(podID(id), false)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e.settled()
	var advertised []netip.Prefix
	for p, k := range e.sp.Held() {
		if k == advert.Anycast {
			advertised = append(advertised, p)
		}
	}
	if len(advertised) != 0 || len(e.dp.kernelRoutes()) != 0 {
		t.Errorf("%d anycast paths advertised and %d kernel routes although every pod's last report was NotReady", len(advertised), len(e.dp.kernelRoutes()))
	}
}

// Defect 4: Resync kept an existing kernel route whose members were all
// NotReady; DEL never removed it; flockctl did not show it.
func TestNotReadyRouteRemovedAcrossRestart(t *testing.T) {
	e := started(t)
	anyP := netip.MustParsePrefix("2001:db8:ff::1/128")
	r := e.addPod("c1", annotations.Anycast+"=2001:db8:ff::1")
	e.a.SetPodReady(podID("c1"), true)
	e.settled()
	if len(e.dp.kernelRoutes()[anyP]) != 1 {
		t.Fatal("no anycast route while Ready")
	}
	e.stop()

	// Restart: same store and kernel; the pod is NotReady now.
	e2 := &env{t: t, dp: e.dp, sp: e.sp, st: e.st, dir: e.dir}
	e2.build(envConfig{Config: e.cfgFor(e2)})
	e2.a.SetPodReady(podID("c1"), false)
	if err := e2.run(); err != nil {
		t.Fatal(err)
	}
	e2.settled()
	if nhs := e2.dp.kernelRoutes()[anyP]; len(nhs) != 0 {
		t.Errorf("after a restart with the pod NotReady the kernel still routes %s via %v", anyP, nhs)
	}
	if _, ok := e2.kernel.Installed()[anyP]; ok {
		t.Error("the kernel target (flockctl routes) still lists the route")
	}
	if err := e2.a.Del(context.Background(), r.ContainerID); err != nil {
		t.Fatal(err)
	}
	e2.settled()
	if len(e2.dp.kernelRoutes()) != 0 {
		t.Errorf("routes left after DEL: %v", e2.dp.kernelRoutes())
	}
}

// cfgFor is the agent config of a restarted env sharing e's store and fakes.
func (e *env) cfgFor(next *env) agent.Config {
	return agent.Config{Spec: testSpec(), Store: next.st, Dataplane: next.dp, Source: podmeta.Standalone{}, Log: discard}
}

// Defect 5: a failed kernel route was only logged, repaired only at start.
func TestFailedKernelRouteIsRetried(t *testing.T) {
	e := started(t, readyOnCommit())
	e.dp.set(func(d *fakeDP) { d.routeErrs = 3 })
	e.mustAdd("c1", annotations.Anycast+"=2001:db8:ff::1")
	anyP := netip.MustParsePrefix("2001:db8:ff::1/128")
	testutil.Eventually(t, "the kernel route after injected failures", func() (bool, string) {
		return len(e.dp.kernelRoutes()[anyP]) == 1, fmt.Sprint(e.dp.kernelRoutes())
	})
	st := e.kernelLoop.Status()
	if st.Errors < 3 || st.LastError == "" || !strings.Contains(st.LastError, "injected") {
		t.Errorf("kernel reconciler status %+v, want >= 3 errors and the last one kept", st)
	}
	testutil.Eventually(t, "the reconciler to report healthy", func() (bool, string) {
		st := e.kernelLoop.Status()
		return !st.Failing, st.LastError
	})
}

// Defect 6: a CNI GC without cni.dev/valid-attachments deleted every
// allocation on the node. Now it is refused; present and empty means
// nothing is valid.
func TestGCWithoutValidAttachmentsIsRefused(t *testing.T) {
	e := started(t)
	for _, id := range []string{"a", "b"} {
		e.mustAdd(id)
	}
	resp := e.a.Handle(context.Background(), wire.Request{Op: wire.OpGC, Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"n","type":"flock"}`)})
	if resp.Error == nil || resp.Error.Code != types.ErrInvalidNetworkConfig || !strings.Contains(resp.Error.Msg, "cni.dev/valid-attachments") {
		t.Fatalf("GC without the key: %+v, want a config error naming cni.dev/valid-attachments", resp.Error)
	}
	if ids := e.allocIDs(); !slices.Equal(ids, []string{"a", "b"}) {
		t.Fatalf("GC without the key deleted allocations: %v left", ids)
	}
	resp = e.a.Handle(context.Background(), wire.Request{Op: wire.OpGC, Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"n","type":"flock","cni.dev/valid-attachments":[]}`)})
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	if ids := e.allocIDs(); len(ids) != 0 {
		t.Errorf("GC with an empty list left %v", ids)
	}
	e.wantUsed(pool6, 0)
}

// Defect 7: host veth names are FNV-1a-32 of the container ID; two live
// containers could map to one name, and the second ADD deleted the first
// pod's veth.
func TestVethNameCollision(t *testing.T) {
	const a = "58f27bf389c567fca8c050f22296867ab2988d2ceac9db1f221a7f81d4b543f8"
	const b = "0c1df161b849d5106aeedf577d436325ba1c4a31a47a55fbaca730fe869437fe"
	if dataplane.HostVethName(a) != dataplane.HostVethName(b) {
		t.Fatal("test IDs no longer collide")
	}
	e := started(t)
	ra := e.mustAdd(a)
	rb := e.mustAdd(b)
	if ra.HostVeth == rb.HostVeth {
		t.Fatalf("both containers use %s", ra.HostVeth)
	}
	if !e.dp.hasVeth(ra.HostVeth) || !e.dp.hasVeth(rb.HostVeth) {
		t.Fatal("a veth is missing after both ADDs")
	}
	if e.dp.count("Teardown "+ra.HostVeth) != 0 {
		t.Error("the second ADD tore the first pod's veth down")
	}
	recs := e.records()
	for _, r := range recs {
		if r.ContainerID == b && r.HostVeth != rb.HostVeth {
			t.Errorf("store records %s for %s, the pod uses %s", r.HostVeth, b, rb.HostVeth)
		}
	}
	// CHECK and DEL of one leave the other alone.
	if err := e.a.Check(context.Background(), b, "eth0", nil); err != nil {
		t.Fatal(err)
	}
	if err := e.a.Del(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	e.a.Wait()
	if !e.dp.hasVeth(ra.HostVeth) || e.dp.hasVeth(rb.HostVeth) {
		t.Errorf("after DEL of %s: veth %s present %v, %s present %v", b, ra.HostVeth, e.dp.hasVeth(ra.HostVeth), rb.HostVeth, e.dp.hasVeth(rb.HostVeth))
	}
	// A DEL of the (now unknown) colliding ID must not take a's veth.
	if err := e.a.Del(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if !e.dp.hasVeth(ra.HostVeth) {
		t.Error("DEL of an unknown colliding container removed another pod's veth")
	}
	// A restart restores the recorded names.
	e.mustAdd(b)
	e.stop()
	e2 := &env{t: t, dp: e.dp, sp: e.sp, st: e.st, dir: e.dir}
	e2.build(envConfig{Config: e.cfgFor(e2)})
	if err := e2.run(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a, b} {
		r, _, ok := e2.state.Get(id)
		if !ok || !e2.dp.hasVeth(r.HostVeth) {
			t.Errorf("after restart %s has veth %q (present %v)", id, r.HostVeth, ok && e2.dp.hasVeth(r.HostVeth))
		}
	}
}

// Defect 13: the agent allowed 256-byte container IDs, the store 234: an
// ID of 235–256 bytes failed in the store as an internal error. One rule.
func TestContainerIDLengthIsOneRule(t *testing.T) {
	e := started(t)
	ok := strings.Repeat("a", 234)
	if _, err := e.add(ok); err != nil {
		t.Fatalf("234-byte ID: %v", err)
	}
	for _, n := range []int{235, 256} {
		id := strings.Repeat("b", n)
		_, err := e.add(id)
		if err == nil {
			t.Fatalf("%d-byte ID accepted", n)
		}
		if code := cniCode(t, err); code != types.ErrInvalidEnvironmentVariables {
			t.Errorf("%d-byte ID: code %d, want %d (%v)", n, code, types.ErrInvalidEnvironmentVariables, err)
		}
		if !strings.Contains(err.Error(), "CNI_CONTAINERID") || !strings.Contains(err.Error(), "234") {
			t.Errorf("%d-byte ID: error %q does not name CNI_CONTAINERID and the limit", n, err)
		}
		e.wantNothingFor(id)
		if err := e.a.Del(context.Background(), id); err == nil {
			t.Errorf("DEL of a %d-byte ID accepted", n)
		}
	}
	e.wantUsed(pool6, 1)
}

// Defect 16: after a reboot, records whose netns no longer exists were
// restored and their routes advertised until the runtime's DEL.
func TestNetnsGoneIsReaped(t *testing.T) {
	var reaped []string
	var mu sync.Mutex
	count := func(c *envConfig) {
		c.Reaped = func(r string) { mu.Lock(); reaped = append(reaped, r); mu.Unlock() }
	}
	e := newEnv(t, readyOnCommit(), count)
	putRecord(t, e.dir, store.Allocation{ContainerID: "alive", State: store.Committed, Pod: podID("alive"),
		IPs: []netip.Addr{mustAddr("2001:db8:100::5")}})
	putRecord(t, e.dir, store.Allocation{ContainerID: "gone", State: store.Committed, Pod: podID("gone"),
		IPs: []netip.Addr{mustAddr("2001:db8:100::6")}, Anycast: []netip.Addr{mustAddr("2001:db8:ff::1")}})
	e.dp.addVeth(dataplane.HostVethName("alive"))
	e.dp.set(func(d *fakeDP) { d.goneNetns[netnsOf("gone")] = true })
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	e.settled()
	if ids := e.allocIDs(); !slices.Equal(ids, []string{"alive"}) {
		t.Errorf("allocations after start = %v, want [alive]", ids)
	}
	if ids := e.recordIDs(); !slices.Equal(ids, []string{"alive"}) {
		t.Errorf("records after start = %v, want [alive]", ids)
	}
	held := e.sp.Held()
	if _, ok := held[netip.MustParsePrefix("2001:db8:100::6/128")]; ok {
		t.Error("the reaped pod's address is advertised")
	}
	if _, ok := held[netip.MustParsePrefix("2001:db8:ff::1/128")]; ok {
		t.Error("the reaped pod's anycast is advertised")
	}
	if _, ok := held[netip.MustParsePrefix("2001:db8:100::5/128")]; !ok {
		t.Error("the live pod's address is not advertised")
	}
	// In the periodic repair: the live one's netns vanishes too.
	e.dp.set(func(d *fakeDP) { d.goneNetns[netnsOf("alive")] = true })
	e.a.ReapGone(context.Background())
	e.settled()
	if ids := e.allocIDs(); len(ids) != 0 {
		t.Errorf("allocations after the repair = %v", ids)
	}
	if _, ok := e.sp.Held()[netip.MustParsePrefix("2001:db8:100::5/128")]; ok {
		t.Error("reaped in the repair but still advertised")
	}
	if e.dp.hasVeth(dataplane.HostVethName("alive")) {
		t.Error("the reaped pod's veth is left")
	}
	e.wantUsed(netip.MustParsePrefix("2001:db8:100::/120"), 0)
	mu.Lock()
	if !slices.Equal(reaped, []string{"netns-gone", "netns-gone"}) {
		t.Errorf("reaped reasons %v", reaped)
	}
	mu.Unlock()
	// The runtime's late DEL is a no-op that succeeds.
	for _, id := range []string{"gone", "alive"} {
		if err := e.a.Del(context.Background(), id); err != nil {
			t.Errorf("DEL of reaped %s: %v", id, err)
		}
	}
}

// A veth that vanishes without a DEL (its netns destroyed) is checked at
// once: the allocation is reaped without waiting for the periodic repair.
func TestVethGoneReapsAtOnce(t *testing.T) {
	e := newEnv(t, readyOnCommit(), func(c *envConfig) { c.ReapInterval = time.Hour })
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	r := e.mustAdd("c1", annotations.Anycast+"=2001:db8:ff::1")
	e.mustAdd("c2", annotations.Anycast+"=2001:db8:ff::1")
	// The veth of c2 goes, its netns is alive: nothing to reap.
	e.a.VethGone(dataplane.HostVethName("c2"))
	// c1's netns is destroyed, its veth with it.
	e.dp.set(func(d *fakeDP) {
		d.goneNetns[r.Netns] = true
		delete(d.veths, r.HostVeth)
	})
	e.a.VethGone(r.HostVeth)
	testutil.Eventually(t, "c1 to be reaped", func() (bool, string) {
		_, _, ok := e.state.Get("c1")
		return !ok, fmt.Sprint(e.allocIDs())
	})
	if _, _, ok := e.state.Get("c2"); !ok {
		t.Error("c2, whose netns is alive, was reaped")
	}
	e.settled()
	if nhs := e.dp.kernelRoutes()[netip.MustParsePrefix("2001:db8:ff::1/128")]; len(nhs) != 1 || nhs[0].Dev != dataplane.HostVethName("c2") {
		t.Errorf("anycast route via %v, want c2 only", nhs)
	}
}
