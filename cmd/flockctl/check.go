package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	"code.fritzlab.net/fritzlab/flock/deploy/release"
	"code.fritzlab.net/fritzlab/flock/k8s/check"
)

// errCheckFailed: a check ran and something failed (exit 1, after the
// table).
var errCheckFailed = errors.New("a check failed")

// checkCmd is `flockctl check`: it runs against the cluster of the
// kubeconfig (--kubeconfig, else $KUBECONFIG, else ~/.kube/config, else
// in-cluster), not a node's sockets.
func checkCmd(ctx context.Context, o *options, _ []string, out io.Writer) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.kubeconfig != "" {
		rules.ExplicitPath = o.kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("check: the cluster: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	image := o.image
	if image == "" {
		v := buildinfo.Get().Version
		if !release.IsRelease(v) && !strings.HasSuffix(v, "-dev") {
			return usagef(nil, "check: this flockctl has no release version (%q): name the probes' image with --image", v)
		}
		image = release.Image + ":" + v
	}
	// Ctrl-C ends the checks; what they made is still removed.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	progress := func(s string) { fmt.Fprintln(os.Stderr, "flockctl check:", s) }
	results, err := check.Run(ctx, check.Options{Client: client, Dynamic: dyn, Image: image, Timeout: o.checkTimeout, Progress: progress})
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if err := emit(out, o.format, results, func(w *tabwriter.Writer) { checkTable(w, results, o.wide()) }); err != nil {
		return err
	}
	if check.Failed(results) {
		return errCheckFailed
	}
	return nil
}

func checkTable(w *tabwriter.Writer, rs []check.Result, wide bool) {
	fmt.Fprintln(w, "CHECK\tRESULT\tDETAIL")
	for _, r := range rs {
		detail := r.Detail
		if r.Result != check.Fail && !wide {
			detail = ""
		}
		if r.Why != "" {
			detail = strings.TrimSpace(detail + "; why: " + r.Why)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", r.Check, r.Result, dash(detail))
	}
}

// probeMain is `flockctl check-probe`, what the check's pods run (not a
// command for people: it is not in the help).
func probeMain(args []string, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "flockctl: check-probe: want serve or connect")
		return exitUsage
	}
	fs := flag.NewFlagSet("flockctl check-probe "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	p := fs.Int("port", 8080, "serve: the port")
	want := fs.String("want", string(check.Answered), "connect: the verdict wanted: answered or blocked")
	timeout := fs.Duration("timeout", 2*time.Second, "connect: each attempt's timeout")
	within := fs.Duration("within", 30*time.Second, "connect: how long the wanted verdict may take")
	report := fs.String("report", "/dev/termination-log", "connect: where the outcomes go (JSON)")
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "serve":
		if err := check.Serve(ctx, *p); err != nil {
			fmt.Fprintln(stderr, err)
			return exitFail
		}
		return exitOK
	case "connect":
		if *want != string(check.Answered) && *want != string(check.Blocked) {
			fmt.Fprintf(stderr, "flockctl: check-probe connect: --want %q: want answered or blocked\n", *want)
			return exitUsage
		}
		out := check.Connect(ctx, fs.Args(), check.Verdict(*want), *timeout, *within)
		if err := check.WriteOutcomes(*report, out); err != nil {
			fmt.Fprintln(stderr, err)
			return exitFail
		}
		return exitOK
	}
	fmt.Fprintf(stderr, "flockctl: check-probe: %q: want serve or connect\n", args[0])
	return exitUsage
}
