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
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("pid %d: no VmRSS", pid)
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
