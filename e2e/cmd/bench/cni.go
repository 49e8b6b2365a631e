package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/procfs"
)

// plugin is one CNI configuration under test, invoked through libcni the
// way a container runtime does (exec of the plugin binary), or through an
// exec of cnitool per call.
type plugin struct {
	name string
	cni  *lab.CNI
	tool *cnitool // if set, ADD and DEL exec cnitool instead of libcni
	// host, if set, is the namespace the plugin runs in (ptp programs the
	// namespace it is executed in: never the machine's own).
	host *lab.NS
	args func(i int) [][2]string
	// quiesce, if set, waits until the work a DEL left to run after it
	// returned is done, so that each timed phase starts on an idle node.
	quiesce func() error
	// agent, if set, is the pid of a daemon the plugin calls (its CPU is
	// part of an ADD's cost; it must be alive at the end of each round).
	agent func() int
	// vethNS is the namespace the pods' host veths are in: a DEL is timed
	// until the kernel announced its veth's deletion there. vethName
	// names a pod's host veth from its container ID when the ADD result
	// does not (ptp's lists it; flock's lists the pod's interface only).
	vethNS   *lab.NS
	vethName func(containerID string) string
}

// add runs ADD and returns the name of the pod's host veth.
func (p plugin) add(ctx context.Context, pod lab.Pod) (string, error) {
	var res types.Result
	var err error
	if p.tool != nil {
		res, err = p.tool.add(ctx, pod)
	} else {
		res, err = p.cni.Add(ctx, pod)
	}
	if err != nil {
		return "", err
	}
	return p.hostVeth(pod, res)
}

// del runs DEL.
func (p plugin) del(ctx context.Context, pod lab.Pod) error {
	if p.tool != nil {
		return p.tool.del(ctx, pod)
	}
	return p.cni.Del(ctx, pod)
}

// hostVeth is the pod's host-side interface: the one without a sandbox
// in the ADD result, else the one p names from the container ID.
func (p plugin) hostVeth(pod lab.Pod, res types.Result) (string, error) {
	r, err := types100.GetResult(res)
	if err != nil {
		return "", fmt.Errorf("%s: ADD result: %w", p.name, err)
	}
	for _, i := range r.Interfaces {
		if i.Sandbox == "" && i.Name != "" {
			return i.Name, nil
		}
	}
	if p.vethName != nil {
		return p.vethName(pod.ContainerID), nil
	}
	return "", fmt.Errorf("%s: the ADD result names no host interface", p.name)
}

// cpuSplit is the CPU time a phase cost, by who spent it.
type cpuSplit struct {
	plugins, caller, agent time.Duration // exec'd plugins (and what they exec), this process (libcni), the daemon
}

func rusage(who int) time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(who, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuDuring runs f and returns the CPU time spent meanwhile.
func (p plugin) cpuDuring(f func() error) (cpuSplit, error) {
	var a0, a1 time.Duration
	if p.agent != nil {
		a0, _ = procfs.CPUTime(p.agent())
	}
	c0, s0 := rusage(syscall.RUSAGE_CHILDREN), rusage(syscall.RUSAGE_SELF)
	err := f()
	c1, s1 := rusage(syscall.RUSAGE_CHILDREN), rusage(syscall.RUSAGE_SELF)
	if p.agent != nil {
		a1, _ = procfs.CPUTime(p.agent())
	}
	return cpuSplit{plugins: c1 - c0, caller: s1 - s0, agent: a1 - a0}, err
}

// run calls f on a thread in p's host namespace (or anywhere for flock,
// whose plugin only talks to the agent's socket).
func (p plugin) run(f func() error) error {
	if p.host == nil {
		return f()
	}
	return p.host.InNS(f)
}

// ptpPlugin is the reference ptp plugin with host-local IPAM, IPv4-only or
// dual-stack.
func ptpPlugin(dir string, host *lab.NS, dual bool) (plugin, error) {
	ranges := `[[{"subnet":"198.51.100.0/24"}]]`
	name := "ptp IPv4-only"
	if dual {
		ranges = `[[{"subnet":"fd00:20::/64"}],[{"subnet":"198.51.100.0/24"}]]`
		name = "ptp dual-stack"
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"ptp","plugins":[{"type":"ptp","ipMasq":false,
"ipam":{"type":"host-local","dataDir":%q,"ranges":%s}}]}`, filepath.Join(dir, "ipam"), ranges)
	list, err := libcni.NetworkConfFromBytes([]byte(conf))
	if err != nil {
		return plugin{}, err
	}
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{}, PluginDecoder: version.PluginDecoder{}}
	c := &lab.CNI{Config: libcni.NewCNIConfigWithCacheDir([]string{"/usr/lib/cni"}, filepath.Join(dir, "cache"), exec), List: list}
	return plugin{name: name, cni: c, host: host, vethNS: host, args: func(i int) [][2]string { return lab.PodArgs("default", fmt.Sprintf("p%d", i)) }}, nil
}

// podPool is a set of pod namespaces, reused by every run: a DEL leaves
// them as they were.
type podPool []*lab.NS

func newPodPool(prefix string, n int) (podPool, error) {
	var p podPool
	for i := range n {
		ns, err := lab.NewNS(fmt.Sprintf("%s%d", prefix, i))
		if err != nil {
			p.Close()
			return nil, err
		}
		p = append(p, ns)
	}
	return p, nil
}

func (p podPool) Close() {
	for _, ns := range p {
		_ = ns.Delete()
	}
}

func (p plugin) pod(tag string, i int, ns *lab.NS) lab.Pod {
	id := fmt.Sprintf("%s%06d", tag, i)
	if p.tool != nil {
		id = cnitoolContainerID(ns.Path) // what cnitool will call it
	}
	return lab.Pod{ContainerID: id, NS: ns, Args: p.args(i)}
}

// vethGoneWait bounds the wait for a host veth's deletion after its DEL
// returned (flock's agent deletes it then: ~20 ms).
const vethGoneWait = 10 * time.Second

// sequential ADDs n pods one after the other, then DELs them one after
// the other, timing each call; a DEL is timed until it returned and its
// host veth is deleted.
func (p plugin) sequential(ctx context.Context, pool podPool, tag string, n int) (add, del []time.Duration, err error) {
	var late []time.Duration // how long after the DEL returned its veth was deleted
	veths := make([]string, n)
	err = p.run(func() error {
		for i := range n {
			start := time.Now()
			veth, err := p.add(ctx, p.pod(tag, i, pool[i]))
			if err != nil {
				return fmt.Errorf("%s: ADD %d: %w", p.name, i, err)
			}
			add = append(add, time.Since(start))
			veths[i] = veth
		}
		return nil
	})
	if err != nil {
		return add, del, err
	}
	w, err := watchVeths(p.vethNS)
	if err != nil {
		return add, del, fmt.Errorf("%s: %w", p.name, err)
	}
	defer w.Close()
	err = p.run(func() error {
		for i := range n {
			start := time.Now()
			if err := p.del(ctx, p.pod(tag, i, pool[i])); err != nil {
				return fmt.Errorf("%s: DEL %d: %w", p.name, i, err)
			}
			returned := time.Now()
			gone, err := w.goneAfter(veths[i:i+1], returned, vethGoneWait)
			if err != nil {
				return fmt.Errorf("%s: DEL %d: %w", p.name, i, err)
			}
			del = append(del, gone.Sub(start))
			late = append(late, gone.Sub(returned))
		}
		return nil
	})
	if err == nil {
		logf("CNI: %s: host veth deleted after the DEL returned: p50 %.2f ms, max %.2f ms", p.name, pct(late, .5), pct(late, 1))
	}
	return add, del, err
}

// concurrent runs op for pods 0..n-1 from workers goroutines and returns
// pods per second.
func (p plugin) concurrent(workers, n int, op func(i int) error) (float64, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- p.run(func() error {
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return nil
					}
					if err := op(i); err != nil {
						return err
					}
				}
			})
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return float64(n) / el.Seconds(), nil
}

// throughput ADDs n pods from 8 workers, then DELs them the same way,
// and says what CPU the ADDs cost. The DELs are timed until the last
// returned and every host veth is deleted.
func (p plugin) throughput(ctx context.Context, pool podPool, tag string, n int) (add, del float64, cpu cpuSplit, err error) {
	veths := make([]string, n)
	cpu, err = p.cpuDuring(func() error {
		add, err = p.concurrent(8, n, func(i int) error {
			veth, err := p.add(ctx, p.pod(tag, i, pool[i]))
			if err != nil {
				return fmt.Errorf("%s: ADD %d: %w", p.name, i, err)
			}
			veths[i] = veth
			return nil
		})
		return err
	})
	if err != nil {
		return math.NaN(), math.NaN(), cpu, err
	}
	w, err := watchVeths(p.vethNS)
	if err != nil {
		return add, math.NaN(), cpu, fmt.Errorf("%s: %w", p.name, err)
	}
	defer w.Close()
	start := time.Now()
	if _, err := p.concurrent(8, n, func(i int) error {
		if err := p.del(ctx, p.pod(tag, i, pool[i])); err != nil {
			return fmt.Errorf("%s: DEL %d: %w", p.name, i, err)
		}
		return nil
	}); err != nil {
		return add, math.NaN(), cpu, err
	}
	gone, err := w.goneAfter(veths, time.Now(), vethGoneWait)
	if err != nil {
		return add, math.NaN(), cpu, fmt.Errorf("%s: DELs: %w", p.name, err)
	}
	return add, float64(n) / gone.Sub(start).Seconds(), cpu, nil
}

// settle runs p.quiesce, if any, and says how long it waited.
func (p plugin) settle() error {
	if p.quiesce == nil {
		return nil
	}
	start := time.Now()
	if err := p.quiesce(); err != nil {
		return fmt.Errorf("%s: waiting for the node to be idle: %w", p.name, err)
	}
	logf("CNI: %s: node idle after %s", p.name, time.Since(start).Round(time.Millisecond))
	return nil
}

// cniResult is one plugin's figures.
type cniResult struct {
	addP50, addP99, delP50, delP99 float64
	addRate, delRate               float64
	err                            error

	add, del           []time.Duration // every round's sequential samples
	addRates, delRates []float64       // one per round
	cpu                cpuSplit        // the throughput ADDs', all rounds
	cpuADDs            int
}

// measureRound adds one round of p's samples to r: sequential ADDs then
// DELs, then ADDs and DELs from 8 workers.
func measureRound(ctx context.Context, p plugin, pool podPool, tag string, seqN, tputN int, r *cniResult) {
	if r.err != nil {
		return
	}
	if p.agent != nil {
		// The daemon that answered must be the one that was there at the
		// start, still running: a figure of a crashed or restarted agent
		// is no figure.
		agent, err := procfs.Watch("flock-agent", p.agent())
		if err != nil {
			r.err = fmt.Errorf("%s: %w", p.name, err)
			return
		}
		defer func() {
			if err := agent.Alive(); err != nil && r.err == nil {
				r.err = fmt.Errorf("%s: %w", p.name, err)
			}
		}()
	}
	if r.err = p.settle(); r.err != nil {
		return
	}
	logf("CNI: %s: %d sequential ADDs then DELs", p.name, seqN)
	add, del, err := p.sequential(ctx, pool, tag+"s", seqN)
	if err != nil {
		r.err = err
		return
	}
	r.add, r.del = append(r.add, add...), append(r.del, del...)
	logf("CNI: %s: ADD p10/p25/p50/p75/p90 %.2f/%.2f/%.2f/%.2f/%.2f ms, DEL p50 %.1f ms; %d ADDs from 8 workers", p.name, pct(add, .1), pct(add, .25), pct(add, .5), pct(add, .75), pct(add, .9), pct(del, .5), tputN)
	if r.err = p.settle(); r.err != nil {
		return
	}
	addRate, delRate, cpu, err := p.throughput(ctx, pool, tag+"t", tputN)
	if err != nil {
		r.err = err
		return
	}
	r.addRates, r.delRates = append(r.addRates, addRate), append(r.delRates, delRate)
	r.cpu.plugins, r.cpu.caller, r.cpu.agent = r.cpu.plugins+cpu.plugins, r.cpu.caller+cpu.caller, r.cpu.agent+cpu.agent
	r.cpuADDs += tputN
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(tputN) }
	logf("CNI: %s: %.0f ADDs/s, %.0f DELs/s; CPU per ADD: plugin %.2f ms, caller %.2f ms, agent %.2f ms", p.name, addRate, delRate, per(cpu.plugins), per(cpu.caller), per(cpu.agent))
}

// finish computes the figures from the rounds: percentiles over every
// sequential sample, the median round's rates.
func (r *cniResult) finish() {
	r.addP50, r.addP99, r.delP50, r.delP99 = pct(r.add, .5), pct(r.add, .99), pct(r.del, .5), pct(r.del, .99)
	r.addRate, r.delRate = median(r.addRates), median(r.delRates)
	if r.err != nil {
		r.addRate, r.delRate = math.NaN(), math.NaN()
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
