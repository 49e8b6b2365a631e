package nodestate

import (
	"net/netip"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// A static pod is one incarnation through all its mirrors: readiness
// reported through any of them reaches the attachments set up through
// any other, and the mirror of another static pod under the name does not.
func TestStaticPodReadinessThroughAnyMirror(t *testing.T) {
	s := newState(t, false)
	mirror := func(uid, static string) podmeta.ID {
		return podmeta.ID{Namespace: "kube-system", Name: "dns", UID: uid, StaticUID: static}
	}
	any6 := netip.MustParseAddr("2001:db8:ff::1")
	anycast := func(r *store.Allocation) { r.Anycast = []netip.Addr{any6} }
	add(t, s, "c1", mirror("m1", "s1"), anycast)
	add(t, s, "c2", mirror("m2", "s1"), anycast) // a new sandbox after the mirror was re-created
	routes := func() int { hr, _ := s.KernelRoutes(); return len(hr[hostPrefix(any6)]) }

	if !s.SetReady(mirror("m3", "s1"), true) || routes() != 2 {
		t.Fatalf("Ready through a third mirror: %d next hops, want both sandboxes", routes())
	}
	if got := s.PodAllocations(mirror("m3", "s1")); len(got) != 2 {
		t.Errorf("PodAllocations through another mirror: %d, want 2", len(got))
	}
	s.ForgetPod(mirror("m3", "s1"))
	if routes() != 0 {
		t.Error("still routed after the mirror left the API")
	}
	if s.SetReady(mirror("m4", "s2"), true) || routes() != 0 {
		t.Error("another static pod's mirror made the old one's sandboxes Ready")
	}
	if got := s.PodAllocations(mirror("m4", "s2")); len(got) != 0 {
		t.Errorf("PodAllocations of another static pod: %+v", got)
	}
	s.SetReady(mirror("m5", "s1"), true)
	if routes() != 2 {
		t.Errorf("Ready through a re-created mirror: %d next hops, want 2", routes())
	}
}
