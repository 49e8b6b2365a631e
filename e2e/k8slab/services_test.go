package k8slab

import (
	"strings"
	"testing"
)

// The Service ranges, the kubernetes and kube-dns addresses, the
// apiserver's address and kube-dns's objects follow the node's families,
// primary first; without Services the lab keeps its one IPv4 range.
func TestServicesFollowNodeFamilies(t *testing.T) {
	for _, tc := range []struct {
		nodeIP, cidrs, api, dns, host, slice string
		services                             bool
	}{
		{"fd00:0:5::2,198.19.0.2", "fd00:10:96::/112,198.18.0.0/16", "fd00:10:96::1", "fd00:10:96::a", "fd00:0:5::2", "addressType: IPv6", true},
		{"198.19.0.2,fd00:0:5::2", "198.18.0.0/16,fd00:10:96::/112", "198.18.0.1", "198.18.0.10", "198.19.0.2", "addressType: IPv4", true},
		{"fd00:0:5::2", "fd00:10:96::/112", "fd00:10:96::1", "fd00:10:96::a", "fd00:0:5::2", "addressType: IPv6", true},
		{"fd00:0:99::1,192.0.2.2", "198.18.0.0/16", KubernetesServiceIP, "198.18.0.10", "127.0.0.1", "", false},
	} {
		c := &Cluster{Opts: Options{NodeIP: tc.nodeIP, NodeName: "vm", Services: tc.services}}
		if got := strings.Join(c.ServiceCIDRs(), ","); got != tc.cidrs {
			t.Errorf("%s: Service ranges %s, want %s", tc.nodeIP, got, tc.cidrs)
		}
		if got := c.APIServiceIP().String(); got != tc.api {
			t.Errorf("%s: kubernetes Service %s, want %s", tc.nodeIP, got, tc.api)
		}
		if got := c.DNSServiceIP().String(); got != tc.dns {
			t.Errorf("%s: kube-dns %s, want %s", tc.nodeIP, got, tc.dns)
		}
		if got := c.apiServerHost(); got != tc.host {
			t.Errorf("%s: apiserver on %s, want %s", tc.nodeIP, got, tc.host)
		}
		if !tc.services {
			continue
		}
		objs := c.kubeDNSObjects()
		primary := strings.Split(tc.nodeIP, ",")[0]
		for _, want := range []string{"clusterIP: " + tc.dns, tc.slice, `addresses: ["` + primary + `"]`} {
			if !strings.Contains(objs, want) {
				t.Errorf("%s: kube-dns objects lack %q:\n%s", tc.nodeIP, want, objs)
			}
		}
		if cf := c.corefile(); !strings.Contains(cf, "bind "+strings.ReplaceAll(tc.nodeIP, ",", " ")) {
			t.Errorf("%s: Corefile binds elsewhere:\n%s", tc.nodeIP, cf)
		}
	}
}
