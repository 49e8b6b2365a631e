package k8slab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// ShimPIDs lists processes whose command line names socket as an argument:
// the containerd shims (and any containerd) serving that socket. Shims
// outlive containerd, so Down finds them this way.
func ShimPIDs(socket string) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	self := os.Getpid()
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(b, []byte{0}) {
			if string(arg) == socket {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// killShims stops the shims of the lab's containerd: SIGTERM, then SIGKILL
// for those still there after a few seconds. They are not the lab's
// children (containerd daemonizes them), so exit is observed by polling.
func killShims(socket string) error {
	pids := ShimPIDs(socket)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(pids) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		pids = ShimPIDs(socket)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	if left := ShimPIDs(socket); len(left) > 0 {
		return errors.New(fmt.Sprint("shims still running: ", left))
	}
	return nil
}
