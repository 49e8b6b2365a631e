package nodeconfigs

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
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
	f := kubeclient.NewFactory()
	all := NewAll(f, dyn)
	ctx := runFactory(t, f, dyn)
	want := "map[a:[fd00:10:1::/64] b:[10.10.2.0/24 fd00:10:2::/64]]"
	if got := fmt.Sprint(all.Summaries()); got != want {
		t.Errorf("Summaries = %s, want %s", got, want)
	}
	if got := all.Names(); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"a", "b"}) {
		t.Errorf("Names = %v", got)
	}
	// The first list signalled (once, coalesced): take it, once every
	// event of it reached the handler.
	testutil.WaitFor(t, "the handler saw the first list", all.handler.HasSynced)
	<-all.Changed()
	upd := withPools(nodeConfig("b", 2, 65001), map[string]any{"cidr": "fd00:10:1::/64"})
	if _, err := dyn.Resource(GVR).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all.Changed():
	case <-time.After(testutil.Timeout):
		t.Fatal("no change reported")
	}
	if got := all.Summaries()["b"]; len(got) != 1 || got[0] != netip.MustParsePrefix("fd00:10:1::/64") {
		t.Errorf("b's summaries after the update: %v", got)
	}
}
