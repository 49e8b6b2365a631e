package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

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
	seed := uint64(testutil.Seed(t))
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
