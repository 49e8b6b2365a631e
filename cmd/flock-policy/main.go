// Command flock-policy enforces NetworkPolicy on its node: the second
// container of flock's DaemonSet (hostNetwork, NET_ADMIN), running the
// engine of sigs.k8s.io/kube-network-policies (k8s/netpol). It is a
// process of its own so that the agent stays small: the engine needs
// client-go's typed clientset and informers, which the agent does without
// (BENCHMARKS.md has both processes' memory).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol"
)

func main() {
	var cfg netpol.Config
	flag.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.IntVar(&cfg.QueueID, "nfqueue-id", 100, "the NFQUEUE number the decisions go through")
	flag.BoolVar(&cfg.FailOpen, "fail-open", false, "let connections pass while the engine is not running (default: drop them)")
	flag.BoolVar(&cfg.AdminNetworkPolicy, "admin-network-policy", false, "enforce AdminNetworkPolicy (its CRD must be installed)")
	flag.BoolVar(&cfg.BaselineAdminNetworkPolicy, "baseline-admin-network-policy", false, "enforce BaselineAdminNetworkPolicy (its CRD must be installed)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Its heap is the informers' caches, long-lived: collecting at half
	// again what is live (not twice) keeps the node's memory down for a
	// few more collections. GOGC, if set, stands.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	if err := run(cfg, *kubeconfig, log); err != nil {
		log.Error("flock-policy failed", "err", err)
		os.Exit(1)
	}
}

func run(cfg netpol.Config, kubeconfig string, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	rc, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return netpol.Run(ctx, rc, cfg, log)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (give --kubeconfig outside a pod): %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return rc, nil
}
