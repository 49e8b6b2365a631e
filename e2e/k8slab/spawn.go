package k8slab

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Components get SIGKILL when the test process dies (Pdeathsig), so a
// crashed or timed-out test does not leave an apiserver holding the lab's
// ports. Linux sends that signal when the *thread* that forked the child
// exits, and Go ends threads whose goroutine exits while locked to them
// (netns code does that on purpose), so every component is forked from one
// goroutine that stays locked to its thread for the life of the process.
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startDetached starts cmd in a session of its own (so terminal signals to
// the test's process group do not reach it) that dies with the test process.
func startDetached(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go spawnLoop()
	})
	r := spawnReq{cmd: cmd, done: make(chan error, 1)}
	spawnReqs <- r
	return <-r.done
}

func spawnLoop() {
	runtime.LockOSThread() // never unlocked: see the comment on spawnOnce
	for r := range spawnReqs {
		r.done <- r.cmd.Start()
	}
}
