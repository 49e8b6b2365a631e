package nodeconfigs

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = all.Run(ctx, func() { changes <- struct{}{} }) }()
	defer func() { cancel(); wg.Wait() }()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if err := all.WaitSynced(sctx); err != nil {
		t.Fatal(err)
	}
	want := "map[a:[fd00:10:1::/64] b:[10.10.2.0/24 fd00:10:2::/64]]"
	if got := fmt.Sprint(all.Summaries()); got != want {
		t.Errorf("Summaries = %s, want %s", got, want)
	}
	for range 2 {
		<-changes // the first list
	}
	upd := withPools(nodeConfig("b", 2, 65001), map[string]any{"cidr": "fd00:10:1::/64"})
	if _, err := dyn.Resource(GVR).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changes:
	case <-time.After(5 * time.Second):
		t.Fatal("no change reported")
	}
	if got := all.Summaries()["b"]; len(got) != 1 || got[0] != netip.MustParsePrefix("fd00:10:1::/64") {
		t.Errorf("b's summaries after the update: %v", got)
	}
}
