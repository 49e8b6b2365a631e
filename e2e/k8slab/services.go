package k8slab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The lab's Service ranges are documentation/benchmark space, routed into
// LabLink and so discarded on the host: a ClusterIP packet nobody
// translated never leaves the machine. With Options.Services the ranges
// are dual-stack in the node's family order; without it the lab keeps one
// IPv4 range and stands in for kube-proxy with a DNAT of the kubernetes
// Service only.
const (
	ServiceCIDR4        = "198.18.0.0/16"
	ServiceCIDR6        = "fd00:10:96::/112"
	KubernetesServiceIP = "198.18.0.1" // without Services
	ClusterDomain       = "cluster.local"
	// LabLink is the lab's sink interface, a bridge without ports (this
	// kernel has no dummy driver): what is routed into it is dropped. The
	// Service ranges are routed into it and, with Services, the node's
	// addresses live on it.
	LabLink = "k8slab0"
)

// Ports of the Services components, all on loopback.
const (
	kubeProxyMetricsPort = 10249
	kubeProxyHealthzPort = 10256
	corednsReadyPort     = 8181
)

// nodeIPs are Options.NodeIP, primary first.
func (o *Options) nodeIPs() []netip.Addr {
	var ips []netip.Addr
	for _, f := range strings.Split(o.NodeIP, ",") {
		if a, err := netip.ParseAddr(strings.TrimSpace(f)); err == nil {
			ips = append(ips, a)
		}
	}
	return ips
}

// ServiceCIDRs are the Service ranges the apiserver allocates from, the
// primary family first.
func (c *Cluster) ServiceCIDRs() []string {
	if len(c.Opts.ServiceCIDRs) > 0 {
		return c.Opts.ServiceCIDRs
	}
	if !c.Opts.Services {
		return []string{ServiceCIDR4}
	}
	var out []string
	for _, ip := range c.Opts.nodeIPs() {
		if ip.Is4() {
			out = append(out, ServiceCIDR4)
		} else {
			out = append(out, ServiceCIDR6)
		}
	}
	return out
}

// serviceIP is the n-th address of the primary Service range.
func (c *Cluster) serviceIP(n int) netip.Addr {
	a := netip.MustParsePrefix(c.ServiceCIDRs()[0]).Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// APIServiceIP is the kubernetes Service's ClusterIP.
func (c *Cluster) APIServiceIP() netip.Addr { return c.serviceIP(1) }

// DNSServiceIP is the kube-dns Service's ClusterIP (kubelet's clusterDNS).
func (c *Cluster) DNSServiceIP() netip.Addr { return c.serviceIP(10) }

// apiServerHost is where the apiserver listens and what kubeconfigs name:
// loopback, or with Services the node's primary address, which the
// kubernetes Service's endpoints then point at (lease reconciler).
func (c *Cluster) apiServerHost() string {
	if c.Opts.Services {
		return c.Opts.nodeIPs()[0].String()
	}
	return "127.0.0.1"
}

// setupLabLink creates LabLink with the Service ranges routed into it
// (both families, whatever the cluster uses) and, with Services, the
// node's addresses on it. A link of that name left by an earlier lab is
// replaced.
func (c *Cluster) setupLabLink() error {
	if l, err := netlink.LinkByName(LabLink); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("remove stale %s: %w", LabLink, err)
		}
	}
	c.mu.Lock()
	c.st.LabLink = true
	c.mu.Unlock()
	if err := c.saveState(); err != nil {
		return err
	}
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: LabLink}}); err != nil {
		return fmt.Errorf("create %s: %w", LabLink, err)
	}
	l, err := netlink.LinkByName(LabLink)
	if err != nil {
		return fmt.Errorf("find %s: %w", LabLink, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", LabLink, err)
	}
	if c.Opts.Services {
		for _, ip := range c.Opts.nodeIPs() {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}, Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrAdd(l, a); err != nil {
				return fmt.Errorf("add node address %s to %s: %w", ip, LabLink, err)
			}
		}
	}
	for _, cidr := range []string{ServiceCIDR4, ServiceCIDR6} {
		_, dst, _ := net.ParseCIDR(cidr)
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst}); err != nil {
			return fmt.Errorf("route Service range %s into %s: %w", cidr, LabLink, err)
		}
	}
	return nil
}

// removeLabLink deletes LabLink, its addresses and routes with it.
func removeLabLink() error {
	l, err := netlink.LinkByName(LabLink)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", LabLink, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", LabLink, err)
	}
	return nil
}

// clusterCIDR is kube-proxy's --cluster-cidr: the pod ranges, primary
// family first; traffic to a Service from outside them is masqueraded.
func (c *Cluster) clusterCIDR() string { return strings.Join(c.Opts.PodCIDRs, ",") }

// startKubeProxy runs kube-proxy in nftables mode, NodePorts on the node's
// primary addresses only (never on the machine's own uplink).
func (c *Cluster) startKubeProxy(ctx context.Context) error {
	if _, err := c.startProc(KubeProxy, filepath.Join(c.BinDir, KubeProxy), c.kubeProxyArgs(c.Kubeconfig, c.Opts.NodeName)...); err != nil {
		return err
	}
	return c.waitHTTPOK(ctx, KubeProxy, "http://127.0.0.1:"+strconv.Itoa(kubeProxyHealthzPort)+"/healthz")
}

// kubeProxyArgs are a node's kube-proxy's (each node's in its own network
// namespace: the same loopback ports).
func (c *Cluster) kubeProxyArgs(kubeconfig, node string) []string {
	args := []string{"--kubeconfig=" + kubeconfig, "--hostname-override=" + node,
		"--proxy-mode=nftables", "--nodeport-addresses=primary",
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(kubeProxyMetricsPort),
		"--healthz-bind-address=127.0.0.1:" + strconv.Itoa(kubeProxyHealthzPort),
		// 0: leave the host's conntrack table size and timeouts alone.
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--v=1"}
	if cc := c.clusterCIDR(); cc != "" {
		args = append(args, "--cluster-cidr="+cc)
	}
	return args
}

// removeKubeProxyTables deletes the nftables tables kube-proxy made; it
// never removes them itself.
func removeKubeProxyTables() error {
	var errs []error
	for _, fam := range []string{"ip", "ip6"} {
		out, err := exec.Command("nft", "delete", "table", fam, "kube-proxy").CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("nft delete table %s kube-proxy: %w: %s", fam, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// corefile serves cluster.local from the API as kubeadm's CoreDNS does,
// on the node's addresses (the kube-dns Service's endpoints), without
// forwarding: nothing outside the cluster is resolved.
func (c *Cluster) corefile() string {
	var bind []string
	for _, ip := range c.Opts.nodeIPs() {
		bind = append(bind, ip.String())
	}
	return fmt.Sprintf(`.:53 {
    bind %s
    errors
    ready 127.0.0.1:%d
    loadbalance
    cache 30
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
}
`, strings.Join(bind, " "), corednsReadyPort, ClusterDomain, c.Kubeconfig)
}

// startCoreDNS runs CoreDNS and publishes it as the kube-dns Service: a
// Service without selector at DNSServiceIP whose EndpointSlice points at
// the node's primary address.
func (c *Cluster) startCoreDNS(ctx context.Context) error {
	path := filepath.Join(c.Opts.Dir, "Corefile")
	if err := os.WriteFile(path, []byte(c.corefile()), 0o644); err != nil {
		return fmt.Errorf("write Corefile: %w", err)
	}
	if _, err := c.startProc(CoreDNS, filepath.Join(c.CoreDNSDir, "coredns"), "-conf", path); err != nil {
		return err
	}
	if err := c.waitHTTPOK(ctx, CoreDNS, "http://127.0.0.1:"+strconv.Itoa(corednsReadyPort)+"/ready"); err != nil {
		return err
	}
	if out, err := c.KubectlStdin(ctx, c.kubeDNSObjects(), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("create the kube-dns Service: %w: %s", err, out)
	}
	return nil
}

func (c *Cluster) kubeDNSObjects() string {
	node := c.Opts.nodeIPs()[0]
	fam, addrType := "IPv4", "IPv4"
	if node.Is6() {
		fam, addrType = "IPv6", "IPv6"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: %[1]s
  ipFamilyPolicy: SingleStack
  ipFamilies: [%[2]s]
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-lab
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: k8slab
addressType: %[3]s
endpoints:
- addresses: [%[4]q]
  conditions: {ready: true}
  nodeName: %[5]s
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
`, c.DNSServiceIP(), fam, addrType, node, c.Opts.NodeName)
}

// apiIPs are the addresses besides loopback the apiserver's certificate
// must name: the kubernetes Service's, and with Services the node's.
func (c *Cluster) apiIPs() []net.IP {
	ips := []net.IP{c.APIServiceIP().AsSlice()}
	if c.Opts.Services {
		for _, ip := range c.Opts.nodeIPs() {
			ips = append(ips, ip.AsSlice())
		}
	}
	return ips
}
