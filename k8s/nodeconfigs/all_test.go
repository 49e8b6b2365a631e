package nodeconfigs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

func withPools(u *unstructured.Unstructured, pools ...map[string]any) *unstructured.Unstructured {
	var list []any
	for _, p := range pools {
		list = append(list, p)
	}
	u.Object["spec"].(map[string]any)["pools"] = list
	return u
}

// Every node's summaries, followed live; shared pools are not summaries.
func TestAllSummaries(t *testing.T) {
	dyn := fakeClient(
		withPools(nodeConfig("a", 1, 65001), map[string]any{"cidr": "fd00:10:1::/64"}, map[string]any{"cidr": "2001:db8:100::/112", "shared": true}),
		withPools(nodeConfig("b", 1, 65001), map[string]any{"cidr": "fd00:10:2::/64"}, map[string]any{"cidr": "10.10.2.0/24"}),
	)
	all := NewAll(dyn)
	changes := make(chan struct{}, 10)
	ctx := testutil.Start(t, func(ctx context.Context) error {
		return all.Run(ctx, func() { changes <- struct{}{} })
	}, all.WaitSynced)
	testutil.WaitWatching(t, dyn, GVR.Resource)
	want := "map[a:[fd00:10:1::/64] b:[10.10.2.0/24 fd00:10:2::/64]]"
	if got := fmt.Sprint(all.Summaries()); got != want {
		t.Errorf("Summaries = %s, want %s", got, want)
	}
	changed := func(what string) {
		t.Helper()
		select {
		case <-changes:
		case <-time.After(testutil.Timeout):
			t.Fatalf("no change reported for %s", what)
		}
	}
	changed("the first list of a")
	changed("the first list of b")
	upd := withPools(nodeConfig("b", 2, 65001), map[string]any{"cidr": "fd00:10:1::/64"})
	if _, err := dyn.Resource(GVR).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	changed("b's update")
	if got := all.Summaries()["b"]; len(got) != 1 || got[0] != netip.MustParsePrefix("fd00:10:1::/64") {
		t.Errorf("b's summaries after the update: %v", got)
	}
}
