package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// The crash storm's shape. CI runs the defaults; FLOCK_CRASH_ROUNDS lowers
// the rounds for local iteration, FLOCK_SEED replays a run.
const (
	crashRounds   = 20
	crashPods     = 200              // new pods per round
	crashWorkers  = 8                // concurrent CNI calls, like a runtime starting a burst of sandboxes
	crashKeep     = 0.25             // share of a round's new pods that outlive it
	crashOldDel   = 0.5              // chance a pod of an earlier round is deleted: ~100 live, within the /24
	crashSettle   = 30 * time.Second // quiescent point → every invariant holds
	crashOpBudget = 90 * time.Second // one op, retries included
)

// A storm pod's kind decides what it asks for, and so which routes it owns.
type crashKind int

const (
	crashDual    crashKind = iota // both families from the node's summaries
	crashV6Only                   // ipv4=false
	crashShared                   // cidr6 from the lab's use-pod AddressPool: its own /128 at the ToR
	crashAddress                  // an `addresses` IP: a gateway route on the node, a /128 at the ToR
	crashAnycast                  // the shared anycast pair: ECMP on the node, one path at the ToR
)

var (
	crashSharedRange = netip.MustParsePrefix("2001:db8:100::/112") // lab-pods
	crashAny6        = netip.MustParseAddr("2001:db8:a::1")
	crashAny4        = netip.MustParseAddr("203.0.113.1")
)

// crashPod is one pod of the storm. A worker owns it during a round; the
// test reads it only after every worker is done.
type crashPod struct {
	id   string // the current sandbox's container ID
	kind crashKind
	addr netip.Addr // its `addresses` IP (crashAddress), unique in the run
	// newSandbox: an ADD that met the dead agent is handled as containerd
	// does (DEL of the failed sandbox, then ADD of a new one with a new
	// container ID and netns) rather than retried in place as kubelet
	// retries a CNI call. The failed sandbox's ADD may have been committed,
	// or left pending, by the killed agent: only its DEL cleans it up.
	newSandbox bool
	abandoned  []lab.Pod // failed sandboxes, DELed
	pod        lab.Pod
	ips        []netip.Addr // eth0 pod IPs of the successful ADD, IPv6 first
	live       bool
}

func (p *crashPod) args() [][2]string {
	switch p.kind {
	case crashV6Only:
		return lab.PodArgs("default", p.id, "flock.fritzlab.net/ipv4", "false")
	case crashShared:
		return lab.PodArgs("default", p.id, "flock.fritzlab.net/cidr6", crashSharedRange.String())
	case crashAddress:
		return lab.PodArgs("default", p.id, "flock.fritzlab.net/addresses", p.addr.String())
	case crashAnycast:
		return lab.PodArgs("default", p.id, "flock.fritzlab.net/anycast", crashAny6.String()+","+crashAny4.String())
	}
	return lab.PodArgs("default", p.id)
}

func (p *crashPod) addresses() []netip.Addr {
	if p.kind == crashAddress {
		return []netip.Addr{p.addr}
	}
	return nil
}

type crashJob struct {
	p        *crashPod
	add, del bool
}

// crashTotals are the run's figures.
type crashTotals struct {
	adds, dels, kills       int
	addsRetried, addRetries int // ADDs that failed because of a kill, and their extra attempts
	newSandboxes            int // of them, redone as a new sandbox after a DEL
	delsRetried, delRetries int
	inFlightAtKill          int // CNI calls under way at the SIGKILLs
	interruptedAdds         int // pending records the restarted agent tore down
	leaks, dups             int
	maxReady, maxConverge   time.Duration
	storm, checks           time.Duration
}

// crashRound runs one round's jobs against the node while a killer
// SIGKILLs and restarts its agent.
type crashRound struct {
	l *lab.BGPLab
	n *lab.LabNode

	mu                 sync.Mutex
	downFrom, downTill time.Time // the agent's outage; downTill zero while it is down
	spaces             map[string]*lab.NS

	inFlight                atomic.Int32
	addsRetried, addRetries atomic.Int64
	newSandboxes            atomic.Int64
	delsRetried, delRetries atomic.Int64
	adds, dels              atomic.Int64

	killedInFlight int
	ready          time.Duration
}

// overlapsOutage tells whether an attempt that ran from start to end can
// have met the dead agent.
func (r *crashRound) overlapsOutage(start, end time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.downFrom.IsZero() {
		return false
	}
	till := r.downTill
	if till.IsZero() {
		till = end
	}
	return !start.After(till) && !end.Before(r.downFrom)
}

// errOutage ends attempt at the first failure the outage explains.
var errOutage = errors.New("the agent was down")

// attempt runs op until it succeeds. Only the agent's absence is retried:
// "not running" (the socket is dead) or an I/O failure (the connection
// dropped mid-request), and only when the attempt overlapped the outage.
// Any other failure, or one while the agent was up, is the test's error.
// With once, the first failure the outage explains returns errOutage.
func (r *crashRound) attempt(ctx context.Context, what string, once bool, op func() error) (retries int, err error) {
	for {
		start := time.Now()
		err := op()
		if err == nil {
			return retries, nil
		}
		var te *types.Error
		if !errors.As(err, &te) || (te.Code != types.ErrTryAgainLater && te.Code != types.ErrIOFailure) {
			return retries, fmt.Errorf("%s: %w", what, err)
		}
		if !r.overlapsOutage(start, time.Now()) {
			return retries, fmt.Errorf("%s failed while the agent was up: %w", what, err)
		}
		if once {
			return retries, fmt.Errorf("%s: %w: %w", what, errOutage, err)
		}
		retries++
		select {
		case <-ctx.Done():
			return retries, fmt.Errorf("%s: still failing after %d retries: %w", what, retries, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (r *crashRound) run(ctx context.Context, j crashJob) error {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	ctx, cancel := context.WithTimeout(ctx, crashOpBudget)
	defer cancel()
	p := j.p
	if j.add {
		if err := r.add(ctx, p, p.newSandbox); errors.Is(err, errOutage) {
			// containerd: tear the failed sandbox down, then a new one.
			if err := r.del(ctx, p); err != nil {
				return err
			}
			r.newSandboxes.Add(1)
			p.abandoned = append(p.abandoned, p.pod)
			p.id += "-b"
			if err := r.add(ctx, p, false); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
	}
	if j.del {
		if err := r.del(ctx, p); err != nil {
			return err
		}
		p.live = false
	}
	return nil
}

// add creates p's sandbox netns and ADDs it, retrying in place (once:
// see attempt).
func (r *crashRound) add(ctx context.Context, p *crashPod, once bool) error {
	ns, err := lab.NewNS(randName("flkc-"))
	if err != nil {
		return fmt.Errorf("netns for %s: %w", p.id, err)
	}
	r.mu.Lock()
	r.spaces[p.id] = ns
	r.mu.Unlock()
	p.pod = lab.Pod{ContainerID: p.id, NS: ns, Args: p.args()}
	var res types.Result
	n, err := r.attempt(ctx, "ADD "+p.id, once, func() (err error) {
		res, err = r.n.CNI.Add(ctx, p.pod)
		return err
	})
	r.adds.Add(1)
	if n > 0 || errors.Is(err, errOutage) {
		r.addsRetried.Add(1)
		r.addRetries.Add(int64(n))
	}
	if err != nil {
		return err
	}
	ips, err := resultIPs(res)
	if err != nil {
		return fmt.Errorf("ADD %s: %w", p.id, err)
	}
	if want := len(p.addresses()); len(ips) < want || !slices.Equal(ips[len(ips)-want:], p.addresses()) {
		return fmt.Errorf("ADD %s: result %v does not end with its addresses %v", p.id, ips, p.addresses())
	}
	p.ips, p.live = ips[:len(ips)-len(p.addresses())], true
	return nil
}

// del DELs p's current sandbox, retrying until it succeeds.
func (r *crashRound) del(ctx context.Context, p *crashPod) error {
	n, err := r.attempt(ctx, "DEL "+p.id, false, func() error { return r.n.CNI.Del(ctx, p.pod) })
	r.dels.Add(1)
	if n > 0 {
		r.delsRetried.Add(1)
		r.delRetries.Add(int64(n))
	}
	return err
}

// kill SIGKILLs the agent once trigger fires (plus jitter, so the kill
// lands anywhere inside an operation) and restarts it at once, as kubelet
// would restart a crashed DaemonSet pod.
func (r *crashRound) kill(trigger <-chan struct{}, jitter time.Duration) error {
	<-trigger
	time.Sleep(jitter)
	r.killedInFlight = int(r.inFlight.Load())
	r.mu.Lock()
	r.downFrom = time.Now()
	r.mu.Unlock()
	err := r.n.Agent.Kill()
	start := time.Now()
	if err == nil {
		err = r.l.StartAgent(r.n)
	}
	r.ready = time.Since(start)
	r.mu.Lock()
	r.downTill = time.Now()
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kill and restart the agent: %w", err)
	}
	return nil
}

// resultIPs is podIPs for goroutines.
func resultIPs(r types.Result) ([]netip.Addr, error) {
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ip := range res.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return nil, fmt.Errorf("bad IP in result: %v", ip.Address)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// TestCrashStorm: one node behind a BIRD ToR (graceful restart on, as
// shipped). Every round 200 new pods are added by 8 concurrent workers
// through libcni, three quarters of them deleted again, and half of the
// survivors of earlier rounds deleted, while the agent is SIGKILLed at a
// random moment and restarted at once. Calls that fail because the agent
// was dead are retried until they succeed: in place, as kubelet retries a
// CNI call, or (half the pods) as containerd redoes a failed sandbox, DEL
// then ADD of a new one. At the quiescent point after each round the node
// holds exactly what the live pods imply — veths, kernel routes, store
// records, IPAM usage, per-node claims, the pods' own interfaces — so no
// deleted sandbox holds anything, no IP is held twice, and the ToR holds
// exactly the node's advertisements. Finally every pod is deleted and
// nothing but the summaries may remain.
func TestCrashStorm(t *testing.T) {
	rounds := crashRounds
	if s := os.Getenv("FLOCK_CRASH_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("FLOCK_CRASH_ROUNDS=%q: want a positive number", s)
		}
		rounds = v
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FLOCK_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FLOCK_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay: FLOCK_SEED=%d), %d rounds × %d pods, %d workers", seed, seed, rounds, crashPods, crashWorkers)
	rnd := rand.New(rand.NewPCG(seed, 0))

	l := newLab(t, 1, nil)
	if err := l.StartBird(lab.BirdOptions{GR: true}); err != nil {
		t.Fatal(err)
	}
	tr := birdTor{l}
	n := l.Nodes[0]
	waitEstablished(t, n)
	testutil.EventuallyWithin(t, 20*time.Second, "the ToR to see "+n.Name+" Established", func() (bool, string) { return tr.sessionUp(t, n), "" })

	// Pod namespaces outlive rounds; whatever is left goes with the test.
	spaces := map[string]*lab.NS{}
	t.Cleanup(func() {
		for _, ns := range spaces {
			if err := ns.Delete(); err != nil {
				t.Errorf("delete netns %s: %v", ns.Name, err)
			}
		}
	})

	var tot crashTotals
	var live []*crashPod
	addrSeq := 0
	for round := 1; round <= rounds+1; round++ {
		drain := round > rounds // the last pass deletes everyone, no kill
		var jobs []crashJob
		for _, p := range live {
			if drain || rnd.Float64() < crashOldDel {
				jobs = append(jobs, crashJob{p: p, del: true})
			}
		}
		if !drain {
			for i := range crashPods {
				p := &crashPod{id: fmt.Sprintf("cs%02d-%03d", round, i)}
				switch x := rnd.IntN(100); {
				case x < 60:
					p.kind = crashDual
				case x < 70:
					p.kind = crashV6Only
				case x < 85:
					p.kind = crashShared
				case x < 95:
					p.kind = crashAddress
					addrSeq++
					p.addr = netip.MustParseAddr(fmt.Sprintf("2001:db8:aa::%x", addrSeq))
				default:
					p.kind = crashAnycast
				}
				p.newSandbox = rnd.IntN(2) == 0
				jobs = append(jobs, crashJob{p: p, add: true, del: rnd.Float64() >= crashKeep})
			}
		}
		rnd.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
		killAt, jitter := -1, time.Duration(0)
		if !drain {
			// Leave at least a worker's worth of jobs behind the kill, so it
			// lands inside the storm.
			killAt, jitter = rnd.IntN(len(jobs)-crashWorkers), time.Duration(rnd.IntN(30))*time.Millisecond
		}

		r := &crashRound{l: l, n: n, spaces: spaces}
		ctx, cancel := context.WithCancel(context.Background())
		start := time.Now()
		trigger := make(chan struct{})
		killErr := make(chan error, 1)
		if killAt >= 0 {
			go func() {
				err := r.kill(trigger, jitter)
				if err != nil {
					cancel() // the workers would retry against nobody
				}
				killErr <- err
			}()
		} else {
			killErr <- nil
		}
		queue := make(chan crashJob)
		errs := make(chan error, len(jobs))
		var wg sync.WaitGroup
		for range crashWorkers {
			wg.Go(func() {
				for j := range queue {
					if err := r.run(ctx, j); err != nil {
						errs <- err
					}
				}
			})
		}
		for i, j := range jobs {
			if i == killAt {
				close(trigger)
			}
			queue <- j
		}
		close(queue)
		wg.Wait()
		err := <-killErr
		cancel()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		if err != nil {
			t.Fatal(err)
		}
		if t.Failed() {
			t.Fatalf("round %d: the storm failed (replay: FLOCK_SEED=%d)", round, seed)
		}
		took := time.Since(start)
		tot.storm += took
		tot.adds += int(r.adds.Load())
		tot.dels += int(r.dels.Load())
		tot.addsRetried += int(r.addsRetried.Load())
		tot.addRetries += int(r.addRetries.Load())
		tot.newSandboxes += int(r.newSandboxes.Load())
		tot.delsRetried += int(r.delsRetried.Load())
		tot.delRetries += int(r.delRetries.Load())
		if killAt >= 0 {
			tot.kills++
			tot.inFlightAtKill += r.killedInFlight
			tot.maxReady = max(tot.maxReady, r.ready)
		}

		// The quiescent point: every worker done, the agent back and every
		// failed call retried to success.
		var gone []*crashPod
		for _, j := range jobs {
			if j.del {
				gone = append(gone, j.p)
			} else {
				live = append(live, j.p) // added, kept
			}
		}
		live = slices.DeleteFunc(live, func(p *crashPod) bool { return !p.live })
		checkStart := time.Now()
		res := checkCrashNode(t, l, n, live, gone)
		tot.leaks += res.leaks
		tot.dups += res.dups
		tot.maxConverge = max(tot.maxConverge, res.converged)
		if killAt < 0 {
			res.interrupted = 0 // the previous round's process counted those
		}
		tot.interruptedAdds += res.interrupted
		// The runtime removes a deleted sandbox's netns.
		for _, j := range jobs {
			sandboxes := j.p.abandoned
			if !j.p.live {
				sandboxes = append(sandboxes, j.p.pod)
			}
			for _, sb := range sandboxes {
				if err := sb.NS.Delete(); err != nil {
					t.Errorf("delete netns of %s: %v", sb.ContainerID, err)
				}
				delete(spaces, sb.ContainerID)
			}
			j.p.abandoned = nil
		}
		tot.checks += time.Since(checkStart)
		t.Logf("round %d: %d ADDs, %d DELs in %v; kill after job %d (+%v) with %d calls in flight, agent ready %v later; %d ADDs (%d as a new sandbox) / %d DELs retried; %d interrupted ADDs torn down; %d live pods; converged in %v",
			round, r.adds.Load(), r.dels.Load(), took.Round(time.Millisecond), killAt, jitter, r.killedInFlight, r.ready.Round(time.Millisecond),
			r.addsRetried.Load(), r.newSandboxes.Load(), r.delsRetried.Load(), res.interrupted, len(live), res.converged.Round(time.Millisecond))
		if t.Failed() {
			t.Fatalf("round %d: invariants broken (replay: FLOCK_SEED=%d)", round, seed)
		}
	}
	if tot.addsRetried+tot.delsRetried+tot.interruptedAdds == 0 {
		t.Errorf("no kill hit a CNI call in %d rounds: the storm proves nothing", rounds)
	}

	t.Logf("crash storm, seed %d: %d rounds, %d ADDs, %d DELs, %d kills (%d calls in flight at them); %d ADDs retried (%d retries, %d as a new sandbox), all succeeded; %d DELs retried (%d retries); %d interrupted ADDs torn down at restart; leaks %d, duplicate IPs %d; agent ready ≤ %v after restart, invariants converged ≤ %v after the storm; storms %v, checks %v",
		seed, rounds, tot.adds, tot.dels, tot.kills, tot.inFlightAtKill, tot.addsRetried, tot.addRetries, tot.newSandboxes, tot.delsRetried, tot.delRetries,
		tot.interruptedAdds, tot.leaks, tot.dups, tot.maxReady.Round(time.Millisecond), tot.maxConverge.Round(time.Millisecond),
		tot.storm.Round(time.Second), tot.checks.Round(time.Second))
	record(t, reliabilityRow{
		Section: "Crash storm", Fault: "agent SIGKILLed at a random moment of a pod ADD/DEL storm, restarted at once", ToR: "bird",
		Done: fmt.Sprintf("%d pods added per round by %d concurrent libcni workers, ~%d%% of them and half the older pods deleted; calls that met the dead agent retried until they succeeded; invariants checked after every round; seed %d",
			crashPods, crashWorkers, int((1-crashKeep)*100), seed),
		Times:    rounds,
		Survived: "no leaked veth, kernel route, store record or IP, no duplicate address; the ToR held exactly the node's advertisements after every round",
		Figures: map[string]string{
			"ADDs":                             strconv.Itoa(tot.adds),
			"DELs":                             strconv.Itoa(tot.dels),
			"kills":                            strconv.Itoa(tot.kills),
			"CNI calls in flight at the kills": strconv.Itoa(tot.inFlightAtKill),
			"ADDs retried (all succeeded)":     fmt.Sprintf("%d (%d in place, %d times; %d as a new sandbox after a DEL)", tot.addsRetried, tot.addsRetried-tot.newSandboxes, tot.addRetries, tot.newSandboxes),
			"DELs retried (all succeeded)":     fmt.Sprintf("%d (%d retries)", tot.delsRetried, tot.delRetries),
			"interrupted ADDs torn down":       strconv.Itoa(tot.interruptedAdds),
			"leaks found":                      strconv.Itoa(tot.leaks),
			"duplicate IPs":                    strconv.Itoa(tot.dups),
			"agent ready after restart (max)":  tot.maxReady.Round(time.Millisecond).String(),
			"invariants converged (max)":       tot.maxConverge.Round(time.Millisecond).String(),
		},
	})
}

// crashCheck is what one quiescent point found.
type crashCheck struct {
	leaks, dups int
	interrupted int // the restarted agent's "interrupted-add" reaps
	converged   time.Duration
}

// checkCrashNode waits (bounded) until the node and the ToR hold exactly
// what the live pods imply, reports every difference otherwise, and then
// looks inside the pods' own namespaces.
func checkCrashNode(t *testing.T, l *lab.BGPLab, n *lab.LabNode, live, gone []*crashPod) crashCheck {
	t.Helper()
	var res crashCheck

	// The IPs every live pod holds, once each.
	owner := map[netip.Addr]string{}
	for _, p := range live {
		for _, ip := range append(slices.Clone(p.ips), p.addresses()...) {
			if prev, dup := owner[ip]; dup {
				res.dups++
				t.Errorf("%s handed to both %s and %s", ip, prev, p.id)
			}
			owner[ip] = p.id
		}
	}
	want := crashWant(n, live)
	start := time.Now()
	var diffs []crashDiff
	for {
		diffs = crashDiffs(t, l, n, want)
		if len(diffs) == 0 || time.Since(start) > crashSettle {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.converged = time.Since(start)
	for _, d := range diffs {
		res.leaks += len(d.extra)
		t.Errorf("%s: leaked %v; missing %v", d.what, d.extra, d.missing)
	}
	var st admin.Status
	flockctlJSON(t, n.Agent, &st, "status")
	res.interrupted = int(st.Reaped["interrupted-add"])

	// Inside the pods: a live pod has lo and eth0 with exactly its IPs and
	// anycast IPs (a killed attempt left nothing behind), a deleted one
	// only lo, bare.
	for _, p := range live {
		got, err := podNSView(p.pod.NS)
		if err != nil {
			t.Fatal(err)
		}
		w := []string{"eth0"}
		for _, ip := range append(slices.Clone(p.ips), p.addresses()...) {
			w = append(w, "eth0 "+host(ip).String())
		}
		if p.kind == crashAnycast {
			w = append(w, "eth0 "+host(crashAny6).String(), "eth0 "+host(crashAny4).String())
		}
		if extra, missing := diffSets(got, w); len(extra)+len(missing) > 0 {
			res.leaks += len(extra)
			t.Errorf("pod %s netns: extra %v; missing %v", p.id, extra, missing)
		}
	}
	var deleted []lab.Pod
	for _, p := range append(slices.Clone(live), gone...) {
		deleted = append(deleted, p.abandoned...)
	}
	for _, p := range gone {
		deleted = append(deleted, p.pod)
	}
	for _, p := range deleted {
		got, err := podNSView(p.NS)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range got {
			res.leaks++
			t.Errorf("deleted sandbox %s still has %s in its netns", p.ContainerID, g)
		}
	}
	return res
}

// crashWanted is the node's whole truth for a set of live pods, each part
// as a set of strings comparable with what the node shows.
type crashWanted struct {
	veths, routes, records, pods, ipam, tor, speaker []string
}

func crashWant(n *lab.LabNode, live []*crashPod) crashWanted {
	var w crashWanted
	w.routes = []string{n.Summary6.String() + " blackhole", n.Summary4.String() + " blackhole"}
	tor := map[netip.Prefix]int{n.Summary6: 1, n.Summary4: 1}
	used := map[netip.Prefix]int{}
	claims := map[string]int{"lab-pods": 0, "lab-addresses": 0, "lab-anycast": 0}
	for _, p := range live {
		veth := dataplane.HostVethName(p.id) // a hash collision among ~200 live pods: p ≈ 5e-6
		w.veths = append(w.veths, veth)
		v6, v4 := ipOf(p.ips, true), ipOf(p.ips, false)
		for _, ip := range p.ips {
			w.routes = append(w.routes, host(ip).String()+" dev "+veth)
			switch {
			case crashSharedRange.Contains(ip):
				used[crashSharedRange]++
				claims["lab-pods"]++
				tor[host(ip)] = 1
			case n.Summary6.Contains(ip):
				used[n.Summary6]++
			case n.Summary4.Contains(ip):
				used[n.Summary4]++
			}
		}
		switch p.kind {
		case crashAddress:
			w.routes = append(w.routes, host(p.addr).String()+" via "+v6.String()+"%"+veth)
			claims["lab-addresses"]++
			tor[host(p.addr)] = 1
		case crashAnycast:
			w.routes = append(w.routes, host(crashAny6).String()+" via "+v6.String()+"%"+veth, host(crashAny4).String()+" via "+v4.String()+"%"+veth)
			tor[host(crashAny6)], tor[host(crashAny4)] = 1, 1
		}
		w.records = append(w.records, fmt.Sprintf("%s committed %v %v", p.id, p.ips, p.addresses()))
		w.pods = append(w.pods, fmt.Sprintf("%s committed ready=true veth=%s %v %v", p.id, veth, p.ips, p.addresses()))
	}
	for _, pfx := range []netip.Prefix{n.Summary6, n.Summary4, crashSharedRange} {
		w.ipam = append(w.ipam, fmt.Sprintf("%s used=%d", pfx, used[pfx]))
	}
	for name, c := range claims {
		w.ipam = append(w.ipam, fmt.Sprintf("%s claims=%d", name, c))
	}
	for p, c := range tor {
		w.tor = append(w.tor, fmt.Sprintf("%s paths=%d", p, c))
		w.speaker = append(w.speaker, p.String()+" advertised")
	}
	return w
}

// crashDiff is one view of the node that differs from what the live pods
// imply.
type crashDiff struct {
	what           string
	extra, missing []string
}

// crashDiffs compares every view with what the live pods imply.
//
// Claims: in the lab's standalone mode there are no cluster-wide claim
// objects (agent.Config.Claims is nil; uniqueness is per node). What the
// node holds of use-pod and addresses pools is still counted per pool
// (flockctl ipam's claims column, from its committed allocations), and
// that must match the live pods.
func crashDiffs(t *testing.T, l *lab.BGPLab, n *lab.LabNode, w crashWanted) []crashDiff {
	t.Helper()
	var out []crashDiff
	cmp := func(what string, got, want []string) {
		if extra, missing := diffSets(got, want); len(extra)+len(missing) > 0 {
			out = append(out, crashDiff{what, extra, missing})
		}
	}
	settledDeletes(t, n.Agent)
	cmp("host veths", flockVeths(t, n.NS), w.veths)
	cmp("kernel routes (proto flock)", crashRouteTable(t, n.NS), w.routes)

	var recs []string
	for _, r := range records(t, n.Agent) {
		recs = append(recs, fmt.Sprintf("%s %s %v %v", r.ContainerID, r.State, r.IPs, r.Addresses))
	}
	cmp("store records", recs, w.records)
	ents, err := os.ReadDir(filepath.Join(n.Agent.StateDir, "allocations"))
	if err != nil {
		t.Fatal(err)
	}
	var stray []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".spare-") && strings.HasSuffix(name, ".tmp") {
			// Deleted records' files kept for reuse: empty, or they are
			// records that outlived their DEL.
			if fi, err := e.Info(); err != nil || fi.Size() != 0 {
				stray = append(stray, name+" (not empty)")
			}
			continue
		}
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			stray = append(stray, name)
		}
	}
	cmp("store files other than records and empty spares", stray, nil)

	var pods []admin.Pod
	flockctlJSON(t, n.Agent, &pods, "pods")
	var pv []string
	for _, p := range pods {
		pv = append(pv, fmt.Sprintf("%s %s ready=%v veth=%s %v %v", p.ContainerID, p.Phase, p.Ready, p.HostVeth, addrs(t, p.IPs), addrs(t, p.Addresses)))
	}
	cmp("flockctl pods", pv, w.pods)

	var pools []admin.Pool
	flockctlJSON(t, n.Agent, &pools, "ipam")
	var iv []string
	for _, p := range pools {
		switch p.CIDR {
		case n.Summary6.String(), n.Summary4.String(), crashSharedRange.String():
			iv = append(iv, fmt.Sprintf("%s used=%d", p.CIDR, p.Used))
		}
		// One row per CIDR: a pool's claims once.
		if c := fmt.Sprintf("%s claims=%d", p.Name, p.Claims); strings.HasPrefix(p.Name, "lab-") && !slices.Contains(iv, c) {
			iv = append(iv, c)
		}
	}
	cmp("flockctl ipam", iv, w.ipam)

	var st admin.Status
	flockctlJSON(t, n.Agent, &st, "status")
	if !st.Ready || len(st.Problems) > 0 || st.Allocations != len(w.pods) {
		out = append(out, crashDiff{what: "flockctl status", extra: st.Problems, missing: []string{fmt.Sprintf("ready with %d allocations (it says ready=%v with %d)", len(w.pods), st.Ready, st.Allocations)}})
	}

	var routes []admin.BGPRoute
	flockctlJSON(t, n.Agent, &routes, "bgp", "routes")
	var sv []string
	for _, r := range routes {
		if r.Advertised {
			sv = append(sv, r.Prefix+" advertised")
		} else {
			sv = append(sv, r.Prefix+" held back")
		}
	}
	cmp("speaker paths (flockctl bgp routes)", sv, w.speaker)

	// Until the node's End-of-RIB, BIRD keeps the killed agent's routes as
	// stale ones: a match before that proves nothing.
	if proto, err := l.Bird.Cmd("show protocols all " + n.Name); err != nil || !strings.Contains(proto, "Established") || strings.Contains(proto, "Neighbor graceful restart active") {
		out = append(out, crashDiff{what: "ToR session", missing: []string{n.Name + " Established, graceful restart over"}})
	}
	var tv []string
	for p, c := range birdTable(t, l) {
		tv = append(tv, fmt.Sprintf("%s paths=%d", p, c))
	}
	cmp("ToR table (BIRD)", tv, w.tor)
	return out
}

// addrs parses flockctl's IP strings, for printing like netip.Addr slices.
func addrs(t *testing.T, ss []string) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil {
			t.Fatalf("flockctl printed %q: %v", s, err)
		}
		out = append(out, a)
	}
	return out
}

// crashRouteTable is every route flock owns on the node, one string per
// next hop: "P blackhole" (summaries), "P dev VETH" (a pod's own IPs) and
// "P via GW%VETH" (anycast and addresses, as kernelHostRoutes prints them).
func crashRouteTable(t *testing.T, ns *lab.NS) []string {
	t.Helper()
	var out []string
	err := ns.Do(func(h *netlink.Handle) error {
		names := map[int]string{}
		links, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := h.RouteListFiltered(fam, &netlink.Route{Protocol: dataplane.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				return err
			}
			for _, r := range rs {
				p := prefixOf(r.Dst).String()
				switch {
				case r.Type == unix.RTN_BLACKHOLE:
					out = append(out, p+" blackhole")
				case r.Gw != nil:
					out = append(out, p+" via "+r.Gw.String()+"%"+names[r.LinkIndex])
				case len(r.MultiPath) > 0:
					for _, m := range r.MultiPath {
						out = append(out, p+" via "+m.Gw.String()+"%"+names[m.LinkIndex])
					}
				default:
					out = append(out, p+" dev "+names[r.LinkIndex])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// podNSView lists a pod namespace's interfaces and their global addresses:
// "IF" for an interface, "IF PREFIX" for an address (loopback's own
// 127.0.0.1 and ::1 left out, and lo itself).
func podNSView(ns *lab.NS) ([]string, error) {
	var out []string
	err := ns.Do(func(h *netlink.Handle) error {
		links, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			name := l.Attrs().Name
			if name != "lo" {
				out = append(out, name)
			}
			as, err := h.AddrList(l, netlink.FAMILY_ALL)
			if err != nil {
				return err
			}
			for _, a := range as {
				ip, _ := netip.AddrFromSlice(a.IP)
				if ip = ip.Unmap(); ip.IsLoopback() || ip.IsLinkLocalUnicast() {
					continue
				}
				out = append(out, name+" "+host(ip).String())
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", ns.Name, err)
	}
	return out, nil
}

// diffSets compares two multisets of strings.
func diffSets(got, want []string) (extra, missing []string) {
	count := map[string]int{}
	for _, g := range got {
		count[g]++
	}
	for _, w := range want {
		count[w]--
	}
	for k, c := range count {
		for ; c > 0; c-- {
			extra = append(extra, k)
		}
		for ; c < 0; c++ {
			missing = append(missing, k)
		}
	}
	slices.Sort(extra)
	slices.Sort(missing)
	return extra, missing
}
