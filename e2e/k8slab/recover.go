package k8slab

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// stopOrder stops what uses the API or the runtime before what they use.
var stopOrder = []string{Scheduler, ControllerManager, Kubelet, Containerd, KubeProxy, CoreDNS, APIServer, Etcd}

// recoverStale restores the host after a lab whose test process died
// without calling Down, as recorded by activeMarker and that lab's state
// file. Its components are stopped by their recorded PIDs, only when the
// process start time still matches.
func recoverStale(log func(string, ...any)) error {
	b, err := os.ReadFile(activeMarker)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", activeMarker, err)
	}
	dir := strings.TrimSpace(string(b))
	st, err := loadState(dir)
	if err != nil {
		log("k8slab: stale %s names %s, but: %v; ignoring it", activeMarker, dir, err)
		return os.Remove(activeMarker)
	}
	log("k8slab: a lab in %s was not stopped; cleaning up after it", dir)
	var errs []error
	for _, name := range stopOrder {
		if id, ok := st.Procs[name]; ok {
			errs = append(errs, stopRecorded(name, id))
		}
	}
	errs = append(errs, killShims(st.Socket), restoreHost(st))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clean up after the lab in %s: %w", dir, err)
	}
	return nil
}

// stopRecorded stops a process the lab started in an earlier test process:
// SIGTERM, SIGKILL after ten seconds, exit observed by polling.
func stopRecorded(name string, id procID) error {
	sig := syscall.SIGTERM
	for range 2 {
		if processStart(id.PID) != id.Start {
			return nil
		}
		if err := syscall.Kill(id.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal %s (pid %d): %w", name, id.PID, err)
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if processStart(id.PID) != id.Start {
				return nil
			}
		}
		sig = syscall.SIGKILL
	}
	return fmt.Errorf("%s (pid %d) did not exit", name, id.PID)
}
