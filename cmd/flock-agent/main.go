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
	"syscall"

	"code.fritzlab.net/fritzlab/flock/admin"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
	"code.fritzlab.net/fritzlab/flock/daemon"
	"code.fritzlab.net/fritzlab/flock/metrics"
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
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	testHook := flag.String("test-hook", "", "testing only: 'pause-before-commit' blocks every ADD after the dataplane is programmed, before the commit")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %q: %w", *logLevel, err)
	}
	o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(o.Log)
	if o.NodeConfig == "" {
		return errors.New("--node-config is required (standalone mode; Kubernetes mode is not built yet)")
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
