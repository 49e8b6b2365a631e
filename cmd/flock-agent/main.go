// Command flock-agent is flock's node daemon: IPAM, allocation store,
// dataplane and the embedded BGP speaker, serving the CNI plugin and
// flockctl over unix sockets.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/daemon"
	"code.fritzlab.net/fritzlab/flock/agent/metrics"
	"code.fritzlab.net/fritzlab/flock/cni/install/report"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "flock-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	var o daemon.Options
	flag.StringVar(&o.NodeConfig, "node-config", "", "standalone mode: NodeConfig YAML file (its spec is the NodeConfig CRD's spec); reloaded on change and on SIGHUP")
	flag.StringVar(&o.CNISocket, "cni-socket", wire.DefaultSocket, "unix socket the CNI plugin talks to")
	flag.StringVar(&o.AdminSocket, "admin-socket", admin.DefaultSocket, "unix socket flockctl talks to")
	flag.StringVar(&o.StateDir, "state-dir", "/var/lib/flock", "directory of the allocation store")
	flag.StringVar(&o.MetricsAddress, "metrics-address", metrics.DefaultAddress, "address for /metrics, /healthz and /readyz; empty disables")
	flag.BoolVar(&o.Kubernetes, "kubernetes", false, "Kubernetes mode: NodeConfig, pods and BGP passwords from the API server")
	flag.StringVar(&o.Kubeconfig, "kubeconfig", "", "Kubernetes mode: kubeconfig file (default: in-cluster config)")
	flag.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "Kubernetes mode: this node's name (default $NODE_NAME)")
	flag.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "Kubernetes mode: flock's namespace, where the BGP password Secret is (default $POD_NAMESPACE, else flock-system)")
	flag.DurationVar(&o.NodeConfigWait, "nodeconfig-wait", 5*time.Minute, "Kubernetes mode: how long to wait for this node's NodeConfig to exist")
	flag.DurationVar(&o.LeakGCGrace, "leak-gc-grace", 2*time.Minute, "Kubernetes mode: how long an allocation of a deleted pod waits for kubelet's DEL before it is released")
	flag.DurationVar(&o.Repair, "repair-interval", 30*time.Second, "period of the full repair: the route reconcilers re-read the speaker and the kernel, and allocations whose network namespace vanished are reaped")
	flag.StringVar(&o.InstallerStatus, "installer-status", "", "the CNI installer's report (flock-installer --status-file), read at start: a refusal there keeps the agent not Ready; a missing file is no problem (standalone mode) (default "+report.FileName+" next to --cni-socket)")
	flag.DurationVar(&o.RestartGrace, "restart-grace", 30*time.Second, "how long a planned stop (SIGTERM) keeps the node Ready without an agent: the CNI plugin's STATUS succeeds while the restart marker next to --cni-socket is fresh; 0 leaves none")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	testHook := flag.String("test-hook", "", "testing only: 'pause-before-commit' blocks every ADD after the dataplane is programmed, before the commit")
	flag.Parse()
	if o.InstallerStatus == "" {
		o.InstallerStatus = filepath.Join(filepath.Dir(o.CNISocket), report.FileName)
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %q: %w", *logLevel, err)
	}
	o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(o.Log)
	switch {
	case o.RestartGrace < 0 || o.RestartGrace > wire.MaxRestartGrace:
		return fmt.Errorf("--restart-grace %v: want 0 to %v", o.RestartGrace, wire.MaxRestartGrace)
	case o.Kubernetes && o.NodeConfig != "":
		return errors.New("--node-config and --kubernetes are exclusive: the NodeConfig comes from the file or from the API")
	case !o.Kubernetes && o.NodeConfig == "":
		return errors.New("set --node-config FILE (standalone mode) or --kubernetes")
	}
	switch *testHook {
	case "":
	case "pause-before-commit":
		o.Hooks.BeforeCommit = func(id string) {
			o.Log.Warn("test hook: pausing before commit until killed", "container", id)
			select {}
		}
	default:
		return fmt.Errorf("--test-hook: unknown hook %q", *testHook)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := daemon.Run(ctx, o)
	o.Log.Info("stopped")
	return err
}
