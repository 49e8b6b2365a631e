// Package install puts the flock CNI plugin and its network config in
// place on a node. Both writes are atomic (temp file + rename), so a
// runtime exec'ing the plugin mid-upgrade never runs a half-written
// binary, and repeating an install changes nothing.
//
// The conflist's cniVersion is one that flock and every chained plugin
// answer to VERSION: containerd 2 asks every plugin in the chain for
// STATUS from 1.1.0 on, and an older portmap fails it (and ADD), which
// would keep the node NotReady for good. If there is none, the install is
// refused: no such conflist is ever written, and the report (package
// report) tells the agent, which reports it as not Ready.
package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/install/conffile"
	"code.fritzlab.net/fritzlab/flock/cni/install/report"
)

// ConfName and TempDir: see package conffile.
const (
	ConfName = conffile.ConfName
	TempDir  = conffile.TempDir
)

// Options for Install.
type Options struct {
	PluginSrc  string // the flock plugin binary to install
	CNIBinDir  string // e.g. /opt/cni/bin
	CNIConfDir string // e.g. /etc/cni/net.d
	Socket     string // agent CNI socket written into the config
	Portmap    bool   // chain the portmap plugin (hostPort)
	Bandwidth  bool   // chain the bandwidth plugin
	// CNIVersion of the conflist; "" picks the highest one flock and every
	// chained plugin support. Set, it must be one of those.
	CNIVersion string
	// HostRoot, if set, is where the host's root filesystem is mounted
	// (CNIBinDir is under it): chained plugins are run chrooted there, as
	// the runtime runs them on the host.
	HostRoot string
	// Runtime is the node's container runtime, as its
	// status.nodeInfo.containerRuntimeVersion says ("containerd://2.4.2"):
	// its libcni bounds the conflist's version like a chained plugin
	// (RuntimeVersions). "": not known, no bound.
	Runtime string
	// StageDir, if set, receives the conflist instead of CNIConfDir: the
	// agent publishes it there once it serves (conffile.Publish). A
	// refusal still acts on the conflist in CNIConfDir at once.
	StageDir string
}

// Versions the plugin supports, oldest first.
var Versions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Conflist renders the network config list in o.CNIVersion.
func Conflist(o Options) ([]byte, error) {
	if !slices.Contains(Versions, o.CNIVersion) {
		return nil, fmt.Errorf("installer: cni-version %q: want one of %v", o.CNIVersion, Versions)
	}
	plugins := []map[string]any{{"type": "flock", "socket": o.Socket}}
	if o.Portmap {
		plugins = append(plugins, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}})
	}
	if o.Bandwidth {
		plugins = append(plugins, map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}})
	}
	b, err := json.MarshalIndent(map[string]any{"cniVersion": o.CNIVersion, "name": "flock", "plugins": plugins}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Result is what Install did.
type Result struct {
	// Report is for the agent: the chosen version and the plugins, or the
	// error. It is filled in on every return.
	Report  report.Report
	Changed []string // files written or removed
}

// Install installs the plugin binary and, if every chained plugin runs
// with it, the conflist. An error wrapping ErrRefused means the chain
// rules out a conflist: then a flock conflist already in place is kept if
// the chain runs it (a bad --cni-version does not take a working node
// down) and removed if not (the runtime would go on failing with it).
func Install(ctx context.Context, o Options) (Result, error) {
	cdst := filepath.Join(o.CNIConfDir, ConfName)
	res := Result{Report: report.Report{Time: time.Now().UTC(), Flock: Versions, ConflistPath: cdst}}
	fail := func(err error) (Result, error) {
		res.Report.Error = err.Error()
		return res, err
	}
	if o.Socket == "" {
		return fail(errors.New("installer: socket path is empty"))
	}
	if _, err := o.onHost("--cni-bin-dir", o.CNIBinDir); err != nil {
		return fail(err)
	}
	hostConf, err := o.onHost("--cni-conf-dir", o.CNIConfDir)
	if err != nil {
		return fail(err)
	}
	res.Report.ConflistPath = filepath.Join(hostConf, ConfName)
	bin, err := os.ReadFile(o.PluginSrc)
	if err != nil {
		return fail(fmt.Errorf("installer: plugin source: %w", err))
	}
	probed := map[string]report.Plugin{}
	for _, typ := range o.chain() {
		p := o.probe(ctx, typ)
		probed[typ] = p
		res.Report.Plugins = append(res.Report.Plugins, p)
	}
	rt, err := o.runtimeMember()
	if err != nil {
		return fail(err)
	}
	res.Report.Runtime = rt
	members := res.Report.Plugins
	if rt != nil {
		members = append(slices.Clone(members), *rt)
	}
	v, refusal := choose(o.CNIVersion, members)
	// The binary goes in either way: a conflist kept after a refusal runs
	// it too, and it should match the agent.
	dst := filepath.Join(o.CNIBinDir, "flock")
	ok, err := conffile.Write(dst, o.CNIBinDir, bin, 0o755)
	if err != nil {
		return fail(err)
	}
	if ok {
		res.Changed = append(res.Changed, dst)
	}
	if refusal != nil {
		state, kept, err := o.settle(ctx, cdst, probed, rt)
		res.Report.Conflist, res.Report.CNIVersion = state, kept
		if state == report.ConflistRemoved {
			res.Changed = append(res.Changed, cdst)
		}
		return fail(errors.Join(refusal, err))
	}
	o.CNIVersion = v
	res.Report.CNIVersion = v
	conf, err := Conflist(o)
	if err != nil {
		return fail(err)
	}
	if o.StageDir != "" {
		staged := filepath.Join(o.StageDir, ConfName)
		ok, err = conffile.Write(staged, o.StageDir, conf, 0o644)
		if err != nil {
			return fail(err)
		}
		res.Report.Conflist, res.Report.Staged = report.ConflistStaged, staged
		if ok {
			res.Changed = append(res.Changed, staged)
		}
		return res, nil
	}
	ok, err = conffile.Write(cdst, filepath.Join(o.CNIConfDir, TempDir), conf, 0o644)
	if err == nil && ok {
		err = conffile.Nudge(cdst)
	}
	if err != nil {
		return fail(err)
	}
	res.Report.Conflist = report.ConflistUnchanged
	if ok {
		res.Report.Conflist = report.ConflistWritten
		res.Changed = append(res.Changed, cdst)
	}
	return res, nil
}

// settle decides on the flock conflist in place after a refusal: kept if
// flock, every plugin it chains and the runtime (rt, if known) support
// its cniVersion, else removed. It returns what it did and the kept one's
// version.
func (o Options) settle(ctx context.Context, path string, probed map[string]report.Plugin, rt *report.Plugin) (state, kept string, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return report.ConflistNone, "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("installer: %w", err)
	}
	var c struct {
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	runs := json.Unmarshal(b, &c) == nil && len(c.Plugins) > 0
	for _, p := range c.Plugins {
		if !runs {
			break
		}
		vs := Versions
		if p.Type != "flock" {
			pr, ok := probed[p.Type]
			if !ok {
				pr = o.probe(ctx, p.Type)
				probed[p.Type] = pr
			}
			vs = pr.Versions
		}
		runs = slices.Contains(vs, c.CNIVersion)
	}
	if runs && rt != nil {
		runs = slices.Contains(rt.Versions, c.CNIVersion)
	}
	if runs {
		return report.ConflistKept, c.CNIVersion, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", "", fmt.Errorf("installer: remove %s, which the chain cannot run: %w", path, err)
	}
	return report.ConflistRemoved, "", conffile.SyncDir(filepath.Dir(path))
}
