// Command flock-installer installs the flock CNI plugin and its network
// config on the host (the DaemonSet's init container).
//
// It exits 0 when the install is refused (no cniVersion that flock and
// every chained plugin support): the agent must still start to report the
// refusal, which it reads from --status-file.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	"code.fritzlab.net/fritzlab/flock/cni/install"
	"code.fritzlab.net/fritzlab/flock/cni/install/report"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func main() {
	c, code, exit := parseFlags(os.Args[1:], os.Stdout, os.Stderr)
	if exit {
		os.Exit(code)
	}
	o := c.o
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "flock-installer")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	if o.Runtime == "" && c.nodeName != "" {
		rt, err := nodeRuntime(ctx, c.nodeName)
		if err != nil {
			// Not knowing the runtime could write a version it cannot
			// run (every ADD failing): retry rather than guess.
			log.Error("the node's container runtime", "node", c.nodeName, "err", err)
			os.Exit(1)
		}
		o.Runtime = rt
		log.Info("container runtime", "node", c.nodeName, "runtime", rt)
	}
	res, err := install.Install(ctx, o)
	stop()
	for _, p := range res.Report.Plugins {
		if p.Error != "" {
			log.Warn("chained plugin unusable", "type", p.Type, "path", p.Path, "err", p.Error)
		} else {
			log.Info("chained plugin", "type", p.Type, "path", p.Path, "versions", p.Versions)
		}
	}
	if c.statusFile != "" {
		// Without it the agent would read a stale outcome or none: retry.
		if werr := report.Write(c.statusFile, res.Report); werr != nil {
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

// config is the command line.
type config struct {
	o          install.Options
	statusFile string
	nodeName   string
}

// parseFlags reads the command line. exit says the process is done, with
// code: --help and --version (0, on stdout), a usage error (2, named on
// stderr).
func parseFlags(args []string, stdout, stderr io.Writer) (c config, code int, exit bool) {
	o := &c.o
	fs := flag.NewFlagSet("flock-installer", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, --help is printed below
	fs.StringVar(&o.PluginSrc, "plugin", "/opt/flock/bin/flock", "plugin binary to install")
	fs.StringVar(&o.CNIBinDir, "cni-bin-dir", "/host/opt/cni/bin", "host CNI plugin directory")
	fs.StringVar(&o.CNIConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "host CNI config directory")
	fs.StringVar(&o.Socket, "socket", wire.DefaultSocket, "agent CNI socket path, as seen by the plugin on the host")
	fs.BoolVar(&o.Portmap, "portmap", false, "chain the portmap plugin (hostPort support)")
	fs.BoolVar(&o.Bandwidth, "bandwidth", false, "chain the bandwidth plugin")
	fs.StringVar(&o.CNIVersion, "cni-version", "", "cniVersion of the conflist (default: the highest that flock and every chained plugin answer to VERSION); one they do not all support is refused")
	fs.StringVar(&o.HostRoot, "host-root", "", "where the host's / is mounted (--cni-bin-dir under it): chained plugins are asked VERSION chrooted there, as the runtime runs them; empty runs them in place")
	fs.StringVar(&c.statusFile, "status-file", report.DefaultPath, "where the outcome goes for the agent (JSON); empty writes none")
	fs.StringVar(&o.StageDir, "stage-dir", "", "write the conflist here instead of --cni-conf-dir: the agent (its --cni-conf-dir) publishes it once it serves, so the runtime never calls a plugin whose agent cannot answer; empty writes it in place")
	fs.StringVar(&o.Runtime, "runtime", "", "the node's container runtime as NAME://VERSION (its libcni bounds the cniVersion: containerd 1.x runs up to 1.0.0); default: the node's status.nodeInfo.containerRuntimeVersion, read from the API with --node-name")
	fs.StringVar(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node, whose container runtime is read from the API (in-cluster); empty: none")
	version := fs.Bool("version", false, "print the version and exit")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, `usage: flock-installer [flags]

Installs the flock CNI plugin and its network config on the host (the
DaemonSet's init container). A refused install (no cniVersion that flock and
every chained plugin support) exits 0: the agent reports it from --status-file.

flags:
`)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return c, 0, true
	case err != nil:
		fmt.Fprintf(stderr, "flock-installer: %v\nRun 'flock-installer --help' for usage.\n", err)
		return c, 2, true
	case *version:
		fmt.Fprintln(stdout, buildinfo.Line("flock-installer"))
		return c, 0, true
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "flock-installer: unexpected argument %q (it takes flags only)\nRun 'flock-installer --help' for usage.\n", fs.Arg(0))
		return c, 2, true
	}
	return c, 0, false
}

// nodeRuntime reads the node's container runtime from the API, in-cluster,
// with the pod's service account: one GET, so the installer links no
// Kubernetes client.
func nodeRuntime(ctx context.Context, node string) (string, error) {
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return "", errors.New("not in a cluster: KUBERNETES_SERVICE_HOST and _PORT are not set (set --runtime)")
	}
	token, err := os.ReadFile(sa + "token")
	if err != nil {
		return "", fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(sa + "ca.crt")
	if err != nil {
		return "", fmt.Errorf("service account CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return "", errors.New("service account CA: no certificate in ca.crt")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u := "https://" + net.JoinHostPort(host, port) + "/api/v1/nodes/" + url.PathEscape(node)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "flock-installer/"+node)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("node %s: %w", node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("node %s: %s: %s", node, resp.Status, strings.TrimSpace(string(b)))
	}
	var n struct {
		Status struct {
			NodeInfo struct {
				ContainerRuntimeVersion string `json:"containerRuntimeVersion"`
			} `json:"nodeInfo"`
		} `json:"status"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&n); err != nil {
		return "", fmt.Errorf("node %s: %w", node, err)
	}
	if n.Status.NodeInfo.ContainerRuntimeVersion == "" {
		return "", fmt.Errorf("node %s: status.nodeInfo.containerRuntimeVersion is empty", node)
	}
	return n.Status.NodeInfo.ContainerRuntimeVersion, nil
}
