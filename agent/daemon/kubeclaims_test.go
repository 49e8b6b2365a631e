package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// An ADD that asks for an IP someone holds is refused with the holder's
// name, through the API's claims: a Service holding its LoadBalancer
// address is named as the Service, a pod as before; both are ErrClaimed
// (the agent does not retry an IP asked for by name).
func TestKubeClaimsRefusalNamesTheHolder(t *testing.T) {
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{claims.GVR: v1alpha1.AddressClaimKind + "List"})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	lb, podIP := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8:aa::1")
	if err := claims.New(kubeclient.NewFactory(), dyn, "", quiet).ClaimService(ctx, lb, "lb", claims.ServiceRef{Namespace: "shop", Name: "web", UID: "uid-web"}); err != nil {
		t.Fatal(err)
	}
	other := podmeta.ID{Namespace: "shop", Name: "db-0", UID: "uid-db"}
	if err := claims.New(kubeclient.NewFactory(), dyn, "node-b", quiet).Claim(ctx, claims.Claim{IP: podIP, Use: v1alpha1.UseAddresses, Pool: "public", Pod: other, ContainerID: "0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	k := kubeClaims{k: &kubeMode{o: Options{NodeName: "node-a"}, claims: claims.New(kubeclient.NewFactory(), dyn, "node-a", quiet)}}
	client := podmeta.ID{Namespace: "shop", Name: "client", UID: "uid-client"}
	for _, tc := range []struct {
		ip         netip.Addr
		want, add  string
		holderIsLB bool
	}{
		{lb, "198.51.100.7 is claimed by Service shop/web (uid uid-web)",
			"pod shop/client: annotation flock.fritzlab.net/addresses: 198.51.100.7 is claimed by Service shop/web (uid uid-web)", true},
		{podIP, "2001:db8:aa::1 is claimed by pod shop/db-0 (uid uid-db) on node node-b, container 0123456789ab",
			"pod shop/client: annotation flock.fritzlab.net/addresses: 2001:db8:aa::1 is claimed by pod shop/db-0 (uid uid-db) on node node-b, container 0123456789ab", false},
	} {
		err := k.Claim(ctx, agent.Claim{IP: tc.ip, Use: v1alpha1.UseAddresses, Pool: "public", Pod: client, ContainerID: "c1"})
		if !errors.Is(err, agent.ErrClaimed) {
			t.Fatalf("%s: %v, want ErrClaimed", tc.ip, err)
		}
		var held *claims.ClaimedError
		if !errors.As(err, &held) || (held.Holder.Service != nil) != tc.holderIsLB {
			t.Fatalf("%s: %v, want a ClaimedError (held by a Service: %v)", tc.ip, err, tc.holderIsLB)
		}
		if err.Error() != tc.want {
			t.Errorf("refusal\n got %s\nwant %s", err, tc.want)
		}
		// As ADD reports it (agent.claim wraps it).
		add := &agent.ClaimError{Pod: client, Key: annotations.Addresses, IP: tc.ip, Use: v1alpha1.UseAddresses, Err: err}
		if add.Error() != tc.add {
			t.Errorf("ADD error\n got %s\nwant %s", add, tc.add)
		}
	}
}
