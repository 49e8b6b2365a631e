// Command flock-relay serves every node's flock-policy the cluster's pods,
// trimmed to what it reads, from one watch of the API server (k8s/relay):
// with it, a pod change costs the API server one watcher per relay, not
// one per node, and each node only what flock-policy reads of it. It runs
// as a Deployment (deploy/relay); nodes find the relays in the ConfigMap
// flock-relay and fall back to the API server when none answers.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	"code.fritzlab.net/fritzlab/flock/cmd/internal/kubeconfig"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
	"code.fritzlab.net/fritzlab/flock/k8s/relay"
)

// serverName is the name in every relay's certificate: nodes trust the
// certificate the directory gives for the relay, not a name.
const serverName = "flock-relay"

type config struct {
	kubeconfig string
	listen     string
	metrics    string
	namespace  string
	name       string // the directory key: the pod's name
	advertise  string // the URL nodes are given
	history    int
}

func main() {
	c, code, exit := parseFlags(os.Args[1:], os.Stdout, os.Stderr)
	if exit {
		os.Exit(code)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Its heap is the pods, long-lived: collecting at half again what is
	// live (not twice) keeps its memory down (flock-policy's collects at
	// a quarter again). GOGC, if set, stands.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	if err := run(c, log); err != nil {
		log.Error("flock-relay failed", "err", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stdout, stderr io.Writer) (c config, code int, exit bool) {
	fs := flag.NewFlagSet("flock-relay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fs.StringVar(&c.listen, "listen", ":9479", "address nodes connect to (HTTPS)")
	fs.StringVar(&c.metrics, "metrics-address", ":9480", "address for /metrics, /healthz and /readyz; empty disables")
	fs.StringVar(&c.namespace, "namespace", kubeconfig.EnvOr("POD_NAMESPACE", "flock-system"), "flock's namespace: where the ConfigMap "+relay.ConfigMapName+" lists the relays (default $POD_NAMESPACE)")
	fs.StringVar(&c.name, "name", os.Getenv("POD_NAME"), "this relay's key in the ConfigMap (default $POD_NAME)")
	fs.StringVar(&c.advertise, "advertise", "", "the URL nodes reach this relay at (default https://$POD_IP and the port of --listen)")
	fs.IntVar(&c.history, "history", relay.DefaultHistory, "changes kept for nodes that resume a watch")
	version := fs.Bool("version", false, "print the version and exit")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, "usage: flock-relay [flags]\n\nServes nodes' flock-policy the cluster's pods, trimmed, from one watch of the API server.\n\nflags:\n")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return c, 0, true
	case err != nil:
		fmt.Fprintf(stderr, "flock-relay: %v\nRun 'flock-relay --help' for usage.\n", err)
		return c, 2, true
	case *version:
		fmt.Fprintln(stdout, buildinfo.Line("flock-relay"))
		return c, 0, true
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "flock-relay: unexpected argument %q (it takes flags only)\n", fs.Arg(0))
		return c, 2, true
	}
	if err := c.complete(os.Getenv("POD_IP")); err != nil {
		fmt.Fprintf(stderr, "flock-relay: %v\n", err)
		return c, 2, true
	}
	return c, 0, false
}

// complete fills the advertised URL and checks what nodes are given.
func (c *config) complete(podIP string) error {
	if c.name == "" {
		return errors.New("--name is empty (and $POD_NAME unset): the relay's key in the directory")
	}
	if c.history <= 0 {
		return fmt.Errorf("--history %d: want a positive number of changes", c.history)
	}
	_, port, err := net.SplitHostPort(c.listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", c.listen, err)
	}
	if c.advertise == "" {
		ip := net.ParseIP(podIP)
		if ip == nil {
			return fmt.Errorf("--advertise is empty and $POD_IP %q is not an IP", podIP)
		}
		c.advertise = "https://" + net.JoinHostPort(ip.String(), port)
	}
	return nil
}

func run(c config, log *slog.Logger) error {
	rc, err := kubeconfig.Rest(c.kubeconfig)
	if err != nil {
		return err
	}
	pc := rest.CopyConfig(rc)
	pc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	pc.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(pc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	auth, err := relay.NewReviewAuthorizer(pc)
	if err != nil {
		return err
	}
	cert, certPEM, err := selfSigned()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.listen, err)
	}
	var metricsL net.Listener
	if c.metrics != "" {
		if metricsL, err = net.Listen("tcp", c.metrics); err != nil {
			ln.Close()
			return fmt.Errorf("metrics on %s: %w", c.metrics, err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	pods := relay.NewCache(c.history)
	upstream := pods.Upstream(cs.CoreV1().Pods(""))
	upstream.Log = log
	inf := kubeclient.NewInformer(upstream, &corev1.Pod{}, nil)
	if err := inf.SetTransform(trim.Transform); err != nil {
		return err
	}
	reg, err := inf.AddEventHandler(pods.Handler())
	if err != nil {
		return err
	}
	srv := &relay.Server{Cache: pods, Log: log, Metrics: relay.NewMetrics(prometheus.DefaultRegisterer), Auth: auth}
	hs := &http.Server{Handler: srv, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}, ReadHeaderTimeout: 10 * time.Second}
	cms := cs.CoreV1().ConfigMaps(c.namespace)

	// published: the relay is in the directory, where nodes find it.
	var published atomic.Bool
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { inf.RunWithContext(ctx); return nil })
	g.Go(func() error {
		err := hs.ServeTLS(ln, "", "")
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serve: %w", err)
	})
	if metricsL != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.Handler())
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if err := ready(pods, published.Load()); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		})
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error { <-ctx.Done(); return ms.Close() })
		g.Go(func() error {
			if err := ms.Serve(metricsL); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	g.Go(func() error {
		start := time.Now()
		if !kubeclient.WaitLogged(ctx, log, "the API server's pods", kubeclient.SyncWarnAfter,
			// The list's resource version is recorded as the list's last
			// bookmark passes: after the informer may say it synced.
			kubeclient.Synced{Name: "pods", Synced: func() bool { return inf.HasSynced() && reg.HasSynced() && upstream.ListRV() != "" }}) {
			return nil
		}
		if err := pods.Live(upstream.ListRV()); err != nil {
			return err
		}
		if err := pods.Ready(); err != nil {
			return err // it listed again before it was live: start over
		}
		// The first list is a burst the size of the cluster's pods: its
		// garbage stayed resident (3.6 GB an idle minute later at 5,000
		// nodes, 805 MB once churn made the collector run). Once, not
		// memtrim's watch: under churn the relay collects rarely (GOGC
		// 50 of a large cache), and memtrim would force it every 5 s.
		debug.FreeOSMemory()
		log.Info("serving pods", "pods", pods.Len(), "synced", time.Since(start).Round(time.Millisecond), "listen", c.listen, "advertise", c.advertise)
		if err := relay.Publish(ctx, cms, c.name, relay.Entry{URL: c.advertise, Certificate: certPEM, ServerName: serverName}); err != nil {
			return err
		}
		published.Store(true)
		prune(ctx, cms, c, pods, log)
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-pods.Failed():
				return pods.Err() // started again, the relay lists afresh
			case <-t.C:
				prune(ctx, cms, c, pods, log)
			}
		}
	})
	g.Go(func() error {
		<-ctx.Done()
		// Nodes are sent elsewhere first: no new ones, the watches end,
		// then the server stops.
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := relay.Withdraw(wctx, cms, c.name); err != nil {
			log.Warn("leaving the directory", "err", err)
		}
		srv.Stop()
		return hs.Shutdown(wctx)
	})
	return g.Wait()
}

// ready: live, and in the directory. A relay live but not yet published
// (handing its first list's heap back took 0.3 s at 1,700 nodes) was
// ready while nodes could not find it: a flock-policy started then read
// its 51,000 pods whole from the API server (1.1 GB of heap, 9 s).
func ready(pods *relay.Cache, published bool) error {
	if err := pods.Ready(); err != nil {
		return err
	}
	if !published {
		return errNotPublished
	}
	return nil
}

var errNotPublished = errors.New("not yet in the directory (ConfigMap " + relay.ConfigMapName + "): nodes cannot find this relay")

// prune withdraws the entries of relays whose pods are gone (killed
// before they could withdraw): nodes would try them first in vain.
func prune(ctx context.Context, cms corev1client.ConfigMapInterface, c config, pods *relay.Cache, log *slog.Logger) {
	entries, _, err := relay.Lookup(ctx, cms)
	if err != nil {
		log.Warn("reading the directory", "err", err)
		return
	}
	var gone []string
	for name := range entries {
		if name != c.name && !pods.Has(c.namespace, name) {
			gone = append(gone, name)
		}
	}
	if err := relay.Withdraw(ctx, cms, gone...); err != nil {
		log.Warn("pruning the directory", "err", err)
	} else if len(gone) > 0 {
		log.Info("relays gone, withdrawn from the directory", "relays", gone)
	}
}

// selfSigned is a key and certificate for this run: nodes are given the
// certificate through the directory and trust it alone.
func selfSigned() (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: serverName},
		DNSNames:              []string{serverName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0), // the key lives as long as the process
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // its own root: nodes trust it alone
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}
