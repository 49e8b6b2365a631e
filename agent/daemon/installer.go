package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"code.fritzlab.net/fritzlab/flock/cni/install/conffile"
	"code.fritzlab.net/fritzlab/flock/cni/install/report"
)

// readInstaller reads the CNI installer's report and returns its refusal
// ("" if it installed, or no report is there: standalone mode, an older
// installer). A refusal keeps the agent from being Ready.
func (d *daemon) readInstaller(path string) string {
	if path == "" {
		return ""
	}
	r, err := report.Read(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		d.log.Info("no CNI installer report", "path", path)
		return ""
	case err != nil:
		d.log.Error("CNI installer report unreadable: not Ready", "err", err)
		return err.Error()
	case r.Error != "":
		msg := r.Error
		if r.Conflist != "" {
			msg = fmt.Sprintf("%s (%s: %s)", r.Error, r.ConflistPath, r.Conflist)
		}
		d.log.Error("the CNI installer refused: not Ready until it installs", "err", r.Error,
			"conflist", r.ConflistPath, "in-place", r.Conflist, "report", path)
		return msg
	}
	var plugins []string
	for _, p := range r.Plugins {
		plugins = append(plugins, fmt.Sprintf("%s %s [%s]", p.Type, p.Path, strings.Join(p.Versions, ",")))
	}
	d.log.Info("CNI installer", "cniVersion", r.CNIVersion, "conflist", r.ConflistPath, "state", r.Conflist, "chained", plugins)
	d.staged = r.Staged
	return ""
}

// publishConflist puts the conflist the installer staged into the
// runtime's conf dir, once this agent serves: the runtime then never calls
// a plugin whose agent cannot answer (before that, no flock conflist: the
// node's network is not ready and kubelet schedules no pod to it). A
// failure keeps the agent not Ready, naming the file.
func (d *daemon) publishConflist() {
	if d.staged == "" || d.o.CNIConfDir == "" || d.installer != "" {
		return
	}
	// Not once an uninstall removed it (leave): start-up may still be
	// running when the stop comes.
	d.confMu.Lock()
	defer d.confMu.Unlock()
	if d.confGone {
		return
	}
	wrote, err := conffile.Publish(d.staged, d.o.CNIConfDir)
	if err != nil {
		d.log.Error("the CNI conflist: not published: not Ready", "err", err, "staged", d.staged, "conf-dir", d.o.CNIConfDir)
		msg := err.Error()
		d.publishErr.Store(&msg)
		return
	}
	d.log.Info("the CNI conflist is published", "staged", d.staged, "conf-dir", d.o.CNIConfDir, "changed", wrote)
}

// readiness is /readyz's answer.
func (d *daemon) readiness() error {
	if !d.ready.Load() {
		return errors.New("recovering allocations")
	}
	if d.installer != "" {
		return fmt.Errorf("cni installer: %s", d.installer)
	}
	if e := d.publishErr.Load(); e != nil {
		return fmt.Errorf("cni conflist: %s", *e)
	}
	return nil
}
