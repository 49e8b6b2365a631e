package e2e

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

// The services controller against a real kube-apiserver, through the
// agent's own clients (core/v1 and discovery.k8s.io/v1, protobuf, watch
// lists): EndpointSlices written after it started reach it, and its
// routes follow their conditions.
func TestServicesControllerAPI(t *testing.T) {
	c := apiOnlyLab(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	core, err := kubeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := kubeclient.NewDiscovery(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := kubeclient.NewFactory()
	allow := netip.MustParsePrefix("198.51.100.224/27") // the lab's Services are IPv4
	ctl := services.New(f, services.Clients{Services: core.Services(""), EndpointSlices: disc.EndpointSlices("")}, services.Options{
		Node: "n1",
		Authorize: func(use string, ip netip.Addr, ns string) error {
			if allow.Contains(ip) {
				return nil
			}
			return fmt.Errorf("not in %s", allow)
		},
	}, slog.Default())
	testutil.Start(t, f.Run, f.WaitForSync)
	testutil.Run(t, ctl.Run)

	kubectlRetry(t, c, `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  ports: [{name: http, port: 80}]
  externalIPs: ["198.51.100.225"]
`, "apply", "-f", "-")
	slice := func(ready, terminating bool) string {
		return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: ["10.9.0.1"]
  nodeName: n1
  conditions: {ready: %v, serving: true, terminating: %v}
`, ready, terminating)
	}
	p := netip.MustParsePrefix("198.51.100.225/32")
	wantPath := func(what string, want advert.Path) {
		t.Helper()
		testutil.EventuallyWithin(t, 20*time.Second, what, func() (bool, string) {
			got := ctl.Routes()[p].Path
			return got == want, fmt.Sprintf("%+v; rows %v", got, ctl.Addresses())
		})
	}
	wantPath("no EndpointSlice: nothing", advert.Path{})
	kubectlRetry(t, c, slice(true, false), "apply", "-f", "-")
	wantPath("a ready endpoint: advertised", advert.Path{Kind: advert.Service})
	kubectlRetry(t, c, slice(false, true), "apply", "-f", "-")
	wantPath("terminating, serving: draining", advert.Path{Kind: advert.Service, Drain: true})
	kubectlRetry(t, c, "", "delete", "endpointslice", "web-1")
	wantPath("slice deleted: withdrawn", advert.Path{})
}

// Weighted ECMP with FRR (issue 21): two Kubernetes-mode agents against a
// real kube-apiserver, both delivering one external IP of an
// externalTrafficPolicy: Local Service with spec.services.linkBandwidth;
// FRR, the ToR, installs the route with next-hop weights in the ratio of
// the endpoints on each node (3:1), and equal ones once they are equal.
func TestServicesWeightedECMP(t *testing.T) {
	c := apiOnlyLab(t)
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectlRetry(t, c, "", "apply", "-f", filepath.Join(root, "deploy", "crd"))
	kubectlRetry(t, c, "", "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: "flkwe", Dir: t.TempDir(), BinDir: binDir, Nodes: 2, Kubeconfig: c.Kubeconfig,
		AgentArgs: []string{"--metrics-address="},
		Setup: func(n *lab.LabNode) error {
			nc, _, _ := strings.Cut(lab.DefaultNodeConfig(n), "\n---")
			nc = strings.Replace(nc, "  bgp:\n", "  services: {linkBandwidth: true}\n  bgp:\n", 1)
			kubectlRetry(t, c, nc, "apply", "-f", "-")
			return apiProxy(t, n.NS)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := l.StartFRR(nil); err != nil {
		t.Fatal(err)
	}
	kubectlRetry(t, c, `apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata: {name: external-ips}
spec: {cidrs: ["198.51.100.224/27"], use: [externalIP], namespaces: [default]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  externalIPs: ["198.51.100.225"]
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
`, "apply", "-f", "-")
	slice := func(n1, n2 int) string {
		var b strings.Builder
		b.WriteString(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web, endpointslice.kubernetes.io/managed-by: flock-e2e}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
`)
		for i := range n1 + n2 {
			node := l.Nodes[0].Name
			if i >= n1 {
				node = l.Nodes[1].Name
			}
			fmt.Fprintf(&b, "- {addresses: [\"10.9.0.%d\"], nodeName: %s, conditions: {ready: true}}\n", i+1, node)
		}
		return b.String()
	}
	// weights reads FRR's next hops of the route: node address → weight.
	weights := func() (map[string]int, string) {
		out, _ := l.FRR.Vtysh("show ip route 198.51.100.225/32 json")
		var r map[string][]struct {
			Nexthops []struct {
				IP     string `json:"ip"`
				Weight int    `json:"weight"`
				Active bool   `json:"active"`
			} `json:"nexthops"`
		}
		_ = json.Unmarshal([]byte(out), &r)
		w := map[string]int{}
		for _, route := range r["198.51.100.225/32"] {
			for _, nh := range route.Nexthops {
				if nh.Active {
					w[nh.IP] += nh.Weight
				}
			}
		}
		return w, out
	}
	ratio := func(want float64) {
		t.Helper()
		testutil.EventuallyWithin(t, 60*time.Second, fmt.Sprintf("FRR's next-hop weights in the ratio %.0f:1", want), func() (bool, string) {
			w, out := weights()
			if len(w) != 2 {
				return false, out
			}
			var ws []int
			for _, v := range w {
				ws = append(ws, v)
			}
			hi, lo := max(ws[0], ws[1]), min(ws[0], ws[1])
			got := float64(hi) / float64(max(lo, 1))
			return math.Abs(got-want) <= 0.25*want, fmt.Sprintf("weights %v (ratio %.2f)\n%s", w, got, out)
		})
	}
	kubectlRetry(t, c, slice(3, 1), "apply", "-f", "-")
	ratio(3)
	kubectlRetry(t, c, slice(2, 2), "apply", "-f", "-")
	ratio(1)

	// A node whose endpoints all terminate (still serving) drains: FRR
	// (8.3+, as deploy/tor/frr.conf says) gives its GRACEFUL_SHUTDOWN path
	// LOCAL_PREF 0 by itself, and it leaves the multipath.
	terminating := strings.Replace(slice(2, 2), "conditions: {ready: true}", "conditions: {ready: false, serving: true, terminating: true}", 2)
	kubectlRetry(t, c, terminating, "apply", "-f", "-")
	drained, ready := l.Nodes[0].V6.String(), l.Nodes[1].V6.String()
	testutil.EventuallyWithin(t, 60*time.Second, "the draining node's path at LOCAL_PREF 0, out of the multipath", func() (bool, string) {
		out, _ := l.FRR.Vtysh("show bgp ipv4 unicast 198.51.100.225/32 json")
		var r struct {
			Paths []struct {
				LocPrf    *int `json:"locPrf"`
				Community struct {
					String string `json:"string"`
				} `json:"community"`
				Peer struct {
					PeerID string `json:"peerId"`
				} `json:"peer"`
			} `json:"paths"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Paths) != 2 {
			return false, out
		}
		for _, p := range r.Paths {
			gshut := strings.Contains(p.Community.String, "graceful-shutdown") || strings.Contains(p.Community.String, "65535:0")
			if gshut != (p.Peer.PeerID == drained) || gshut && (p.LocPrf == nil || *p.LocPrf != 0) {
				return false, out
			}
		}
		w, rib := weights()
		if len(w) != 1 || w[ready] == 0 {
			return false, rib
		}
		return true, ""
	})
}
