package agent_test

// The randomized model-based test of route truth: many goroutines run ADD
// (sometimes into the netns of a container just DELed, its veth maybe
// still being removed), DEL, CHECK, readiness reports (some of static
// pods, whose mirror kubelet re-creates with a new UID), claims deleted by
// hand and pod pool changes (sometimes over anycast and `addresses` IPs in
// use: model_pools_test.go) against one agent (real store in a temp
// dir, real node state and reconcile loops, fake kernel and speaker) while
// the dataplane, the speaker and the store fail at random; between rounds
// GC runs, the agent restarts (sometimes after a "crash" left a half-done
// ADD or a "reboot" took a pod's network namespace), and at every
// quiescent point the invariants are checked against an oracle computed
// from the workers' own knowledge, not from the agent's code:
//
//   - advertised paths == f(live attachments, readiness)
//   - kernel host routes == g(live attachments, readiness)
//   - no IP held by two containers (nor a pod address that is an anycast
//     or `addresses` IP in use); no veth name shared by two containers
//   - a deleted container owns nothing anywhere (state, store, veth,
//     kernel route, BGP path, IPAM, claims)
//
// Reproduce a failure with the printed seed:
//
//	go test -race -run Model ./agent/ -args -model.seed=N
//
// and run more seeds with -count=N (each run draws a new seed).

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	modelSeed    = flag.Uint64("model.seed", 0, "seed of TestModel (0: a new one each run)")
	modelSeeds   = flag.Int("model.seeds", 2, "seeds TestModel runs")
	modelRounds  = flag.Int("model.rounds", 4, "rounds (restart + checks) per seed")
	modelOps     = flag.Int("model.ops", 150, "operations per worker per round")
	modelWorkers = flag.Int("model.workers", 6, "concurrent workers")
)

func TestModel(t *testing.T) {
	for i := range *modelSeeds {
		seed := *modelSeed
		if seed == 0 {
			seed = rand.Uint64()
		} else if i > 0 {
			break
		}
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("seed %d (replay: go test -race -run Model ./agent/ -args -model.seed=%d)", seed, seed)
			m := newModel(t, seed)
			for round := range *modelRounds {
				m.round(round)
				m.quiesce()
				m.check(fmt.Sprintf("round %d", round))
				m.restart()
				m.check(fmt.Sprintf("after restart %d", round))
			}
			if t.Failed() {
				t.Logf("FAILED with seed %d", seed)
			}
		})
	}
}

// ctr is one container as its worker (the runtime) knows it.
type ctr struct {
	id string
	// pod as the runtime names it: a static pod by its static UID (the
	// API names it through its current mirror, see model.mirrors)
	pod   podmeta.ID
	netns string           // its sandbox's; sometimes one a DELed container had
	live  bool             // the last ADD succeeded and no DEL since
	dirty bool             // an op failed: the runtime owes a DEL
	gone  bool             // its sandbox (netns) was destroyed: never ADDed again
	rec   store.Allocation // from the last successful ADD
}

type model struct {
	t    *testing.T
	seed uint64
	e    *env
	rnd  *rand.Rand // for the coordinator only

	// chaos is on while the workers run; chaosMu is a leaf lock (the fakes
	// call roll while holding their own).
	chaosMu  sync.Mutex
	chaos    bool
	chaosRnd *rand.Rand
	mu       sync.Mutex
	ready    map[podmeta.ID]bool // the last report per pod (only its worker reports)
	// mirrors are the static pods' current mirror UIDs ("": deleted, not
	// yet re-created); only the pod's worker changes them
	mirrors map[podmeta.ID]string
	claims  *claimStore // the cluster's claims (this node is "node")
	ctrs    map[string]*ctr
	// deleted holds every container whose DEL (or GC, or reap) succeeded,
	// with its last allocation: it must own nothing anywhere.
	deleted map[string]store.Allocation
	nextID  int
	// pools are the pod pools besides shared6 (model_pools_test.go).
	poolsMu sync.Mutex
	pools   []netip.Prefix
}

var (
	modelAnycast = []string{"2001:db8:ff::1", "2001:db8:ff::2", "203.0.113.1"}
	modelAddrs   = []string{"2001:db8:aa::1", "2001:db8:aa::2", "2001:db8:aa::3", "198.51.100.7"}
)

func newModel(t *testing.T, seed uint64) *model {
	m := &model{t: t, seed: seed, rnd: rand.New(rand.NewPCG(seed, 0)), chaosRnd: rand.New(rand.NewPCG(seed, 1)),
		ready: map[podmeta.ID]bool{}, mirrors: map[podmeta.ID]string{}, ctrs: map[string]*ctr{}, deleted: map[string]store.Allocation{}, claims: newClaimStore()}
	m.e = m.newAgent(newFakeDP(), nil, "")
	m.e.st.KeepSpares(4) // as the daemon does: files made ahead race ADDs, DELs and restarts
	if err := m.e.run(); err != nil {
		t.Fatal(err)
	}
	return m
}

// newAgent builds the node's agent (on a fresh store dir, or reusing
// old's store and kernel): AddressPools authorize what the workers ask
// for, claims go to the shared claim store.
func (m *model) newAgent(dp *fakeDP, st *faultStore, dir string) *env {
	set, err := authz.Compile(modelPools())
	if err != nil {
		m.t.Fatal(err)
	}
	cfg := func(c *envConfig) {
		c.SettleTimeout = 200 * time.Millisecond
		c.Authority = authority{set}
		c.Claims = m.claims.node("node")
		c.Source = m
	}
	var e *env
	if st == nil {
		e = newEnv(m.t, withSpec(summariesOnly()), cfg)
	} else {
		e = &env{t: m.t, dp: dp, sp: newFakeSpeaker(), st: st, dir: dir}
		c := envConfig{Config: agent.Config{Spec: summariesOnly(), Store: st, Dataplane: dp, Source: podmeta.Standalone{}, Log: discard}}
		cfg(&c)
		e.build(c)
	}
	if _, err := e.state.SetPodPools(m.podPools()); err != nil {
		m.t.Fatal(err)
	}
	m.wire(e)
	return e
}

// modelPools allow the workers' pods (namespace default) everything they
// ask for.
func modelPools() []v1alpha1.AddressPool {
	mk := func(name string, cidrs, use []string) v1alpha1.AddressPool {
		return v1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.AddressPoolSpec{CIDRs: cidrs, Use: use, Namespaces: []string{"default"}}}
	}
	return []v1alpha1.AddressPool{
		mk("pods", []string{shared6.String()}, []string{"pod"}),
		mk("anycast", []string{"2001:db8:ff::/64", "203.0.113.0/28"}, []string{"anycast"}),
		mk("public", []string{"2001:db8:aa::/64", "2001:db8:bb::/64", "198.51.100.0/28"}, []string{"addresses"}),
		// Pod pools over addresses in use (model_pools_test.go).
		mk("pods-over-anycast", []string{overAnycast6.String(), overAnycast4.String()}, []string{"pod"}),
		mk("pods-over-public", []string{overAddrs6.String()}, []string{"pod"}),
	}
}

// wire connects an env's fakes to the model's chaos.
func (m *model) wire(e *env) {
	e.kernelLoop.Repair, e.bgpLoop.Repair = 20*time.Millisecond, 20*time.Millisecond
	e.dp.set(func(d *fakeDP) {
		d.fault = func(op string) error {
			if m.roll(map[string]float64{"setup": 0.05, "retire": 0.05, "teardown": 0.05, "route": 0.03, "read": 0.05}[op]) {
				return fmt.Errorf("chaos: %s failed", op)
			}
			return nil
		}
	})
	e.sp.set(func(f *fakeSpeaker) { f.fault = func() bool { return m.roll(0.03) } })
	e.st.fault = func(op string) error {
		if m.roll(0.02) {
			return fmt.Errorf("chaos: store %s failed", op)
		}
		return nil
	}
	m.claims.set(func(s *claimStore) {
		s.fault = func() bool { return m.roll(0.02) }
		s.lose = func() bool { return m.roll(0.02) } // a committed create whose answer is lost
	})
}

func (m *model) roll(p float64) bool {
	m.chaosMu.Lock()
	defer m.chaosMu.Unlock()
	return m.chaos && m.chaosRnd.Float64() < p
}

func (m *model) setChaos(on bool) {
	m.chaosMu.Lock()
	m.chaos = on
	m.chaosMu.Unlock()
}

// round runs the workers concurrently with chaos on.
func (m *model) round(round int) {
	m.setChaos(true)
	var wg sync.WaitGroup
	for w := range *modelWorkers {
		wg.Add(1)
		rnd := rand.New(rand.NewPCG(m.seed, uint64(1000*round+w+2)))
		go func() {
			defer wg.Done()
			m.worker(w, rnd)
		}()
	}
	wg.Wait()
	m.setChaos(false)
}

// worker owns its containers and pods: ops on one container never run
// concurrently, so the worker knows what each should own.
func (m *model) worker(w int, rnd *rand.Rand) {
	var mine []*ctr
	// freed are netns of containers this worker DELed: a runtime may ADD
	// a new container into one at once, while the old veth is still
	// being removed.
	var freed []string
	for _, c := range m.snapshotCtrs() {
		if strings.HasPrefix(c.id, fmt.Sprintf("w%d-", w)) {
			mine = append(mine, c)
		}
	}
	ctx := context.Background()
	for range *modelOps {
		switch op := rnd.IntN(100); {
		case op < 35 || len(mine) == 0: // ADD a new container (sometimes of an existing pod)
			c := m.newCtr(w, rnd, mine)
			if len(freed) > 0 && rnd.IntN(3) == 0 {
				c.netns, freed = freed[len(freed)-1], freed[:len(freed)-1]
			}
			mine = append(mine, c)
			m.add(ctx, c, rnd)
		case op < 45: // retried ADD of an existing container
			m.add(ctx, mine[rnd.IntN(len(mine))], rnd)
		case op < 70: // DEL
			c := mine[rnd.IntN(len(mine))]
			m.mu.Lock()
			wasLive := c.live
			m.mu.Unlock()
			if m.del(ctx, c) && wasLive {
				freed = append(freed, c.netns)
			}
		case op < 72: // the sandbox vanishes without a DEL; the agent is told
			i := rnd.IntN(len(mine))
			if m.vanish(ctx, mine[i]) {
				mine = slices.Delete(mine, i, i+1)
			}
		case op < 73: // someone deletes one of a live container's claims (kubectl)
			c := mine[rnd.IntN(len(mine))]
			m.mu.Lock()
			var ips []netip.Addr
			if c.live && !c.dirty {
				ips = append(slices.Clone(c.rec.IPs), c.rec.Addresses...)
			}
			m.mu.Unlock()
			for _, ip := range ips {
				if !pool6.Contains(ip) && !pool4.Contains(ip) {
					m.claims.drop(ip)
					m.e.a.ClaimsChanged() // the informer's delete event
					break
				}
			}
		case op < 74: // the pod pools change (an AddressPool event)
			m.changePools(rnd)
		case op < 77: // CHECK
			c := mine[rnd.IntN(len(mine))]
			m.mu.Lock()
			live := c.live && !c.dirty
			m.mu.Unlock()
			if live {
				if err := m.e.a.Check(ctx, c.id, "eth0", nil); err != nil {
					m.t.Errorf("CHECK of live %s: %v", c.id, err)
				}
			}
		case op < 80: // kubelet re-creates a static pod's mirror
			m.recreateMirror(mine[rnd.IntN(len(mine))].pod, rnd)
		default: // readiness report for one of my pods
			c := mine[rnd.IntN(len(mine))]
			r := rnd.IntN(2) == 0
			m.mu.Lock()
			id, ok := m.apiID(c.pod)
			if ok {
				m.ready[c.pod] = r
			}
			m.mu.Unlock()
			if ok {
				m.e.a.SetPodReady(id, r)
			}
		}
	}
}

// vanish destroys a live container's netns (and with it its veth) behind
// the agent's back, tells the agent as the link watch would, and runs the
// repair concurrently with the other workers: the container must be reaped.
// It reports whether the container is gone for good (the worker forgets it).
func (m *model) vanish(ctx context.Context, c *ctr) bool {
	m.mu.Lock()
	live := c.live && !c.dirty
	rec := c.rec
	m.mu.Unlock()
	if !live {
		return false
	}
	m.e.dp.set(func(d *fakeDP) {
		d.goneNetns[rec.Netns] = true
		delete(d.veths, rec.HostVeth)
		for p, nhs := range d.routes {
			live := slices.DeleteFunc(slices.Clone(nhs), func(nh dataplane.Nexthop) bool { return nh.Dev == rec.HostVeth })
			if len(live) == 0 || (p.Addr().Is4() && len(live) < len(nhs)) {
				delete(d.routes, p)
			} else {
				d.routes[p] = live
			}
		}
	})
	if m.e.kernel.LinkGone(rec.HostVeth) {
		m.e.kernelLoop.Kick()
	}
	m.e.a.ReapGone(ctx)
	_, _, still := m.e.state.Get(c.id)
	m.mu.Lock()
	defer m.mu.Unlock()
	c.gone = true // the worker never uses the ID again
	if still {
		// The reap lost to chaos (teardown or store failure): the runtime
		// DELs the dead sandbox (quiesce does).
		c.dirty = true
		return true
	}
	m.deleted[c.id] = rec
	c.live = false
	delete(m.ctrs, c.id)
	return true
}

func (m *model) snapshotCtrs() []*ctr {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Collect(maps.Values(m.ctrs))
	slices.SortFunc(out, func(a, b *ctr) int { return strings.Compare(a.id, b.id) })
	return out
}

func (m *model) newCtr(w int, rnd *rand.Rand, mine []*ctr) *ctr {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextID++
	c := &ctr{id: fmt.Sprintf("w%d-%04d", w, m.nextID)}
	c.netns = netnsOf(c.id)
	switch {
	case len(mine) > 0 && rnd.IntN(4) == 0:
		c.pod = mine[rnd.IntN(len(mine))].pod // a second attachment of a pod
	case rnd.IntN(4) == 0: // a static pod, and the mirror kubelet made of it
		c.pod = podmeta.ID{Namespace: "default", Name: "pod-" + c.id, UID: "static-" + c.id}
		m.mirrors[c.pod] = "mirror-" + c.id
	default:
		c.pod = podmeta.ID{Namespace: "default", Name: "pod-" + c.id, UID: "uid-" + c.id}
	}
	m.ctrs[c.id] = c
	return c
}

func (m *model) add(ctx context.Context, c *ctr, rnd *rand.Rand) {
	args := []string{"K8S_POD_UID=" + c.pod.UID}
	if rnd.IntN(3) == 0 {
		args = append(args, annotations.Anycast+"="+pick(rnd, modelAnycast, 1+rnd.IntN(2)))
	}
	if rnd.IntN(4) == 0 {
		args = append(args, annotations.Addresses+"="+pick(rnd, modelAddrs, 1))
	}
	args = append(args, rangeArgs(rnd)...)
	argStr := strings.Join(append([]string{"K8S_POD_NAMESPACE=" + c.pod.Namespace, "K8S_POD_NAME=" + c.pod.Name}, args...), ";")
	rec, err := m.e.a.Add(ctx, c.id, c.netns, "eth0", argStr)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if c.live && !c.dirty {
			// A retry of a committed ADD returns the allocation; an error
			// here would mean the agent lost a live container.
			if !strings.Contains(err.Error(), "chaos") {
				m.t.Errorf("retried ADD of live %s: %v", c.id, err)
			}
		}
		c.dirty = true // the runtime sends DEL after a failed ADD
		return
	}
	if c.live && !slices.Equal(rec.IPs, c.rec.IPs) {
		m.t.Errorf("retried ADD of %s returned IPs %v, first %v", c.id, rec.IPs, c.rec.IPs)
	}
	c.live, c.rec = true, rec
	delete(m.deleted, c.id)
}

func pick(rnd *rand.Rand, from []string, n int) string {
	var out []string
	for _, i := range rnd.Perm(len(from))[:n] {
		out = append(out, from[i])
	}
	return strings.Join(out, ",")
}

// del DELs c and reports whether the DEL succeeded.
func (m *model) del(ctx context.Context, c *ctr) bool {
	err := m.e.a.Del(ctx, c.id)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		c.dirty = true
		return false
	}
	m.deleted[c.id] = c.rec
	c.live, c.dirty = false, false
	return true
}

// quiesce turns chaos off and does what the runtime would: DEL every
// container with a failed op until it succeeds, and a GC that keeps a
// random part of the live ones.
func (m *model) quiesce() {
	ctx := context.Background()
	for _, c := range m.snapshotCtrs() {
		if c.dirty {
			m.del(ctx, c)
			if c.dirty {
				m.t.Fatalf("DEL of %s still fails with chaos off", c.id)
			}
		}
		if c.gone {
			m.mu.Lock()
			delete(m.ctrs, c.id)
			m.mu.Unlock()
		}
	}
	var valid []agent.Attachment
	var gone []*ctr
	for _, c := range m.snapshotCtrs() {
		if !c.live {
			continue
		}
		if m.rnd.IntN(10) == 0 {
			gone = append(gone, c)
			continue
		}
		valid = append(valid, agent.Attachment{ContainerID: c.id, IfName: "eth0"})
	}
	if err := m.e.a.GC(ctx, valid); err != nil {
		m.t.Fatalf("GC: %v", err)
	}
	// The veths DELs left to unregister are gone: what the invariants
	// check is the state after them.
	m.e.a.Wait()
	m.mu.Lock()
	for _, c := range gone {
		m.deleted[c.id] = c.rec
		c.live = false
	}
	m.mu.Unlock()
	// The periodic repair (claims deleted by hand come back; failed reaps
	// are finished) and the claim GC (this node's claims of containers it
	// does not hold: lost create answers, releases the API did not take).
	m.e.a.Repair(ctx)
	m.claims.gc("node", m.e.state.Holds)
	m.probeEventPath(ctx)
}

// probeEventPath: with nothing failing, ADD returns only after its routes
// are applied and DEL only after they are gone — checked at once, without
// waiting for the reconcilers.
func (m *model) probeEventPath(ctx context.Context) {
	t, e := m.t, m.e
	m.nextID++
	id := fmt.Sprintf("probe-%d", m.nextID)
	pod := podmeta.ID{Namespace: "default", Name: id, UID: "uid-" + id}
	addr := netip.MustParseAddr(fmt.Sprintf("2001:db8:bb::%x", m.nextID))
	p := netip.PrefixFrom(addr, 128)
	e.a.SetPodReady(pod, true)
	rec, err := e.a.Add(ctx, id, netnsOf(id), "eth0", "K8S_POD_NAMESPACE=default;K8S_POD_NAME="+id+";K8S_POD_UID="+pod.UID+";"+annotations.Addresses+"="+addr.String())
	if err != nil {
		t.Fatalf("probe ADD: %v", err)
	}
	if k := e.sp.Held()[p]; k != advert.Address {
		t.Errorf("ADD of %s returned before its path %s was in the speaker (%q)", id, p, k)
	}
	if nhs := e.dp.kernelRoutes()[p]; len(nhs) != 1 || nhs[0].Dev != rec.HostVeth {
		t.Errorf("ADD of %s returned before its kernel route %s (%v)", id, p, nhs)
	}
	if err := e.a.Del(ctx, id); err != nil {
		t.Fatalf("probe DEL: %v", err)
	}
	if _, ok := e.sp.Held()[p]; ok {
		t.Errorf("DEL of %s returned with its path %s still in the speaker", id, p)
	}
	if _, ok := e.dp.kernelRoutes()[p]; ok {
		t.Errorf("DEL of %s returned with its kernel route %s", id, p)
	}
	e.a.Wait()
	if e.dp.hasVeth(rec.HostVeth) {
		t.Errorf("veth %s of %s still there once the removals finished", rec.HostVeth, id)
	}
	e.a.ForgetPod(pod)
}

// restart stops the agent and starts a new one on the same store and
// kernel (a fresh speaker: GoBGP starts empty), after maybe leaving crash
// debris: a half-done ADD, and a pod whose netns vanished (a reboot).
func (m *model) restart() {
	old := m.e
	old.stop()
	if m.rnd.IntN(2) == 0 {
		id := fmt.Sprintf("crash-%d", m.rnd.IntN(1<<30))
		veth := dataplane.HostVethName(id)
		putRecord(m.t, old.dir, store.Allocation{ContainerID: id, State: store.Pending, HostVeth: veth,
			Pod: podmeta.ID{Namespace: "default", Name: id}, IPs: []netip.Addr{mustAddr("fd00:10:1::dead")}})
		old.dp.addVeth(veth)
		m.mu.Lock()
		m.deleted[id] = store.Allocation{ContainerID: id, HostVeth: veth, IPs: []netip.Addr{mustAddr("fd00:10:1::dead")}}
		m.mu.Unlock()
	}
	if live := m.liveCtrs(); len(live) > 0 && m.rnd.IntN(2) == 0 {
		c := live[m.rnd.IntN(len(live))]
		old.dp.set(func(d *fakeDP) {
			d.goneNetns[c.rec.Netns] = true
			delete(d.veths, c.rec.HostVeth) // the netns took the veth with it
		})
		m.mu.Lock()
		m.deleted[c.id] = c.rec
		c.live = false
		delete(m.ctrs, c.id) // its sandbox is gone: the runtime never uses the ID again
		m.mu.Unlock()
	}
	if m.rnd.IntN(2) == 0 {
		// A crash between a claim and its record: nobody owns the claim.
		_ = m.claims.node("node").Claim(context.Background(), agent.Claim{IP: mustAddr("2001:db8:aa::ffff"), Use: "addresses", ContainerID: "crashed-before-record"})
	}
	e := m.newAgent(old.dp, old.st, old.dir)
	// Kubernetes mode: the informer reports readiness before restore,
	// static pods' through mirrors kubelet may have re-created meanwhile.
	m.mu.Lock()
	static := slices.SortedFunc(maps.Keys(m.mirrors), func(a, b podmeta.ID) int { return strings.Compare(a.Name, b.Name) })
	for _, pod := range static {
		if m.rnd.IntN(3) == 0 {
			m.newMirror(pod, m.rnd)
		}
	}
	for p, r := range m.ready {
		if id, ok := m.apiID(p); ok {
			e.a.SetPodReady(id, r)
		}
	}
	m.mu.Unlock()
	if err := e.run(); err != nil {
		m.t.Fatalf("restart: %v", err)
	}
	m.e = e
}

func (m *model) liveCtrs() []*ctr {
	var out []*ctr
	for _, c := range m.snapshotCtrs() {
		m.mu.Lock()
		if c.live {
			out = append(out, c)
		}
		m.mu.Unlock()
	}
	return out
}
