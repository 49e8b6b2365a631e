// Package procfs reads what the benchmarks measure of a process from
// /proc: its resident set and CPU time, each reading checked against the
// process it was taken of.
package procfs

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// RSSMB is a process's resident set (VmRSS) in MB.
func RSSMB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	st, err := ParseStatus(b)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st.RSSKB / 1024, nil
}

// Status is what the bench reads from /Proc/PID/status: one read of
// the file, so the name, the state and the RSS are of the same moment.
type Status struct {
	Name  string  // Name: the command (at most 15 bytes)
	State string  // State: its letter (R, S, D, Z, X, …)
	RSSKB float64 // VmRSS
}

// ParseStatus reads the Name, State and VmRSS lines of /Proc/PID/status.
// A process without VmRSS (a zombie, a kernel thread) is an error: it has
// no memory to report.
func ParseStatus(b []byte) (Status, error) {
	var st Status
	rss := false
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Name":
			st.Name = v
		case "State":
			if f := strings.Fields(v); len(f) > 0 {
				st.State = f[0]
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
			st.RSSKB, rss = kb, true
		}
	}
	if !rss {
		return st, fmt.Errorf("no VmRSS (state %q)", st.State)
	}
	return st, nil
}

// LiveRSSMB is the RSS in MB of a process that is name (as the kernel
// keeps it: 15 bytes at most) and neither a zombie nor dead.
func (st Status) LiveRSSMB(name string) (float64, error) {
	if len(name) > 15 {
		name = name[:15]
	}
	if st.Name != name {
		return 0, fmt.Errorf("the process is %q, not %s", st.Name, name)
	}
	switch st.State {
	case "", "Z", "X", "x":
		return 0, fmt.Errorf("%s is not running (state %q)", name, st.State)
	}
	return st.RSSKB / 1024, nil
}

// Stat is what the bench reads from /Proc/PID/stat.
type Stat struct {
	State string        // its letter (R, S, D, Z, X, …)
	CPU   time.Duration // user + system CPU time so far
	Start uint64        // when it started, in clock ticks after boot
}

// ParseStat reads the state, the CPU times and the start time of a
// /Proc/PID/stat line.
func ParseStat(b []byte) (Stat, error) {
	// Fields after the command (which may hold spaces and parentheses)
	// start after the last ')': the state is field 3, utime and stime
	// 14 and 15, starttime 22.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("stat %q: no command", s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("stat: %d fields after the command, want at least 20", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	start, err3 := strconv.ParseUint(f[19], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return Stat{}, fmt.Errorf("stat: %w", err)
	}
	const hz = 100 // USER_HZ on Linux
	return Stat{State: f[0], CPU: time.Duration(u+st) * time.Second / hz, Start: start}, nil
}

func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(b)
}

// CPUTime is a process's user+system CPU time so far.
func CPUTime(pid int) (time.Duration, error) {
	st, err := ReadStat(pid)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st.CPU, nil
}

// Proc is a process a figure is taken of, as it was when the measurement
// began. A dead process reads as 0 % CPU (a zombie's times are frozen)
// or as whatever process got its pid next, so every reading is checked
// against it: still there, still the same process (a pid is reused once
// its process is reaped; the start time tells them apart), not a zombie.
type Proc struct {
	Name  string // for the errors: "flock-agent", "the bare GoBGP"
	PID   int
	start uint64
}

func (p Proc) String() string { return fmt.Sprintf("%s (pid %d)", p.Name, p.PID) }

// Watch identifies the live process pid, called name in errors.
func Watch(name string, pid int) (Proc, error) {
	p := Proc{Name: name, PID: pid}
	if pid <= 0 {
		return p, fmt.Errorf("%s: not running (no pid)", name)
	}
	st, err := ReadStat(pid)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return p, fmt.Errorf("%s: not running", p)
		}
		return p, fmt.Errorf("%s: %w", p, err)
	}
	if Dead(st.State) {
		return p, fmt.Errorf("%s: not running (state %s)", p, st.State)
	}
	p.start = st.Start
	return p, nil
}

func Dead(state string) bool {
	switch state {
	case "Z", "X", "x":
		return true
	}
	return false
}

// alive is nil while p is still the process Watch found and has not
// exited; else an error naming it.
func (p Proc) Alive() error {
	_, err := p.Stat()
	return err
}

// stat reads p's /Proc/PID/stat, an error unless p is alive.
func (p Proc) Stat() (Stat, error) {
	st, err := ReadStat(p.PID)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return st, fmt.Errorf("%s exited during the measurement (no /proc/%d)", p, p.PID)
	case err != nil:
		return st, fmt.Errorf("%s: %w", p, err)
	case st.Start != p.start:
		return st, fmt.Errorf("%s exited during the measurement: pid %d is now another process (started at tick %d, not %d)", p, p.PID, st.Start, p.start)
	case Dead(st.State):
		return st, fmt.Errorf("%s exited during the measurement (state %s: a zombie)", p, st.State)
	}
	return st, nil
}

// rss is p's resident set in MB, read while p was verified alive (before
// and after the read: a pid reused in between has another start time).
func (p Proc) RSS() (float64, error) {
	if err := p.Alive(); err != nil {
		return math.NaN(), err
	}
	mb, rerr := RSSMB(p.PID)
	if err := p.Alive(); err != nil {
		return math.NaN(), err
	}
	if rerr != nil {
		return math.NaN(), fmt.Errorf("%s: %w", p, rerr)
	}
	return mb, nil
}

// idleCPU is the share of one core p used over d: an error if p is not
// the same live process at the end.
func (p Proc) IdleCPU(d time.Duration) (float64, error) {
	a, err := p.Stat()
	if err != nil {
		return math.NaN(), err
	}
	start := time.Now()
	time.Sleep(d)
	b, err := p.Stat()
	if err != nil {
		return math.NaN(), err
	}
	return 100 * float64(b.CPU-a.CPU) / float64(time.Since(start)), nil
}

// settledRSS waits for the Go runtime to return what a burst left behind
// (the scavenger works in the background) and reads p's RSS then; an
// error if p died meanwhile.
func (p Proc) SettledRSS(wait time.Duration) (float64, error) {
	if err := p.Alive(); err != nil {
		return math.NaN(), err
	}
	time.Sleep(wait)
	return p.RSS()
}
