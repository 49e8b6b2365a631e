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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/install/report"
)

// ConfName is lexically first so runtimes pick it over other CNIs' files.
const ConfName = "01-flock.conflist"

// TempDir is the conf dir's subdirectory the conflist is written in before
// it is renamed into place: runtimes watch the conf dir (not recursively)
// and try to load whatever appears there, a half-written temp file too.
const TempDir = ".flock-install"

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
	ok, err := writeAtomic(dst, o.CNIBinDir, bin, 0o755)
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
	ok, err = writeAtomic(cdst, filepath.Join(o.CNIConfDir, TempDir), conf, 0o644)
	if err == nil && ok {
		err = nudge(cdst)
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
	return report.ConflistRemoved, "", syncDir(filepath.Dir(path))
}

// writeAtomic puts data at dst unless it is there already: a temp file in
// tmpDir (on dst's filesystem), fsync, rename, fsync of dst's directory.
// It reports whether it wrote.
func writeAtomic(dst, tmpDir string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	dir := filepath.Dir(dst)
	for _, d := range []string{dir, tmpDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return false, fmt.Errorf("installer: %w", err)
		}
	}
	pattern := "." + filepath.Base(dst) + ".*.tmp"
	// Left by an installer that died mid-write: only one runs per node.
	if stale, err := filepath.Glob(filepath.Join(tmpDir, pattern)); err == nil {
		for _, s := range stale {
			_ = os.Remove(s)
		}
	}
	tmp, err := os.CreateTemp(tmpDir, pattern)
	if err != nil {
		return false, fmt.Errorf("installer: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("installer: write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return false, fmt.Errorf("installer: install %s: %w", dst, err)
	}
	return true, syncDir(dir)
}

// nudge makes the runtime load the conflist that was just renamed into
// place. A rename into the watched dir reaches the watcher as a Create,
// and containerd's conf syncer (1.7 and 2.x) reloads only on Write,
// Rename or Remove, ignoring Create and Chmod: the conflist would wait for
// the next unrelated change. Writing the file's first byte over itself
// raises a Write without ever changing what a reader sees.
func nudge(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("installer: %w", err)
	}
	first := make([]byte, 1)
	r, err := os.Open(path)
	if err == nil {
		_, err = r.ReadAt(first, 0)
		r.Close()
	}
	if err == nil {
		_, err = f.WriteAt(first, 0)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("installer: make the runtime load %s: %w", path, err)
	}
	return nil
}

// syncDir makes a rename or remove in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("installer: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("installer: fsync %s: %w", dir, err)
	}
	return nil
}
