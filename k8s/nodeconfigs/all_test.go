package nodeconfigs

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

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
// Neither node is this one: both are cut to what All reads (othersCut),
// so a cut that dropped a pool's CIDR, its sharedness or the generation
// fails here.
func TestAllSummaries(t *testing.T) {
	dyn := fakeClient(
		withPools(nodeConfig("a", 1, 65001), map[string]any{"cidr": "fd00:10:1::/64"}, map[string]any{"cidr": "2001:db8:100::/112", "shared": true}),
		withPools(nodeConfig("b", 1, 65001), map[string]any{"cidr": "fd00:10:2::/64"}, map[string]any{"cidr": "10.10.2.0/24"}),
	)
	f := kubeclient.NewFactory()
	all := NewAll(f, dyn, "this-node")
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

// Other nodes' NodeConfigs are cached cut to their identity, generation
// and pools' CIDRs and sharedness; this node's whole (its Watcher reads
// its status and whole spec).
func TestAllCutsOtherNodes(t *testing.T) {
	withStatus := func(u *unstructured.Unstructured) *unstructured.Unstructured {
		u.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}
		u.Object["metadata"].(map[string]any)["labels"] = map[string]any{"rack": "r1"}
		u.SetUID("uid-" + types.UID(u.GetName()))
		u.SetResourceVersion("7")
		return u
	}
	dyn := fakeClient(
		withStatus(withPools(nodeConfig("mine", 3, 65001), map[string]any{"cidr": "fd00:10:1::/64", "namespaces": []any{"p"}})),
		withStatus(withPools(nodeConfig("other", 4, 65002), map[string]any{"cidr": "fd00:10:2::/64", "shared": true, "namespaces": []any{"q"}})),
	)
	f := kubeclient.NewFactory()
	all := NewAll(f, dyn, "mine")
	w := New(f, dyn, "mine")
	runFactory(t, f, dyn)
	if st, ok := w.Status(); !ok || len(st.Conditions) != 1 {
		t.Errorf("this node's status as cached: %+v (found %v), want its condition", st, ok)
	}
	if spec, gen, err := w.Current(); err != nil || gen != 3 || spec.ASN != 65001 || spec.RouterID != "192.0.2.1" || len(spec.Pools) != 1 || len(spec.Pools[0].Namespaces) != 1 {
		t.Errorf("this node's spec as cached: %+v gen %d (%v), want it whole", spec, gen, err)
	}
	obj, ok, _ := all.informer.GetStore().GetByKey("other")
	if !ok {
		t.Fatal("no NodeConfig of the other node")
	}
	want := map[string]any{"apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "NodeConfig",
		"metadata": map[string]any{"name": "other", "generation": int64(4), "resourceVersion": "7", "uid": "uid-other"},
		"spec":     map[string]any{"pools": []any{map[string]any{"cidr": "fd00:10:2::/64", "shared": true}}}}
	if got := obj.(*unstructured.Unstructured).Object; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the other node's NodeConfig as cached:\n%v\nwant\n%v", got, want)
	}
}

// A node whose spec does not parse contributes no summary, also when only
// a field the cut drops is wrong (the cut keeps such a NodeConfig whole).
func TestAllSpecNotParsingCutOrNot(t *testing.T) {
	bad := withPools(nodeConfig("c", 1, 65001), map[string]any{"cidr": "fd00:10:3::/64"})
	bad.Object["spec"].(map[string]any)["asn"] = "sixty-five thousand"
	if _, err := SpecOf(bad.DeepCopy()); err == nil {
		t.Fatal("the whole object's spec parses: the test needs one that does not")
	}
	dyn := fakeClient(withPools(nodeConfig("a", 1, 65001), map[string]any{"cidr": "fd00:10:1::/64"}), bad)
	f := kubeclient.NewFactory()
	all := NewAll(f, dyn, "this-node")
	runFactory(t, f, dyn)
	if got, want := fmt.Sprint(all.Summaries()), "map[a:[fd00:10:1::/64]]"; got != want {
		t.Errorf("Summaries = %s, want %s (node c's spec does not parse)", got, want)
	}
}
