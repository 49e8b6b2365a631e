// Command flock-agent is flock's node daemon: IPAM, allocation store,
// dataplane and (later) the BGP speaker, serving the CNI plugin and flockctl
// over unix sockets.
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
	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/nodeconfig"
	"code.fritzlab.net/fritzlab/flock/podmeta"
	"code.fritzlab.net/fritzlab/flock/store"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "flock-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	nodeConfig := flag.String("node-config", "", "standalone mode: NodeConfig YAML file (its spec is the NodeConfig CRD's spec)")
	cniSocket := flag.String("cni-socket", wire.DefaultSocket, "unix socket the CNI plugin talks to")
	adminSocket := flag.String("admin-socket", admin.DefaultSocket, "unix socket flockctl talks to")
	stateDir := flag.String("state-dir", "/var/lib/flock", "directory of the allocation store")
	logLevel := flag.String("log-level", "info", "debug, info, warn or error")
	testHook := flag.String("test-hook", "", "testing only: 'pause-before-commit' blocks every ADD after the dataplane is programmed, before the commit")
	flag.Parse()

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %q: %w", *logLevel, err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	if *nodeConfig == "" {
		return errors.New("--node-config is required (standalone mode; Kubernetes mode is not built yet)")
	}
	nc, err := nodeconfig.Load(*nodeConfig)
	if err != nil {
		return err
	}
	st, err := store.Open(*stateDir)
	if err != nil {
		return err
	}
	cfg := agent.Config{
		Spec: &nc.Spec, Store: st, Dataplane: &dataplane.Netlink{Log: log},
		Source: podmeta.Standalone{}, Log: log, ReadyOnCommit: true,
	}
	switch *testHook {
	case "":
	case "pause-before-commit":
		cfg.Hooks.BeforeCommit = func(id string) {
			log.Warn("test hook: pausing before commit until killed", "container", id)
			select {}
		}
	default:
		return fmt.Errorf("--test-hook: unknown hook %q", *testHook)
	}
	a, err := agent.New(cfg)
	if err != nil {
		return fmt.Errorf("node config %s: %w", *nodeConfig, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// Bind the sockets before recovery so a plugin call during startup gets
	// "starting" instead of "not running"; Handle refuses until Start is done.
	cl, err := wire.Listen(*cniSocket)
	if err != nil {
		return err
	}
	al, err := admin.Listen(*adminSocket)
	if err != nil {
		cl.Close()
		return err
	}
	errc := make(chan error, 2)
	go func() {
		srv := &wire.Server{Handler: wire.HandlerFunc(a.Handle), Logger: log}
		errc <- srv.Serve(ctx, cl)
	}()
	go func() { errc <- admin.Serve(ctx, al, agent.AdminSource{A: a}) }()

	if err := a.Start(ctx); err != nil {
		stop()
		<-errc
		<-errc
		return err
	}
	log.Info("serving", "cni-socket", *cniSocket, "admin-socket", *adminSocket, "state-dir", *stateDir, "node", nc.Metadata.Name)
	var first error
	for range 2 {
		if err := <-errc; err != nil && first == nil {
			first = err
			stop()
		}
	}
	// Kernel state stays: pods keep their network while the agent is down.
	log.Info("stopped")
	return first
}
