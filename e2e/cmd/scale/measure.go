package main

import (
	"fmt"
	"maps"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/procfs"
)

// usage is what one process cost over a window.
type usage struct {
	rssMB      float64 // at the window's end
	cpuPct     float64 // of one core, over the window
	events     float64 // watch events received a second
	watchBytes float64 // watch bytes received a second
	otherBytes float64 // bytes of other responses (LISTs, GETs) a second
	requests   float64 // requests made a second (watches included)
	// relayEvents are the watch events a second flock-policy got from
	// the relay (in events, not from the API server).
	relayEvents float64
	byResource  map[string]watchStat
	err         error
}

// window measures every process of the node over d: CPU from
// /proc/PID/stat (each process checked to be the same live one at both
// ends), the apiProxies' counts, and the RSS at the end.
func (m *measuredNode) window(d time.Duration) map[string]usage {
	out := map[string]usage{}
	procs := map[string]procfs.Proc{}
	before := map[string]procfs.Stat{}
	counts := map[string]counts{}
	for _, p := range procNames {
		pr, err := procfs.Watch(p, m.pid(p))
		if err == nil {
			var st procfs.Stat
			if st, err = pr.Stat(); err == nil {
				procs[p], before[p] = pr, st
				counts[p] = m.proxies[p].snapshot()
				continue
			}
		}
		out[p] = usage{err: err}
		m.gone(p)
	}
	// flock-policy's pods come from the relay, which counts what it sent.
	relayBefore, relayErr := m.relaySent()
	start := time.Now()
	time.Sleep(d)
	el := time.Since(start)
	for p, pr := range procs {
		u := usage{}
		st, err := pr.Stat()
		if err != nil {
			out[p] = usage{err: err}
			m.gone(p)
			continue
		}
		u.cpuPct = 100 * float64(st.CPU-before[p].CPU) / float64(el)
		diff := m.proxies[p].snapshot().sub(counts[p])
		ev, wb := diff.watchTotal()
		u.events, u.watchBytes = float64(ev)/el.Seconds(), float64(wb)/el.Seconds()
		var lb int64
		for _, b := range diff.listB {
			lb += b
		}
		u.otherBytes = float64(lb) / el.Seconds()
		u.requests = float64(diff.requestTotal()) / el.Seconds()
		u.byResource = diff.watch
		if p == procPolicy {
			after, err := m.relaySent()
			if err == nil {
				err = relayErr
			}
			if err != nil {
				u.err = fmt.Errorf("what the relay sent: %w", err)
			}
			sent := watchStat{events: after.events - relayBefore.events, bytes: after.bytes - relayBefore.bytes}
			u.relayEvents = float64(sent.events) / el.Seconds()
			u.events += u.relayEvents
			u.watchBytes += float64(sent.bytes) / el.Seconds()
			u.byResource = maps.Clone(u.byResource)
			if u.byResource == nil {
				u.byResource = map[string]watchStat{}
			}
			u.byResource[relayResource] = sent
		}
		if u.rssMB, err = pr.RSS(); err != nil {
			u.err = err
		}
		out[p] = u
	}
	return out
}

// gone logs the end of the log of p, which is no longer running (once:
// the run's directory, and the log with it, goes when the run ends).
func (m *measuredNode) gone(p string) {
	if m.goneLogged == nil {
		m.goneLogged = map[string]bool{}
	}
	if m.goneLogged[p] {
		return
	}
	m.goneLogged[p] = true
	logf("%s is not running; its log ends:\n%s", p, m.logTail(p, 40))
}

func (u usage) String() string {
	if u.err != nil {
		return "error: " + u.err.Error()
	}
	return fmt.Sprintf("RSS %.1f MB, CPU %.1f %%, %.0f watch events/s, %.1f KB/s watched, %.1f KB/s other, %.1f requests/s",
		u.rssMB, u.cpuPct, u.events, u.watchBytes/1024, u.otherBytes/1024, u.requests)
}

// projected is a process's figures under share pace of the issue's
// churn, projected to all of it: its rest figure plus the growth over
// rest divided by pace (CPU, RSS, watch events and bytes, other bytes,
// requests). Linear in the churn: an upper bound for a process that
// grows at most in proportion (see boundVerdict).
func projected(rest, churn usage, pace float64) usage {
	if !isPaced(pace) || churn.err != nil {
		return churn
	}
	if rest.err != nil {
		// No rest to project from: the paced figures, marked.
		churn.err = fmt.Errorf("at rest: %w", rest.err)
		return churn
	}
	up := func(r, c float64) float64 { return r + max(0, c-r)/pace }
	p := churn
	p.rssMB = up(rest.rssMB, churn.rssMB)
	p.cpuPct = up(rest.cpuPct, churn.cpuPct)
	p.events = up(rest.events, churn.events)
	p.watchBytes = up(rest.watchBytes, churn.watchBytes)
	p.otherBytes = up(rest.otherBytes, churn.otherBytes)
	p.requests = up(rest.requests, churn.requests)
	p.relayEvents = up(rest.relayEvents, churn.relayEvents)
	return p
}

// projectedAll is projected for every process.
func projectedAll(rest, churn map[string]usage, pace float64) map[string]usage {
	if churn == nil {
		return nil
	}
	out := make(map[string]usage, len(churn))
	for p, c := range churn {
		out[p] = projected(rest[p], c, pace)
	}
	return out
}
