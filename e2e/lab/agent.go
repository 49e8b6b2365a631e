package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

// Agent is a flock-agent process running inside a node namespace.
type Agent struct {
	NS          *NS
	Dir         string // holds the config, sockets and state dir
	ConfigPath  string
	CNISocket   string
	AdminSocket string
	StateDir    string
	Args        []string // extra flags
	// Kubeconfig, if set, runs the agent in Kubernetes mode as node
	// NodeName instead of from ConfigPath.
	Kubeconfig, NodeName string

	cmd     *exec.Cmd
	logPath string
	done    chan error
}

// NewAgent lays out dir for an agent in ns with the given node config.
func NewAgent(ns *NS, dir, nodeConfigYAML string) (*Agent, error) {
	a := &Agent{
		NS: ns, Dir: dir,
		ConfigPath:  filepath.Join(dir, "nodeconfig.yaml"),
		CNISocket:   filepath.Join(dir, "cni.sock"),
		AdminSocket: filepath.Join(dir, "admin.sock"),
		StateDir:    filepath.Join(dir, "state"),
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(a.ConfigPath, []byte(nodeConfigYAML), 0o644); err != nil {
		return nil, err
	}
	return a, nil
}

// Start launches the agent binary inside the node namespace and waits
// until it answers STATUS, or returns its log if it exits first.
func (a *Agent) Start(bin string, timeout time.Duration) error {
	mode := []string{"--node-config", a.ConfigPath}
	if a.Kubeconfig != "" {
		mode = []string{"--kubernetes", "--kubeconfig", a.Kubeconfig, "--node-name", a.NodeName, "--namespace", "flock-system"}
	}
	args := append(append(mode, "--cni-socket", a.CNISocket,
		"--admin-socket", a.AdminSocket, "--state-dir", a.StateDir, "--log-level", "debug",
	), a.Args...)
	// The log goes to a file, not a pipe: an agent left running by the
	// demo must not die of SIGPIPE when the lab process exits.
	a.logPath = filepath.Join(a.Dir, "agent.log")
	f, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	a.cmd = exec.Command(bin, args...)
	a.cmd.Stdout, a.cmd.Stderr = f, f
	if err := a.NS.InNS(a.cmd.Start); err != nil {
		return fmt.Errorf("start agent in %s: %w", a.NS.Name, err)
	}
	a.done = make(chan error, 1)
	go func() { a.done <- a.cmd.Wait() }()
	return a.WaitReady(timeout)
}

// WaitReady polls STATUS until the agent has recovered its state.
func (a *Agent) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := wire.Client{Socket: a.CNISocket, DialTimeout: time.Second, IOTimeout: 2 * time.Second}
	for {
		select {
		case err := <-a.done:
			a.done <- err
			return fmt.Errorf("agent exited (%v) before it was ready; log:\n%s", err, a.Log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := c.Call(ctx, wire.Request{Op: wire.OpStatus})
		cancel()
		if err == nil && resp.Error == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent not ready after %s (last: %v %v); log:\n%s", timeout, err, resp.Error, a.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Log returns everything the agent printed (all runs).
func (a *Agent) Log() string {
	if a.logPath == "" {
		return ""
	}
	b, _ := os.ReadFile(a.logPath)
	return string(b)
}

// Pid of the running agent (0 if not started).
func (a *Agent) Pid() int {
	if a.cmd == nil || a.cmd.Process == nil {
		return 0
	}
	return a.cmd.Process.Pid
}

// Stop sends SIGTERM and waits for the exit.
func (a *Agent) Stop() error { return a.signal(syscall.SIGTERM) }

// Kill sends SIGKILL (no chance to clean up) and waits for the exit.
func (a *Agent) Kill() error { return a.signal(syscall.SIGKILL) }

func (a *Agent) signal(sig syscall.Signal) error {
	if a.cmd == nil || a.cmd.Process == nil || a.done == nil {
		return nil
	}
	select {
	case err := <-a.done:
		a.done <- err
		return nil // already gone
	default:
	}
	if err := a.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case err := <-a.done:
		a.done <- err
		var ee *exec.ExitError
		if sig == syscall.SIGKILL && errors.As(err, &ee) {
			return nil
		}
		return err
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		return fmt.Errorf("agent pid %d ignored %s for 10s; killed", a.cmd.Process.Pid, sig)
	}
}

// Detach lets the agent outlive the lab process (the demo's -keep): the
// lab stops waiting for it and will not signal it.
func (a *Agent) Detach() {
	if a.cmd != nil && a.cmd.Process != nil {
		_ = a.cmd.Process.Release()
	}
	a.cmd, a.done = nil, nil
}
