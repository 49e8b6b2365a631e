package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The fields the bench reads from /proc/PID/stat, after a command that
// holds spaces and parentheses.
func TestParseStat(t *testing.T) {
	line := "4242 (we(ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 12 0 987654 1290000000 7680 18446744073709551615"
	st, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.state != "S" || st.cpu != 4*time.Second || st.start != 987654 {
		t.Errorf("parseStat = %+v, want state S, cpu 4s, start 987654", st)
	}
	for _, bad := range []string{"", "4242 no parens S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 x 150 0 0 20 0 12 0 987654"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

// A measured process that dies fails the measurement with an error
// naming it: as a zombie (its CPU times frozen: 0 %), once reaped (its
// pid may be anyone's), and as a pid now held by another process.
func TestDeadProcessFailsTheMeasurement(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			_ = cmd.Process.Kill() // only the child this test started
			_ = cmd.Wait()
		}
	})
	p, err := watchProc("the sleeper", pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.alive(); err != nil {
		t.Fatalf("alive while running: %v", err)
	}
	if mb, err := p.rss(); err != nil || mb <= 0 {
		t.Fatalf("rss while running = %v, %v", mb, err)
	}
	if _, err := p.idleCPU(50 * time.Millisecond); err != nil {
		t.Fatalf("idleCPU while running: %v", err)
	}

	// Killed during an idle-CPU reading: the reading fails.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = cmd.Process.Kill()
	}()
	if cpu, err := p.idleCPU(400 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "the sleeper") {
		t.Errorf("idleCPU across the kill = %v, %v; want an error naming the process", cpu, err)
	}
	// Unreaped, it is a zombie.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := readStat(pid)
		if err != nil {
			t.Fatalf("the zombie's stat: %v", err)
		}
		if st.state == "Z" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not a zombie 5 s after SIGKILL: state %s", st.state)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for what, f := range map[string]func() error{
		"alive":      p.alive,
		"rss":        func() error { _, err := p.rss(); return err },
		"idleCPU":    func() error { _, err := p.idleCPU(10 * time.Millisecond); return err },
		"settledRSS": func() error { _, err := p.settledRSS(10 * time.Millisecond); return err },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "the sleeper") || !strings.Contains(err.Error(), "zombie") {
			t.Errorf("%s of a zombie: %v; want an error naming the process, a zombie", what, err)
		}
	}
	if _, err := watchProc("the sleeper", pid); err == nil {
		t.Error("watchProc accepted a zombie")
	}

	// Reaped: gone.
	_ = cmd.Wait()
	reaped = true
	if err := p.alive(); err == nil || !strings.Contains(err.Error(), "the sleeper") {
		t.Errorf("alive once reaped: %v; want an error naming the process", err)
	}
	if _, err := p.rss(); err == nil {
		t.Error("rss of a reaped process: no error")
	}

	// The pid held by another process (reused): a different start time.
	self, err := watchProc("this test", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	other := self
	other.start++
	if err := other.alive(); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("alive of a reused pid: %v; want an error", err)
	}
	if _, err := watchProc("nobody", 0); err == nil {
		t.Error("watchProc(0): no error")
	}
}
