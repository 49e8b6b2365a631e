package k8slab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// proc is one component process the lab started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been reaped
	err  error         // exit status, valid after done
}

// startProc runs bin with args as component name. Its stdout and stderr go
// to Dir/logs/<name>.log (a file, not a pipe, so the process never dies of
// SIGPIPE when the test stops reading) and its PID to Dir/run/<name>.pid.
func (c *Cluster) startProc(name, bin string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(c.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.Opts.Dir
	if err := startDetached(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	pidFile := filepath.Join(c.Opts.Dir, "run", name+".pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		p.stop(time.Second)
		return nil, fmt.Errorf("record %s pid: %w", name, err)
	}
	c.mu.Lock()
	c.procs[name] = p
	c.st.Procs[name] = procID{PID: cmd.Process.Pid, Start: processStart(cmd.Process.Pid)}
	c.mu.Unlock()
	if err := c.saveState(); err != nil {
		p.stop(time.Second)
		return nil, err
	}
	c.Opts.Log("k8slab: %s started, pid %d", name, cmd.Process.Pid)
	return p, nil
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exitErr describes how the process ended, for start-up failures.
func (p *proc) exitErr() error {
	if p.err == nil {
		return fmt.Errorf("%s exited", p.name)
	}
	return fmt.Errorf("%s exited: %w", p.name, p.err)
}

// stop sends SIGTERM to the recorded PID and SIGKILL after grace. The lab
// is the parent and reaps the child, so the PID cannot have been reused
// before done is closed.
func (p *proc) stop(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// stopProc stops component name if the lab started it.
func (c *Cluster) stopProc(name string, grace time.Duration) error {
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.stop(grace)
}
