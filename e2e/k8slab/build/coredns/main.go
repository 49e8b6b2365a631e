// Command coredns is CoreDNS with only the plugins the lab's Corefile uses,
// so that it builds in a fraction of the time of the full set (the full
// build links every cloud provider's SDK). It serves the cluster's DNS
// (the kube-dns Service) as kubeadm's CoreDNS does, minus forwarding: the
// lab resolves nothing outside the cluster.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order plugins handle a query in: plugin.cfg's, restricted to
	// the plugins linked above.
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }
