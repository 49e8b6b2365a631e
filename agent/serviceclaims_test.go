package agent_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
)

// An IP a Service holds (its LoadBalancer address, claimed by the
// assigner) is refused to a pod that asks for it by name — as an
// `addresses` IP or as its exact pod address — naming the Service, the
// annotation and the IP; nothing is allocated, and the Service's claim is
// left alone (the rollback gives back only the pod's own). A pod address
// picked from a range never lands on it. The node's cache lags throughout,
// so every refusal is the API's (with a current cache the IPAM avoids the
// Service's address as it avoids another pod's).
func TestServiceHeldAddressRefusedToPods(t *testing.T) {
	cs := newClaimStore()
	cs.lag = 100
	e := authorized(t, cs.node("node-a"))
	lb, lbPod := mustAddr("2001:db8:aa::9"), clusterPods6.Addr().Next()
	cs.holdForService(lb, "shop/web")
	cs.holdForService(lbPod, "shop/api")

	for _, tc := range []struct {
		id, ann, ip string
	}{
		{"c1", annotations.Addresses + "=" + lb.String(), lb.String()},
		{"c2", annotations.CIDR6 + "=" + netip.PrefixFrom(lbPod, 128).String(), lbPod.String()},
	} {
		_, err := e.addIn("prod", tc.id, tc.ann, annotations.IPv4+"=false")
		if err == nil {
			t.Fatalf("%s: a pod took %s, which a Service holds", tc.id, tc.ip)
		}
		if !errors.Is(err, agent.ErrClaimed) {
			t.Errorf("%s: %v does not wrap ErrClaimed", tc.id, err)
		}
		key, _, _ := strings.Cut(tc.ann, "=")
		svc := map[string]string{"c1": "Service shop/web", "c2": "Service shop/api"}[tc.id]
		if want := "pod prod/pod-" + tc.id + ": annotation " + key + ": " + tc.ip + " is claimed by " + svc; err.Error() != want {
			t.Errorf("%s: error\n got %s\nwant %s", tc.id, err, want)
		}
		if code := cniCode(t, err); code != types.ErrInvalidNetworkConfig {
			t.Errorf("%s: code = %d", tc.id, code)
		}
		e.wantNothingFor(tc.id)
	}
	want := map[netip.Addr]string{lb: "Service shop/web", lbPod: "Service shop/api"}
	if got := cs.holders(); len(got) != 2 || got[lb] != want[lb] || got[lbPod] != want[lbPod] {
		t.Errorf("claims %v, want only the Services' %v", got, want)
	}

	// From the range: any address but the Service's.
	for _, id := range []string{"c3", "c4", "c5"} {
		rec, err := e.addIn("prod", id, annotations.CIDR6+"="+clusterPods6.String(), annotations.IPv4+"=false")
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if rec.IPs[0] == lbPod {
			t.Errorf("%s got %s, which Service shop/api holds", id, lbPod)
		}
	}
	if err := e.a.Del(context.Background(), "c3"); err != nil {
		t.Fatal(err)
	}
	if got := cs.holders(); got[lb] != want[lb] || got[lbPod] != want[lbPod] {
		t.Errorf("claims after a DEL %v: a Service's claim went", got)
	}
}
