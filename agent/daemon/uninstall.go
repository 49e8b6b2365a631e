package daemon

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/install/conffile"
	"code.fritzlab.net/fritzlab/flock/k8s/uninstall"
)

// An uninstall (`kubectl delete -k deploy/`): the planned stop finds this
// pod deleted for good (uninstall.Uninstalling), and instead of preparing
// a restart the agent takes flock off the node. In order:
//
//  1. the conflist goes, so the runtime calls flock no more (and the node
//     turns NotReady, as a node without a CNI is);
//  2. Service addresses drain, if the NodeConfig says so, then every route
//     is withdrawn from the ToR while the sessions are still up (graceful
//     restart must not keep them there);
//  3. once every component has stopped: every flock veth (the pods lose
//     their network) and route, then the files: the plugin, the store,
//     the sockets (Options.UninstallRemove).
//
// Any other stop leaves all of it, so pods keep forwarding.

// leaveWithdraw bounds how long the withdrawals may take to go out.
const leaveWithdraw = 5 * time.Second

// uninstalling asks the API whether this stop is an uninstall. Kubernetes
// mode with the pod known only; anything else (standalone, no answer) is
// a restart.
func (d *daemon) uninstalling() bool {
	if d.kube == nil || d.o.PodName == "" || d.o.Namespace == "" {
		return false
	}
	// A refusal alone is no proof (a ClusterRoleBinding replaced during a
	// rollout refuses for a moment too, a force-deleted pod's token dies
	// with it), and this uninstall takes every pod's network: it needs
	// flock's namespace seen Terminating, as `kubectl delete -k deploy/`
	// makes it before it deletes the ServiceAccount and the RBAC.
	gone, why := uninstall.Uninstalling(context.Background(), d.kube.dyn, d.o.Namespace, d.o.PodName, d.kube.leaving)
	if gone {
		d.log.Info("uninstall: flock is leaving this node; its routes, veths and files go with it", "why", why)
	} else {
		d.log.Info("planned stop: flock stays on this node", "why", why)
	}
	return gone
}

// leaveDrain bounds an uninstall's drain (drainOnStopSeconds allows 300
// s): kubelet kills the agent 30 s after SIGTERM
// (terminationGracePeriodSeconds), and the withdrawal and the removals
// must come before that.
const leaveDrain = 10 * time.Second

// leave is steps 1 and 2, before the components stop. It may come while
// start-up still runs: the conflist stays removed (publishConflist), and
// nothing is advertised from then on (state.Leave).
func (d *daemon) leave() {
	d.removeConflist()
	// Not while start-up is between originating routes and serving.
	d.startMu.Lock()
	defer d.startMu.Unlock()
	if !d.ready.Load() {
		d.state.Leave() // start-up originates nothing now
		return
	}
	d.drainServices(func(wait time.Duration) {
		if wait > leaveDrain {
			d.log.Info("uninstall: the drain is cut short: the agent has 30 s to leave", "drainOnStopSeconds", wait, "drains", leaveDrain)
			wait = leaveDrain
		}
		time.Sleep(wait)
	})
	gen := d.state.Leave()
	// Start-up may not have added the peers yet (it waits for the Service
	// routes): a graceful-restart ToR still holds the routes of the agent
	// before, and only a session's End-of-RIB, now of nothing, flushes
	// them.
	d.openPeers()
	ctx, cancel := context.WithTimeout(context.Background(), leaveWithdraw)
	defer cancel()
	if err := d.bgpLoop.Wait(ctx, gen); err != nil {
		d.log.Error("uninstall: the routes' withdrawal was not confirmed; the ToR drops them when the session ends", "err", err)
		return
	}
	d.log.Info("uninstall: every route withdrawn from the ToR")
}

// removeConflist takes the conflist away for good (and the installer's
// temp dir beside it).
func (d *daemon) removeConflist() {
	d.confMu.Lock()
	defer d.confMu.Unlock()
	d.confGone = true
	if d.o.CNIConfDir == "" {
		return
	}
	conf := filepath.Join(d.o.CNIConfDir, conffile.ConfName)
	for _, p := range []string{conf, filepath.Join(d.o.CNIConfDir, conffile.TempDir)} {
		if err := os.RemoveAll(p); err != nil {
			d.log.Error("uninstall: removing the conflist failed", "path", p, "err", err)
		}
	}
	d.log.Info("uninstall: the conflist is removed", "path", conf)
}

// removeNode is step 3, once nothing runs any more.
func (d *daemon) removeNode() {
	d.removeConflist() // again: nothing may have put it back
	veths, routes, err := d.dp.RemoveAll()
	if err != nil {
		d.log.Error("uninstall: removing the dataplane", "err", err)
	}
	d.log.Info("uninstall: the dataplane is removed", "veths", veths, "routes", routes)
	d.removePaths()
}

// emptyDir tells whether p is a directory with nothing in it.
func emptyDir(p string) bool {
	entries, err := os.ReadDir(p)
	return err == nil && len(entries) == 0
}

// removePaths removes Options.UninstallRemove; one that is not there is
// no problem (an uninstall retried).
func (d *daemon) removePaths() {
	for _, p := range d.o.UninstallRemove {
		err := os.RemoveAll(p)
		switch {
		case err == nil || errors.Is(err, fs.ErrNotExist):
			d.log.Info("uninstall: removed", "path", p)
		case errors.Is(err, syscall.EBUSY) && emptyDir(p):
			// Something mounts it here (not so on a node, where
			// only the parent is mounted): emptied, it stays.
			d.log.Info("uninstall: emptied; the directory stays, a mount point", "path", p)
		default:
			d.log.Error("uninstall: removing failed", "path", p, "err", err)
		}
	}
}
