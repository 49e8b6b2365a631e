// Command flock-agent is flock's node daemon: IPAM, allocation store,
// dataplane and the embedded BGP speaker, serving the CNI plugin and
// flockctl over unix sockets.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/daemon"
	"code.fritzlab.net/fritzlab/flock/agent/metrics"
	"code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	"code.fritzlab.net/fritzlab/flock/cni/install/report"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func main() {
	c, code, exit := parseFlags(os.Args[1:], os.Stdout, os.Stderr)
	if exit {
		os.Exit(code)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "flock-agent:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	o        daemon.Options
	logLevel string
	testHook string
}

// testingOnly starts the help of a flag for tests: --help leaves it out.
const testingOnly = "testing only"

// parseFlags reads the command line. exit says the process is done, with
// code: --help and --version (0, on stdout), a usage error (2, named on
// stderr).
func parseFlags(args []string, stdout, stderr io.Writer) (c config, code int, exit bool) {
	o := &c.o
	fs := flag.NewFlagSet("flock-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, --help is printed below
	fs.StringVar(&o.NodeConfig, "node-config", "", "standalone mode: NodeConfig YAML file (its spec is the NodeConfig CRD's spec); reloaded on change and on SIGHUP")
	fs.StringVar(&o.CNISocket, "cni-socket", wire.DefaultSocket, "unix socket the CNI plugin talks to")
	fs.StringVar(&o.AdminSocket, "admin-socket", admin.DefaultSocket, "unix socket flockctl talks to")
	fs.StringVar(&o.StateDir, "state-dir", "/var/lib/flock", "directory of the allocation store")
	fs.StringVar(&o.MetricsAddress, "metrics-address", metrics.DefaultAddress, "address for /metrics, /healthz and /readyz; empty disables")
	fs.BoolVar(&o.Kubernetes, "kubernetes", false, "Kubernetes mode: NodeConfig, pods and BGP passwords from the API server")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Kubernetes mode: kubeconfig file (default: in-cluster config)")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "Kubernetes mode: this node's name (default $NODE_NAME)")
	fs.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "Kubernetes mode: flock's namespace, where the BGP password Secret is (default $POD_NAMESPACE, else flock-system)")
	fs.StringVar(&o.PodName, "pod-name", os.Getenv("POD_NAME"), "Kubernetes mode: the agent's own pod (default $POD_NAME); at a planned stop, flock leaves the node (routes withdrawn, veths, conflist and --uninstall-remove removed) if the API says the pod's DaemonSet is gone; empty: every stop is a restart")
	fs.Func("uninstall-remove", "Kubernetes mode: a path an uninstall removes last (repeat, or separate with commas): the plugin binary, the state and run directories as mounted", func(v string) error {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				if !filepath.IsAbs(p) || filepath.Clean(p) == "/" {
					return fmt.Errorf("--uninstall-remove %q: want an absolute path other than /", p)
				}
				o.UninstallRemove = append(o.UninstallRemove, filepath.Clean(p))
			}
		}
		return nil
	})
	fs.DurationVar(&o.NodeConfigWait, "nodeconfig-wait", 5*time.Minute, "Kubernetes mode: how long to wait for this node's NodeConfig to exist")
	fs.DurationVar(&o.LeakGCGrace, "leak-gc-grace", 2*time.Minute, "Kubernetes mode: how long an allocation of a deleted pod waits for kubelet's DEL before it is released")
	fs.DurationVar(&o.Repair, "repair-interval", 30*time.Second, "period of the full repair: the route reconcilers re-read the speaker and the kernel, and allocations whose network namespace vanished are reaped")
	fs.StringVar(&o.InstallerStatus, "installer-status", "", "the CNI installer's report (flock-installer --status-file), read at start: a refusal there keeps the agent not Ready; a missing file is no problem (standalone mode) (default "+report.FileName+" next to --cni-socket)")
	fs.StringVar(&o.CNIConfDir, "cni-conf-dir", "", "publish the conflist the installer staged (its report's staged file, installer --stage-dir) into this directory once the agent serves; empty: never")
	fs.DurationVar(&o.RestartGrace, "restart-grace", 30*time.Second, "how long a planned stop (SIGTERM) keeps the node Ready without an agent: the CNI plugin's STATUS succeeds while the restart marker next to --cni-socket is fresh; 0 leaves none")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.testHook, "test-hook", "", testingOnly+": 'pause-before-commit' blocks every ADD after the dataplane is programmed, before the commit")
	version := fs.Bool("version", false, "print the version and exit")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage(stdout, fs)
		return c, 0, true
	case err != nil:
		fmt.Fprintf(stderr, "flock-agent: %v\nRun 'flock-agent --help' for usage.\n", err)
		return c, 2, true
	case *version:
		fmt.Fprintln(stdout, buildinfo.Line("flock-agent"))
		return c, 0, true
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "flock-agent: unexpected argument %q (it takes flags only)\nRun 'flock-agent --help' for usage.\n", fs.Arg(0))
		return c, 2, true
	}
	return c, 0, false
}

// usage prints the help: every flag but those for tests.
func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `usage: flock-agent (--node-config FILE | --kubernetes) [flags]

flock's node daemon: IPAM, allocation store, dataplane and the embedded BGP
speaker, serving the CNI plugin and flockctl over unix sockets.

flags:
`)
	// A flag set of the shown flags, with their defaults (not the values
	// parsed before --help), printed as the flag package prints them.
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, testingOnly) {
			return
		}
		shown.Var(f.Value, f.Name, f.Usage)
		shown.Lookup(f.Name).DefValue = f.DefValue
	})
	shown.SetOutput(w)
	shown.PrintDefaults()
}

func run(c config) error {
	o := c.o
	if o.InstallerStatus == "" {
		o.InstallerStatus = filepath.Join(filepath.Dir(o.CNISocket), report.FileName)
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %q: %w", c.logLevel, err)
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
	switch c.testHook {
	case "":
	case "pause-before-commit":
		o.Hooks.BeforeCommit = func(id string) {
			o.Log.Warn("test hook: pausing before commit until killed", "container", id)
			select {}
		}
	default:
		return fmt.Errorf("--test-hook: unknown hook %q", c.testHook)
	}
	o.Release = buildinfo.Get().Version
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := daemon.Run(ctx, o)
	o.Log.Info("stopped")
	return err
}
