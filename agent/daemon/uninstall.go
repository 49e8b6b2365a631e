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
	gone, why := uninstall.Uninstalling(context.Background(), d.kube.dyn, d.o.Namespace, d.o.PodName)
	if gone {
		d.log.Info("uninstall: flock is leaving this node; its routes, veths and files go with it", "why", why)
	} else {
		d.log.Info("planned stop: flock stays on this node", "why", why)
	}
	return gone
}

// leave is steps 1 and 2, before the components stop.
func (d *daemon) leave() {
	if d.o.CNIConfDir != "" {
		conf := filepath.Join(d.o.CNIConfDir, conffile.ConfName)
		for _, p := range []string{conf, filepath.Join(d.o.CNIConfDir, conffile.TempDir)} {
			if err := os.RemoveAll(p); err != nil {
				d.log.Error("uninstall: removing the conflist failed", "path", p, "err", err)
			}
		}
		d.log.Info("uninstall: the conflist is removed", "path", conf)
	}
	if !d.ready.Load() {
		return // nothing was advertised for this run
	}
	d.drainServices(time.Sleep)
	gen := d.state.Leave()
	ctx, cancel := context.WithTimeout(context.Background(), leaveWithdraw)
	defer cancel()
	if err := d.bgpLoop.Wait(ctx, gen); err != nil {
		d.log.Error("uninstall: the routes' withdrawal was not confirmed; the ToR drops them when the session ends", "err", err)
		return
	}
	d.log.Info("uninstall: every route withdrawn from the ToR")
}

// removeNode is step 3, once nothing runs any more.
func (d *daemon) removeNode() {
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
