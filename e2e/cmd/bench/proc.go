package main

import (
	"errors"
	"fmt"
	"io/fs"
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

// procStat is what the bench reads from /proc/PID/stat.
type procStat struct {
	state string        // its letter (R, S, D, Z, X, …)
	cpu   time.Duration // user + system CPU time so far
	start uint64        // when it started, in clock ticks after boot
}

// parseStat reads the state, the CPU times and the start time of a
// /proc/PID/stat line.
func parseStat(b []byte) (procStat, error) {
	// Fields after the command (which may hold spaces and parentheses)
	// start after the last ')': the state is field 3, utime and stime
	// 14 and 15, starttime 22.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("stat %q: no command", s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("stat: %d fields after the command, want at least 20", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	start, err3 := strconv.ParseUint(f[19], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return procStat{}, fmt.Errorf("stat: %w", err)
	}
	const hz = 100 // USER_HZ on Linux
	return procStat{state: f[0], cpu: time.Duration(u+st) * time.Second / hz, start: start}, nil
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// cpuTime is a process's user+system CPU time so far.
func cpuTime(pid int) (time.Duration, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st.cpu, nil
}

// proc is a process a figure is taken of, as it was when the measurement
// began. A dead process reads as 0 % CPU (a zombie's times are frozen)
// or as whatever process got its pid next, so every reading is checked
// against it: still there, still the same process (a pid is reused once
// its process is reaped; the start time tells them apart), not a zombie.
type proc struct {
	name  string // for the errors: "flock-agent", "the bare GoBGP"
	pid   int
	start uint64
}

func (p proc) String() string { return fmt.Sprintf("%s (pid %d)", p.name, p.pid) }

// watchProc identifies the live process pid, called name in errors.
func watchProc(name string, pid int) (proc, error) {
	p := proc{name: name, pid: pid}
	if pid <= 0 {
		return p, fmt.Errorf("%s: not running (no pid)", name)
	}
	st, err := readStat(pid)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return p, fmt.Errorf("%s: not running", p)
		}
		return p, fmt.Errorf("%s: %w", p, err)
	}
	if dead(st.state) {
		return p, fmt.Errorf("%s: not running (state %s)", p, st.state)
	}
	p.start = st.start
	return p, nil
}

func dead(state string) bool {
	switch state {
	case "Z", "X", "x":
		return true
	}
	return false
}

// alive is nil while p is still the process watchProc found and has not
// exited; else an error naming it.
func (p proc) alive() error {
	_, err := p.stat()
	return err
}

// stat reads p's /proc/PID/stat, an error unless p is alive.
func (p proc) stat() (procStat, error) {
	st, err := readStat(p.pid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return st, fmt.Errorf("%s exited during the measurement (no /proc/%d)", p, p.pid)
	case err != nil:
		return st, fmt.Errorf("%s: %w", p, err)
	case st.start != p.start:
		return st, fmt.Errorf("%s exited during the measurement: pid %d is now another process (started at tick %d, not %d)", p, p.pid, st.start, p.start)
	case dead(st.state):
		return st, fmt.Errorf("%s exited during the measurement (state %s: a zombie)", p, st.state)
	}
	return st, nil
}

// rss is p's resident set in MB, read while p was verified alive (before
// and after the read: a pid reused in between has another start time).
func (p proc) rss() (float64, error) {
	if err := p.alive(); err != nil {
		return nan(), err
	}
	mb, rerr := rssMB(p.pid)
	if err := p.alive(); err != nil {
		return nan(), err
	}
	if rerr != nil {
		return nan(), fmt.Errorf("%s: %w", p, rerr)
	}
	return mb, nil
}

// idleCPU is the share of one core p used over d: an error if p is not
// the same live process at the end.
func (p proc) idleCPU(d time.Duration) (float64, error) {
	a, err := p.stat()
	if err != nil {
		return nan(), err
	}
	start := time.Now()
	time.Sleep(d)
	b, err := p.stat()
	if err != nil {
		return nan(), err
	}
	return 100 * float64(b.cpu-a.cpu) / float64(time.Since(start)), nil
}

// settledRSS waits for the Go runtime to return what a burst left behind
// (the scavenger works in the background) and reads p's RSS then; an
// error if p died meanwhile.
func (p proc) settledRSS(wait time.Duration) (float64, error) {
	if err := p.alive(); err != nil {
		return nan(), err
	}
	time.Sleep(wait)
	return p.rss()
}
