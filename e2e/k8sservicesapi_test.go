package e2e

import (
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"code.fritzlab.net/fritzlab/flock/bgp/advert"
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
	allow := netip.MustParsePrefix("2001:db8:e5::/64")
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
  externalIPs: ["2001:db8:e5::5"]
`, "apply", "-f", "-")
	slice := func(ready, terminating bool) string {
		return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: ["fd00:10::1"]
  nodeName: n1
  conditions: {ready: %v, serving: true, terminating: %v}
`, ready, terminating)
	}
	p := netip.MustParsePrefix("2001:db8:e5::5/128")
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
