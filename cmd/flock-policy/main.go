// Command flock-policy is the second container of flock's DaemonSet
// (hostNetwork, NET_ADMIN): it enforces NetworkPolicy on its node with the
// engine of sigs.k8s.io/kube-network-policies (k8s/netpol), and is a
// candidate for the Lease whose holder assigns LoadBalancer addresses
// cluster-wide (k8s/lbcontroller). Both need client-go's typed clientset,
// which the agent does without: a process of its own keeps the agent small
// (BENCHMARKS.md has both processes' memory).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/memtrim"
	"code.fritzlab.net/fritzlab/flock/agent/policyips"
	"code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	"code.fritzlab.net/fritzlab/flock/cmd/internal/kubeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/lbcontroller"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/policyapi"
	"code.fritzlab.net/fritzlab/flock/k8s/relay"
	"code.fritzlab.net/fritzlab/flock/k8s/uninstall"
)

// defaultMetricsAddress is next to the agent's (127.0.0.1:9476): both
// containers share the host's network.
const defaultMetricsAddress = "127.0.0.1:9477"

// defaultRelayToken is where the DaemonSet projects the node's token for
// the relays.
const defaultRelayToken = "/var/run/secrets/flock-relay/token"

// endpoints are where flock-policy answers besides the queue.
type endpoints struct {
	metrics string // /metrics, /healthz, /readyz; "" disables
	admin   string // the admin API's unix socket; "" disables
	agent   string // this node's agent's admin socket; "" for none
	// bindings is the file keeping the agent's last answer ("" for none).
	bindings string
	// relayToken is the node's token for the relays ("": pods from the
	// API server only).
	relayToken string
}

// lbConfig is the LoadBalancer assigner's part of the command line.
type lbConfig struct {
	on        bool
	namespace string // the Lease's
}

func main() {
	c, code, exit := parseFlags(os.Args[1:], os.Stdout, os.Stderr)
	if exit {
		os.Exit(code)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Its heap is the informers' caches, long-lived: collecting at a
	// quarter again what is live (not twice) keeps the node's memory
	// down for a few more collections (the runtime keeps freed pages up
	// to the next collection's goal). GOGC, if set, stands.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(25)
	}
	if err := run(c.cfg, c.kubeconfig, c.ep, c.lb, log); err != nil {
		log.Error("flock-policy failed", "err", err)
		os.Exit(1)
	}
}

// procs is how many threads run flock-policy's Go code at once once its
// first verdicts are loaded: one, unless GOMAXPROCS (env) says otherwise
// (cur: what the runtime chose). Its work then is a pipeline (decode an
// event, hand it to the handlers, patch or compile, judge a queued
// packet), each stage one goroutine and the compile single-threaded.
// With a thread for each core, every hand-off between stages woke an
// idle thread, which then spun looking for work before it slept: under
// 500 nodes' churn flock-policy took about a sixth more CPU for each pod
// event than on one (make scale). The first lists and compile run on
// every core: a burst the size of the cluster, which the collector's
// marking on the other cores shortens.
func procs(env string, cur int) int {
	if env != "" {
		return cur // the runtime read it
	}
	return 1
}

// config is the command line.
type config struct {
	cfg        netpol.Config
	kubeconfig string
	ep         endpoints
	lb         lbConfig
}

// parseFlags reads the command line. exit says the process is done, with
// code: --help and --version (0, on stdout), a usage error (2, named on
// stderr).
func parseFlags(args []string, stdout, stderr io.Writer) (c config, code int, exit bool) {
	cfg, ep := &c.cfg, &c.ep
	fs := flag.NewFlagSet("flock-policy", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, --help is printed below
	fs.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.IntVar(&cfg.QueueID, "nfqueue-id", 100, "the NFQUEUE number the decisions go through")
	fs.BoolVar(&cfg.FailOpen, "fail-open", false, "let connections pass while the engine is not running (default: drop them)")
	fs.BoolVar(&cfg.AdminNetworkPolicy, "admin-network-policy", false, "enforce AdminNetworkPolicy (its CRD must be installed)")
	fs.BoolVar(&cfg.BaselineAdminNetworkPolicy, "baseline-admin-network-policy", false, "enforce BaselineAdminNetworkPolicy (its CRD must be installed)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fs.StringVar(&ep.metrics, "metrics-address", defaultMetricsAddress, "address for /metrics, /healthz and /readyz; empty disables")
	fs.StringVar(&ep.admin, "admin-socket", policyapi.DefaultSocket, "unix socket of the admin API (flockctl policy); empty disables")
	fs.StringVar(&ep.bindings, "agent-bindings-file", policyips.DefaultBindingsFile, "where the agent's last answer is kept, so that a restart of flock-policy while the agent does not answer keeps its pods' anycast and `addresses` IPs under policy; empty: not kept")
	fs.StringVar(&ep.agent, "agent-socket", admin.DefaultSocket, "the node agent's admin socket: what it bound for this node's pods (anycast, addresses); empty: judge them by their claims and AddressPools only")
	fs.StringVar(&ep.relayToken, "relay-token-file", defaultRelayToken, "this node's token for the pod relays (audience "+relay.Audience+"): pods are read from the relays the ConfigMap "+relay.ConfigMapName+" in --namespace lists, else from the API server; empty: from the API server only")
	fs.BoolVar(&c.lb.on, "loadbalancers", true, "be a candidate for the Lease flock-loadbalancers, whose holder assigns LoadBalancer addresses from AddressPools of use loadBalancer")
	fs.StringVar(&c.lb.namespace, "namespace", kubeconfig.EnvOr("POD_NAMESPACE", "flock-system"), "flock's namespace: where the Lease is (default $POD_NAMESPACE, else flock-system)")
	version := fs.Bool("version", false, "print the version and exit")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, `usage: flock-policy [flags]

Enforces NetworkPolicy on its node (the second container of flock's
DaemonSet), with the engine of sigs.k8s.io/kube-network-policies, and
assigns LoadBalancer addresses while it holds the Lease flock-loadbalancers
(one process of the cluster at a time).

flags:
`)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return c, 0, true
	case err != nil:
		fmt.Fprintf(stderr, "flock-policy: %v\nRun 'flock-policy --help' for usage.\n", err)
		return c, 2, true
	case *version:
		fmt.Fprintln(stdout, buildinfo.Line("flock-policy"))
		return c, 0, true
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "flock-policy: unexpected argument %q (it takes flags only)\nRun 'flock-policy --help' for usage.\n", fs.Arg(0))
		return c, 2, true
	}
	return c, 0, false
}

func run(cfg netpol.Config, kubeconfigPath string, ep endpoints, lbc lbConfig, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	rc, err := kubeconfig.Rest(kubeconfigPath)
	if err != nil {
		return err
	}
	// Both listeners are bound before the engine starts, so that a taken
	// port or socket fails the start, not later.
	var metricsL, adminL net.Listener
	if ep.metrics != "" {
		if metricsL, err = net.Listen("tcp", ep.metrics); err != nil {
			return fmt.Errorf("metrics on %s: %w", ep.metrics, err)
		}
	}
	if ep.admin != "" {
		if adminL, err = admin.Listen(ep.admin); err != nil {
			if metricsL != nil {
				metricsL.Close()
			}
			return err
		}
		cfg.View = &netpol.View{}
	}
	// Readiness includes the kernel's verdicts being current.
	cfg.Verdicts = &netpol.Verdicts{}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	var lb *lbcontroller.Controller
	if lbc.on {
		if lb, err = lbcontroller.New(rc, lbcontroller.Config{Node: cfg.NodeName, Namespace: lbc.namespace, Log: log.With("component", "loadbalancers")}); err != nil {
			return err
		}
		if err := prometheus.Register(lb.Collector()); err != nil {
			return fmt.Errorf("loadbalancer metrics: %w", err)
		}
	}
	// A pod's anycast and `addresses` IPs obey its policies too.
	tracker := policyips.NewTracker(cfg.NodeName, dyn, ep.agent, log)
	if ep.agent != "" {
		tracker.BindingsFile = ep.bindings
	}
	cfg.ExtraIPs = tracker
	if src, err := podSource(rc, ep.relayToken, lbc.namespace, cfg.NodeName, log); err != nil {
		return err
	} else if src != nil { // a nil *PodSource is not a nil ListerWatcher
		cfg.Pods = src
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Its namespace followed from the start: at the stop, a refusal (403,
	// 401) means uninstall only if it was seen being deleted.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	seen := uninstall.WatchNamespace(watchCtx, dyn, os.Getenv("POD_NAMESPACE"))
	defer removeOnUninstall(dyn, log, tracker.BindingsFile, seen)
	g, ctx := errgroup.WithContext(ctx)
	if metricsL != nil {
		g.Go(func() error {
			return admin.ServeHTTP(ctx, metricsL, metricsHandler(loggedReady(func() error {
				if err := netpol.Ready(cfg.QueueID); err != nil {
					return err
				}
				return cfg.Verdicts.Err()
			}, log)))
		})
	}
	if adminL != nil {
		g.Go(func() error { return admin.ServeHTTP(ctx, adminL, adminHandler(cfg.View.Handler())) })
	}
	log.Info("serving", "metrics", ep.metrics, "admin-socket", ep.admin)
	if lb != nil {
		g.Go(func() error { return lb.Run(ctx) })
	}
	// A load's garbage (a compile of the cluster's pods) is handed back
	// once loads pause, not over minutes.
	g.Go(func() error { return memtrim.Run(ctx, memtrim.Every, log) })
	g.Go(func() error {
		if cfg.Verdicts.WaitLoaded(ctx) {
			n := procs(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0))
			runtime.GOMAXPROCS(n)
			log.Info("first verdicts loaded: Go code on GOMAXPROCS threads from now on", "GOMAXPROCS", n)
		}
		return nil
	})
	g.Go(func() error {
		// The engine ending (an error, or ctx) ends the servers too.
		defer stop()
		return netpol.Run(ctx, rc, cfg, log)
	})
	return g.Wait()
}

// adminHandler serves the admin socket: the policy view (flockctl
// policy) and Go's profiles.
func adminHandler(view http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", view)
	admin.HandleProfiles(mux)
	return mux
}

// metricsHandler serves the default Prometheus registry (the engine
// registers its kube_network_policies_* series there), /healthz (the
// process answers) and /readyz (ready says why not, or nil: enforcing).
func metricsHandler(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// loggedReady logs each change of ready's answer, as the probes ask it:
// the kubelet shows only a 503, the log says why (and since when).
func loggedReady(ready func() error, log *slog.Logger) func() error {
	var mu sync.Mutex
	last := "never asked"
	return func() error {
		// Asked under the lock: two askers log in the order of the
		// answers.
		mu.Lock()
		defer mu.Unlock()
		err := ready()
		now := "ready"
		if err != nil {
			now = err.Error()
		}
		if now != last {
			if err != nil {
				log.Warn("not ready", "why", now)
			} else {
				log.Info("ready: NetworkPolicy is enforced on this node")
			}
			last = now
		}
		return err
	}
}

// podSource is the relays (falling back to the API server), or nil (the
// API server) without a token for them.
func podSource(rc *rest.Config, tokenFile, namespace, node string, log *slog.Logger) (*relay.PodSource, error) {
	if tokenFile == "" {
		return nil, nil
	}
	if _, err := os.Stat(tokenFile); err != nil {
		log.Info("pods from the API server: no token for the relays", "err", err)
		return nil, nil
	}
	pc := rest.CopyConfig(rc)
	pc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	pc.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(pc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &relay.PodSource{API: cs.CoreV1().Pods(""), Directory: cs.CoreV1().ConfigMaps(namespace), Node: node, TokenFile: tokenFile,
		Log: log.With("component", "pods")}, nil
}

// removeOnUninstall removes the engine's rules when flock is leaving the
// node (uninstalling); any other stop leaves them (fail closed across
// restarts). It needs POD_NAME and POD_NAMESPACE (the downward API).
func removeOnUninstall(client dynamic.Interface, log *slog.Logger, bindings string, seen uninstall.Namespace) {
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || name == "" {
		log.Info("the rules stay: POD_NAMESPACE or POD_NAME unset, uninstall cannot be told", "table", netpol.Table)
		return
	}
	gone, why := uninstall.Uninstalling(context.Background(), client, ns, name, seen)
	if !gone {
		log.Info("the rules stay for the next engine", "table", netpol.Table, "why", why)
		return
	}
	if bindings != "" {
		if err := os.Remove(bindings); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Error("uninstall: removing the agent's bindings file failed", "file", bindings, "err", err)
		}
	}
	if err := netpol.DeleteTable(); err != nil {
		log.Error("uninstall: removing the rules failed", "why", why, "err", err)
		return
	}
	log.Info("uninstall: rules removed", "table", netpol.Table, "why", why)
}
