package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// rssMB is a process's resident set (VmRSS) in MB.
func rssMB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	st, err := parseStatus(b)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st.rssKB / 1024, nil
}

// procStatus is what the bench reads from /proc/PID/status: one read of
// the file, so the name, the state and the RSS are of the same moment.
type procStatus struct {
	name  string  // Name: the command (at most 15 bytes)
	state string  // State: its letter (R, S, D, Z, X, …)
	rssKB float64 // VmRSS
}

// parseStatus reads the Name, State and VmRSS lines of /proc/PID/status.
// A process without VmRSS (a zombie, a kernel thread) is an error: it has
// no memory to report.
func parseStatus(b []byte) (procStatus, error) {
	var st procStatus
	rss := false
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Name":
			st.name = v
		case "State":
			if f := strings.Fields(v); len(f) > 0 {
				st.state = f[0]
			}
		case "VmRSS":
			f := strings.Fields(v)
			if len(f) < 1 {
				return st, fmt.Errorf("VmRSS %q", v)
			}
			kb, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return st, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			if len(f) > 1 && f[1] != "kB" {
				return st, fmt.Errorf("VmRSS %q: want kB", v)
			}
			st.rssKB, rss = kb, true
		}
	}
	if !rss {
		return st, fmt.Errorf("no VmRSS (state %q)", st.state)
	}
	return st, nil
}

// liveRSSMB is the RSS in MB of a process that is name (as the kernel
// keeps it: 15 bytes at most) and neither a zombie nor dead.
func (st procStatus) liveRSSMB(name string) (float64, error) {
	if len(name) > 15 {
		name = name[:15]
	}
	if st.name != name {
		return 0, fmt.Errorf("the process is %q, not %s", st.name, name)
	}
	switch st.state {
	case "", "Z", "X", "x":
		return 0, fmt.Errorf("%s is not running (state %q)", name, st.state)
	}
	return st.rssKB / 1024, nil
}

// cpuTime is a process's user+system CPU time so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces) start after ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("pid %d: short stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("pid %d: stat: %v %v", pid, err1, err2)
	}
	const hz = 100 // USER_HZ on Linux
	return time.Duration(u+st) * time.Second / hz, nil
}

// idleCPU is the share of one core pid used over d.
func idleCPU(pid int, d time.Duration) (float64, error) {
	a, err := cpuTime(pid)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	time.Sleep(d)
	b, err := cpuTime(pid)
	if err != nil {
		return 0, err
	}
	return 100 * float64(b-a) / float64(time.Since(start)), nil
}

// settledRSS waits for the Go runtime to return what a burst left behind
// (the scavenger works in the background) and reads the RSS then.
func settledRSS(pid int, wait time.Duration) (float64, error) {
	time.Sleep(wait)
	return rssMB(pid)
}
