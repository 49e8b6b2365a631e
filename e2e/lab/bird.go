package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Bird is a BIRD 2 daemon running in a namespace (the ToR of a lab).
type Bird struct {
	NS      *NS
	Dir     string
	Conf    string
	Socket  string
	cmd     *exec.Cmd
	logPath string
	done    chan error
}

// StartBird writes conf and runs bird in the foreground inside ns, so the
// lab owns its PID; it returns once birdc answers.
func StartBird(ns *NS, dir, conf string) (*Bird, error) {
	b := &Bird{NS: ns, Dir: dir, Conf: filepath.Join(dir, "bird.conf"), Socket: filepath.Join(dir, "bird.ctl")}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(b.Conf, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	b.logPath = filepath.Join(dir, "bird.out")
	f, err := os.OpenFile(b.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b.cmd = exec.Command("bird", "-f", "-c", b.Conf, "-s", b.Socket, "-P", filepath.Join(dir, "bird.pid"))
	b.cmd.Stdout, b.cmd.Stderr = f, f
	if err := ns.InNS(b.cmd.Start); err != nil {
		return nil, fmt.Errorf("start bird in %s: %w (is bird2 installed?)", ns.Name, err)
	}
	b.done = make(chan error, 1)
	go func() { b.done <- b.cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := b.Cmd("show status"); err == nil {
			return b, nil
		}
		select {
		case err := <-b.done:
			b.done <- err
			return nil, fmt.Errorf("bird exited: %v\n%s", err, b.Log())
		default:
		}
		if time.Now().After(deadline) {
			b.Stop()
			return nil, fmt.Errorf("bird did not answer on %s:\n%s", b.Socket, b.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Cmd runs one birdc command and returns its output.
func (b *Bird) Cmd(args string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "birdc", append([]string{"-s", b.Socket}, strings.Fields(args)...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("birdc %s: %w: %s", args, err, out)
	}
	return string(out), nil
}

// Reconfigure replaces the config and tells bird to load it.
func (b *Bird) Reconfigure(conf string) error {
	if err := os.WriteFile(b.Conf, []byte(conf), 0o644); err != nil {
		return err
	}
	out, err := b.Cmd("configure")
	if err != nil {
		return err
	}
	if !strings.Contains(out, "Reconfigured") && !strings.Contains(out, "Reconfiguration in progress") {
		return fmt.Errorf("birdc configure: %s", out)
	}
	return nil
}

// Log returns bird's stdout/stderr and its log file.
func (b *Bird) Log() string {
	out, _ := os.ReadFile(b.logPath)
	lg, _ := os.ReadFile(filepath.Join(b.Dir, "bird.log"))
	return string(out) + string(lg)
}

// Stop ends bird (SIGTERM, then SIGKILL) and waits for it.
func (b *Bird) Stop() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-b.done:
		b.done <- err
	case <-time.After(5 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

// Pid of the bird process.
func (b *Bird) Pid() int {
	if b.cmd == nil || b.cmd.Process == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// Detach lets bird outlive the lab process (the demo's -keep).
func (b *Bird) Detach() {
	if b.cmd != nil && b.cmd.Process != nil {
		_ = b.cmd.Process.Release()
	}
	b.cmd = nil
}

// Kill SIGKILLs bird (a ToR crash: no NOTIFICATION, no BFD AdminDown) and
// waits for it; StartBird with the same dir and config brings it back.
func (b *Bird) Kill() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Kill()
	err := <-b.done
	b.done <- err
	_ = os.Remove(b.Socket)
}
