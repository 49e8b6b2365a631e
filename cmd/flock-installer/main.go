// Command flock-installer installs the flock CNI plugin and its network
// config on the host (the DaemonSet's init container).
//
// It exits 0 when the install is refused (no cniVersion that flock and
// every chained plugin support): the agent must still start to report the
// refusal, which it reads from --status-file.
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"code.fritzlab.net/fritzlab/flock/cni/install"
	"code.fritzlab.net/fritzlab/flock/cni/install/report"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func main() {
	var o install.Options
	flag.StringVar(&o.PluginSrc, "plugin", "/opt/flock/bin/flock", "plugin binary to install")
	flag.StringVar(&o.CNIBinDir, "cni-bin-dir", "/host/opt/cni/bin", "host CNI plugin directory")
	flag.StringVar(&o.CNIConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "host CNI config directory")
	flag.StringVar(&o.Socket, "socket", wire.DefaultSocket, "agent CNI socket path, as seen by the plugin on the host")
	flag.BoolVar(&o.Portmap, "portmap", false, "chain the portmap plugin (hostPort support)")
	flag.BoolVar(&o.Bandwidth, "bandwidth", false, "chain the bandwidth plugin")
	flag.StringVar(&o.CNIVersion, "cni-version", "", "cniVersion of the conflist (default: the highest that flock and every chained plugin answer to VERSION); one they do not all support is refused")
	flag.StringVar(&o.HostRoot, "host-root", "", "where the host's / is mounted (--cni-bin-dir under it): chained plugins are asked VERSION chrooted there, as the runtime runs them; empty runs them in place")
	statusFile := flag.String("status-file", report.DefaultPath, "where the outcome goes for the agent (JSON); empty writes none")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "flock-installer")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	res, err := install.Install(ctx, o)
	stop()
	for _, p := range res.Report.Plugins {
		if p.Error != "" {
			log.Warn("chained plugin unusable", "type", p.Type, "path", p.Path, "err", p.Error)
		} else {
			log.Info("chained plugin", "type", p.Type, "path", p.Path, "versions", p.Versions)
		}
	}
	if *statusFile != "" {
		// Without it the agent would read a stale outcome or none: retry.
		if werr := report.Write(*statusFile, res.Report); werr != nil {
			log.Error("status file", "err", werr)
			os.Exit(1)
		}
	}
	for _, c := range res.Changed {
		log.Info("changed", "path", c)
	}
	// A refusal that settled the conflist in place (kept or removed) is
	// the agent's to report; anything else is a failure to retry.
	if errors.Is(err, install.ErrRefused) && res.Report.Conflist != "" {
		log.Error("no conflist written: the agent reports this as not Ready", "err", err,
			"conflist", res.Report.ConflistPath, "in-place", res.Report.Conflist, "flock-versions", install.Versions)
		return
	}
	if err != nil {
		log.Error("install failed", "err", err)
		os.Exit(1)
	}
	log.Info("installed", "conflist", res.Report.ConflistPath, "cniVersion", res.Report.CNIVersion, "conflist-state", res.Report.Conflist)
}
