package procfs

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The fields the bench reads from /Proc/PID/stat, after a command that
// holds spaces and parentheses.
func TestParseStat(t *testing.T) {
	line := "4242 (we(ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 12 0 987654 1290000000 7680 18446744073709551615"
	st, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "S" || st.CPU != 4*time.Second || st.Start != 987654 {
		t.Errorf("ParseStat = %+v, want state S, cpu 4s, start 987654", st)
	}
	for _, bad := range []string{"", "4242 no parens S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 x 150 0 0 20 0 12 0 987654"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q): no error", bad)
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
	p, err := Watch("the sleeper", pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Alive(); err != nil {
		t.Fatalf("alive while running: %v", err)
	}
	if mb, err := p.RSS(); err != nil || mb <= 0 {
		t.Fatalf("rss while running = %v, %v", mb, err)
	}
	if _, err := p.IdleCPU(50 * time.Millisecond); err != nil {
		t.Fatalf("idleCPU while running: %v", err)
	}

	// Killed during an idle-CPU reading: the reading fails.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = cmd.Process.Kill()
	}()
	if cpu, err := p.IdleCPU(400 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "the sleeper") {
		t.Errorf("idleCPU across the kill = %v, %v; want an error naming the process", cpu, err)
	}
	// Unreaped, it is a zombie.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := ReadStat(pid)
		if err != nil {
			t.Fatalf("the zombie's stat: %v", err)
		}
		if st.State == "Z" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not a zombie 5 s after SIGKILL: state %s", st.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for what, f := range map[string]func() error{
		"alive":      p.Alive,
		"rss":        func() error { _, err := p.RSS(); return err },
		"idleCPU":    func() error { _, err := p.IdleCPU(10 * time.Millisecond); return err },
		"settledRSS": func() error { _, err := p.SettledRSS(10 * time.Millisecond); return err },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "the sleeper") || !strings.Contains(err.Error(), "zombie") {
			t.Errorf("%s of a zombie: %v; want an error naming the process, a zombie", what, err)
		}
	}
	if _, err := Watch("the sleeper", pid); err == nil {
		t.Error("Watch accepted a zombie")
	}

	// Reaped: gone.
	_ = cmd.Wait()
	reaped = true
	if err := p.Alive(); err == nil || !strings.Contains(err.Error(), "the sleeper") {
		t.Errorf("alive once reaped: %v; want an error naming the process", err)
	}
	if _, err := p.RSS(); err == nil {
		t.Error("rss of a reaped process: no error")
	}

	// The pid held by another process (reused): a different start time.
	self, err := Watch("this test", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	other := self
	other.start++
	if err := other.Alive(); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("alive of a reused pid: %v; want an error", err)
	}
	if _, err := Watch("nobody", 0); err == nil {
		t.Error("Watch(0): no error")
	}
}

const statusRunning = `Name:	flock-policy
Umask:	0022
State:	S (sleeping)
Tgid:	4242
Pid:	4242
VmPeak:	 1290000 kB
VmSize:	 1289000 kB
VmHWM:	   40960 kB
VmRSS:	   30720 kB
RssAnon:	   20480 kB
Threads:	12
`

const statusZombie = `Name:	flock-policy
State:	Z (zombie)
Tgid:	4242
Pid:	4242
Threads:	1
`

func TestParseStatus(t *testing.T) {
	st, err := ParseStatus([]byte(statusRunning))
	if err != nil {
		t.Fatal(err)
	}
	if st.Name != "flock-policy" || st.State != "S" || st.RSSKB != 30720 {
		t.Errorf("parsed %+v", st)
	}
	if mb, err := st.LiveRSSMB("flock-policy"); err != nil || mb != 30 {
		t.Errorf("LiveRSSMB = %v, %v; want 30 MB", mb, err)
	}
	if _, err := st.LiveRSSMB("flock-agent"); err == nil {
		t.Error("another process's status accepted")
	}
	// The kernel keeps 15 bytes of the name.
	long := Status{Name: "flock-gobgp-bas", State: "R", RSSKB: 1024}
	if mb, err := long.LiveRSSMB("flock-gobgp-baseline"); err != nil || mb != 1 {
		t.Errorf("truncated name: %v, %v", mb, err)
	}
	for _, state := range []string{"Z", "X", ""} {
		if _, err := (Status{Name: "flock-policy", State: state, RSSKB: 1}).LiveRSSMB("flock-policy"); err == nil {
			t.Errorf("state %q accepted as alive", state)
		}
	}
	// A zombie has no memory: no figure, not 0.
	if _, err := ParseStatus([]byte(statusZombie)); err == nil {
		t.Error("a zombie's status parsed without error")
	}
	for _, bad := range []string{"VmRSS:\n", "VmRSS:\tlots kB\n", "VmRSS:\t12 MB\n", ""} {
		if _, err := ParseStatus([]byte("Name:\tx\nState:\tR (running)\n" + bad)); err == nil {
			t.Errorf("%q parsed without error", bad)
		}
	}
	// RSSMB reads this process's own.
	if mb, err := RSSMB(os.Getpid()); err != nil || mb <= 0 {
		t.Errorf("RSSMB(self) = %v, %v", mb, err)
	}
}
