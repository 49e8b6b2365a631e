package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// apiLab is the e2e lab's Kubernetes API alone (etcd and kube-apiserver,
// no node, no runtime: k8slab's APIOnly), with flock's CRDs applied and
// the default namespace's ServiceAccount made (no controller-manager makes
// it). The sections that need an API (the claim figures, NetworkPolicy)
// share one; Close tears it down with everything stored in it.
type apiLab struct {
	c    *k8slab.Cluster
	cs   kubernetes.Interface
	root string // the module root
}

func upAPILab(ctx context.Context, dir string) (*apiLab, error) {
	root, err := lab.RepoRoot()
	if err != nil {
		return nil, err
	}
	c, err := k8slab.Up(ctx, k8slab.Options{Dir: filepath.Join(dir, "k8s"), APIOnly: true, Log: logf})
	if err != nil {
		return nil, err
	}
	a := &apiLab{c: c, root: root}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	if err := a.kubectl(ctx, "", "apply", "-f", filepath.Join(root, "deploy", "crd")); err != nil {
		return nil, err
	}
	if err := a.kubectl(ctx, "", "-n", "default", "create", "serviceaccount", "default"); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	// The setup writes a thousand objects or more: client-go's default
	// limit (5 requests/s) would make that minutes.
	cfg.QPS, cfg.Burst = 1000, 2000
	if a.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	ok = true
	return a, nil
}

// Close stops the apiserver and etcd; their data goes with the lab dir.
func (a *apiLab) Close() {
	if err := a.c.Down(); err != nil {
		logf("k8slab down: %v", err)
	}
}

// kubeconfig is the admin kubeconfig.
func (a *apiLab) kubeconfig() string { return a.c.Kubeconfig }

// addr is where the apiserver listens (loopback of this namespace): a
// process in a node namespace reaches it through lab.NS.Proxy under the
// same address, so the kubeconfig and the certificate still match.
func (a *apiLab) addr() string { return "127.0.0.1:" + strconv.Itoa(k8slab.APIServerPort) }

// kubectl runs kubectl as admin (stdin, if any, fed to it), trying again
// for up to 30 s: a just-created CRD takes a moment to be served.
func (a *apiLab) kubectl(ctx context.Context, stdin string, args ...string) error {
	var out string
	var err error
	for range 30 {
		if stdin == "" {
			out, err = a.c.Kubectl(ctx, args...)
		} else {
			out, err = a.c.KubectlStdin(ctx, stdin, args...)
		}
		if err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("kubectl %v: %w\n%s", args, err, out)
}

// nodeLab is a one-node BGP lab whose agent runs in Kubernetes mode
// against this API: before the agent starts, objects(node) is applied
// (its NodeConfig, AddressPools) and the node's namespace gets a proxy to
// the API. close stops the lab, then the proxy.
func (a *apiLab) nodeLab(ctx context.Context, prefix, dir, binDir string, objects func(n *lab.LabNode) string) (l *lab.BGPLab, close func(), err error) {
	api := a.addr()
	var stopProxy func()
	l, err = lab.NewBGPLab(lab.LabOptions{Prefix: prefix, Dir: dir, BinDir: binDir, Nodes: 1,
		Kubeconfig: a.kubeconfig(), AgentArgs: []string{"--metrics-address=", "--log-level=info"},
		Setup: func(n *lab.LabNode) error {
			if err := a.kubectl(ctx, objects(n), "apply", "-f", "-"); err != nil {
				return err
			}
			var err error
			stopProxy, err = n.NS.Proxy(api, api)
			return err
		}})
	stop := func() {
		if stopProxy != nil {
			stopProxy()
		}
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return l, func() { l.Close(); stop() }, nil
}
