package agent_test

import (
	"net/netip"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/bgp/advert"
)

// Without ReadyOnCommit (Kubernetes mode) anycast is published only while
// the pod is Ready; a readiness report that beats the ADD is kept.
func TestReadinessGatesAnycast(t *testing.T) {
	set := advert.NewSet()
	e := started(t, func(c *agent.Config) { c.Adverts = set })
	any6 := netip.MustParsePrefix("2001:db8:a::1/128")
	has := func() bool {
		for _, r := range set.Routes() {
			if r.Prefix == any6 && r.Kind == advert.Anycast {
				return true
			}
		}
		return false
	}
	rec := e.mustAdd("c1", "flock.fritzlab.net/anycast=2001:db8:a::1", "K8S_POD_UID=u1")
	if has() {
		t.Fatal("anycast advertised before the pod is Ready")
	}
	if got := e.a.PodAllocations(podmeta.ID{Namespace: "default", Name: "pod-c1", UID: "u1"}); len(got) != 1 || got[0].ContainerID != rec.ContainerID {
		t.Fatalf("PodAllocations: %+v", got)
	}
	e.a.SetPodReady(podmeta.ID{Namespace: "default", Name: "pod-c1", UID: "u1"}, true)
	if !has() {
		t.Fatal("anycast not advertised once Ready")
	}
	if e.dp.countPrefix("SetRoute 2001:db8:a::1/128") == 0 {
		t.Error("no kernel anycast route once Ready")
	}
	e.a.SetPodReady(podmeta.ID{Namespace: "default", Name: "pod-c1", UID: "u1"}, false)
	if has() {
		t.Fatal("anycast still advertised after NotReady")
	}

	// Ready reported before the ADD commits: the ADD publishes at once.
	e.a.SetPodReady(podmeta.ID{Namespace: "default", Name: "pod-c2", UID: "u2"}, true)
	e.mustAdd("c2", "flock.fritzlab.net/anycast=2001:db8:a::1", "K8S_POD_UID=u2")
	if !has() {
		t.Fatal("readiness reported before ADD was lost")
	}
	// Another incarnation (UID) of the same name does not inherit it.
	if got := e.a.PodAllocations(podmeta.ID{Namespace: "default", Name: "pod-c2", UID: "other"}); len(got) != 0 {
		t.Errorf("PodAllocations for another UID: %+v", got)
	}
}
