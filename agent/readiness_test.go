package agent_test

import (
	"net/netip"
	"testing"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// In Kubernetes mode anycast is advertised and routed only while the pod is
// Ready; a readiness report that beats the ADD is kept.
func TestReadinessGatesAnycast(t *testing.T) {
	e := started(t)
	any6 := netip.MustParsePrefix("2001:db8:a::1/128")
	has := func() bool {
		e.settled()
		return e.sp.Held()[any6] == advert.Anycast
	}
	routed := func() bool { return len(e.dp.kernelRoutes()[any6]) > 0 }
	c1 := podmeta.ID{Namespace: "default", Name: "pod-c1", UID: "u1"}
	rec := e.mustAdd("c1", "flock.fritzlab.net/anycast=2001:db8:a::1", "K8S_POD_UID=u1")
	if has() || routed() {
		t.Fatal("anycast advertised or routed before the pod is Ready")
	}
	if got := e.a.PodAllocations(c1); len(got) != 1 || got[0].ContainerID != rec.ContainerID {
		t.Fatalf("PodAllocations: %+v", got)
	}
	e.a.SetPodReady(c1, true)
	if !has() {
		t.Fatal("anycast not advertised once Ready")
	}
	if !routed() {
		t.Error("no kernel anycast route once Ready")
	}
	e.a.SetPodReady(c1, false)
	if has() || routed() {
		t.Fatal("anycast still advertised or routed after NotReady")
	}

	// Ready reported before the ADD commits: the ADD publishes at once.
	e.a.SetPodReady(podmeta.ID{Namespace: "default", Name: "pod-c2", UID: "u2"}, true)
	e.mustAdd("c2", "flock.fritzlab.net/anycast=2001:db8:a::1", "K8S_POD_UID=u2")
	if e.sp.Held()[any6] != advert.Anycast {
		t.Fatal("readiness reported before ADD was lost (or ADD returned before the reconcilers applied it)")
	}
	// Another incarnation (UID) of the same name does not inherit it.
	if got := e.a.PodAllocations(podmeta.ID{Namespace: "default", Name: "pod-c2", UID: "other"}); len(got) != 0 {
		t.Errorf("PodAllocations for another UID: %+v", got)
	}
	// The pod leaves the API before kubelet's DEL: its readiness falls back
	// to NotReady and the anycast path goes.
	e.a.ForgetPod(podmeta.ID{Namespace: "default", Name: "pod-c2", UID: "u2"})
	if has() || routed() {
		t.Error("anycast of a pod that left the API is still advertised or routed")
	}
}
