package nodestate

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// Two real-looking container IDs whose FNV-1a-32 collide: both map to host
// veth flock478741b0.
const (
	collideA = "58f27bf389c567fca8c050f22296867ab2988d2ceac9db1f221a7f81d4b543f8"
	collideB = "0c1df161b849d5106aeedf577d436325ba1c4a31a47a55fbaca730fe869437fe"
)

var (
	sum6   = netip.MustParsePrefix("fd00:10:1::/64")
	sum4   = netip.MustParsePrefix("10.1.1.0/24")
	shared = netip.MustParsePrefix("2001:db8:100::/120")
)

func spec() *v1alpha1.NodeConfigSpec {
	return &v1alpha1.NodeConfigSpec{ASN: 65001, RouterID: "192.0.2.1", Pools: []v1alpha1.Pool{
		{CIDR: sum6.String()}, {CIDR: sum4.String()}, {CIDR: shared.String(), Shared: true},
	}}
}

func newState(t *testing.T, defaultReady bool) *State {
	t.Helper()
	s, err := New(spec(), defaultReady)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pod(name string) podmeta.ID {
	return podmeta.ID{Namespace: "default", Name: name, UID: "uid-" + name}
}

func dual() []ipam.Request {
	return []ipam.Request{{Family: 6, Algo: ipam.Algo{Kind: ipam.Random}}, {Family: 4, Algo: ipam.Algo{Kind: ipam.Random}}}
}

// add reserves and commits one attachment.
func add(t *testing.T, s *State, id string, p podmeta.ID, mod func(*store.Allocation), reqs ...ipam.Request) store.Allocation {
	t.Helper()
	rec := store.Allocation{ContainerID: id, IfName: "eth0", Netns: "/ns/" + id, Pod: p}
	if mod != nil {
		mod(&rec)
	}
	if reqs == nil {
		reqs = dual()
	}
	rec, err := s.Reserve(rec, reqs)
	if err != nil {
		t.Fatalf("Reserve %s: %v", id, err)
	}
	if _, err := s.Commit(rec); err != nil {
		t.Fatalf("Commit %s: %v", id, err)
	}
	rec.State = store.Committed
	return rec
}

func TestCollidingContainersGetDistinctVeths(t *testing.T) {
	if dataplane.HostVethName(collideA) != dataplane.HostVethName(collideB) {
		t.Fatal("the test IDs no longer collide")
	}
	s := newState(t, true)
	a := add(t, s, collideA, pod("a"), nil)
	b := add(t, s, collideB, pod("b"), nil)
	if a.HostVeth != dataplane.HostVethName(collideA) {
		t.Errorf("first container got %s, want its default %s", a.HostVeth, dataplane.HostVethName(collideA))
	}
	if b.HostVeth == a.HostVeth {
		t.Fatalf("both containers got host veth %s", a.HostVeth)
	}
	if b.HostVeth != dataplane.ProbeVethName(collideB, 1) {
		t.Errorf("second container got %s, want its first probe %s", b.HostVeth, dataplane.ProbeVethName(collideB, 1))
	}
	if len(b.HostVeth) > 15 || !strings.HasPrefix(b.HostVeth, dataplane.VethPrefix) {
		t.Errorf("probed name %q is not a valid flock interface name", b.HostVeth)
	}
	for id, v := range map[string]string{collideA: a.HostVeth, collideB: b.HostVeth} {
		if owner, ok := s.VethOwner(v); !ok || owner != id {
			t.Errorf("VethOwner(%s) = %s %v, want %s", v, owner, ok, id)
		}
	}
	// The first one leaves: its name is free again, the second keeps its
	// own; a third colliding ADD of the first ID gets the default again.
	s.Release(collideA)
	if _, ok := s.VethOwner(a.HostVeth); ok {
		t.Error("released veth name still owned")
	}
	a2 := add(t, s, collideA, pod("a"), nil)
	if a2.HostVeth != a.HostVeth {
		t.Errorf("re-added %s got %s, want %s", collideA, a2.HostVeth, a.HostVeth)
	}
	if got, _, _ := s.Get(collideB); got.HostVeth != b.HostVeth {
		t.Errorf("second container's veth changed to %s", got.HostVeth)
	}
}

func TestRestoreKeepsRecordedVeth(t *testing.T) {
	s := newState(t, true)
	rec := store.Allocation{ContainerID: collideB, HostVeth: dataplane.ProbeVethName(collideB, 1), Pod: pod("b"),
		IPs: []netip.Addr{netip.MustParseAddr("fd00:10:1::2")}, State: store.Committed}
	if _, err := s.Restore(rec); err != nil {
		t.Fatal(err)
	}
	// A new ADD of the colliding ID takes its default name, which is free.
	a := add(t, s, collideA, pod("a"), nil)
	if a.HostVeth != dataplane.HostVethName(collideA) {
		t.Errorf("got %s", a.HostVeth)
	}
	// And one more container whose default is the restored probe cannot
	// exist (different hash), but the restored name stays owned.
	if owner, _ := s.VethOwner(rec.HostVeth); owner != collideB {
		t.Errorf("restored veth owned by %q", owner)
	}
}

func TestReserveIsAllOrNothing(t *testing.T) {
	s := newState(t, true)
	add(t, s, "c1", pod("c1"), func(r *store.Allocation) { r.Addresses = []netip.Addr{netip.MustParseAddr("2001:db8:aa::1")} })
	gen := s.Generation()
	for _, tc := range []struct {
		name string
		mod  func(*store.Allocation)
		reqs []ipam.Request
		want string
	}{
		{"addresses taken", func(r *store.Allocation) { r.Addresses = []netip.Addr{netip.MustParseAddr("2001:db8:aa::1")} }, nil, "c1"},
		{"anycast of an addresses IP", func(r *store.Allocation) { r.Anycast = []netip.Addr{netip.MustParseAddr("2001:db8:aa::1")} }, nil, "not anycast"},
		{"anycast inside a pod pool", func(r *store.Allocation) { r.Anycast = []netip.Addr{netip.MustParseAddr("fd00:10:1::9")} }, nil, sum6.String()},
		{"IPv4 range outside the pools", nil, []ipam.Request{{Family: 6}, {Family: 4, Range: netip.MustParsePrefix("10.99.0.0/24")}}, "10.99.0.0/24"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := store.Allocation{ContainerID: "c2", Pod: pod("c2")}
			if tc.mod != nil {
				tc.mod(&rec)
			}
			reqs := tc.reqs
			if reqs == nil {
				reqs = dual()
			}
			_, err := s.Reserve(rec, reqs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Reserve: %v, want an error naming %q", err, tc.want)
			}
			if _, _, ok := s.Get("c2"); ok {
				t.Error("a failed Reserve left an attachment")
			}
			for _, st := range s.IPAM() {
				if st.Pool.Prefix == sum6 && st.Used != 1 {
					t.Errorf("%s used %d, want 1 (only c1)", sum6, st.Used)
				}
			}
			if s.Generation() != gen {
				t.Error("a failed Reserve changed the generation")
			}
		})
	}
	// Inside a pool is named whether or not the IP is in use: c1's own
	// IPv4 address (IPAM picks it at random) and one next to it.
	c1, _, _ := s.Get("c1")
	for _, ip := range c1.IPs {
		if !ip.Is4() {
			continue
		}
		for _, a := range []netip.Addr{ip, ip.Next()} {
			var ae *annotations.Error
			_, err := s.Reserve(store.Allocation{ContainerID: "c3", Anycast: []netip.Addr{a}}, dual())
			if !errors.As(err, &ae) || ae.Key != annotations.Anycast {
				t.Errorf("anycast %s inside a pool: %v, want an annotations.Error for %s", a, err, annotations.Anycast)
			}
		}
	}
	if _, err := s.Reserve(store.Allocation{ContainerID: "c1"}, dual()); !errors.Is(err, ErrExists) {
		t.Errorf("second Reserve of c1: %v", err)
	}
}

func TestDesiredFollowsPhaseAndReadiness(t *testing.T) {
	s := newState(t, false) // Kubernetes mode: NotReady until reported
	any6 := netip.MustParseAddr("2001:db8:ff::1")
	addr4 := netip.MustParseAddr("192.0.2.80")
	p := pod("web")
	r1 := add(t, s, "c1", p, func(r *store.Allocation) { r.Anycast = []netip.Addr{any6} })
	r2 := add(t, s, "c2", pod("db"), func(r *store.Allocation) { r.Addresses = []netip.Addr{addr4} },
		ipam.Request{Family: 6, Range: shared}, ipam.Request{Family: 4})
	adv, _ := s.Adverts()
	want := map[netip.Prefix]advert.Kind{sum6: advert.Summary, sum4: advert.Summary, hostPrefix(r2.IPs[0]): advert.Pod}
	if !mapsEqual(adv, advert.Paths(want)) {
		t.Fatalf("Adverts = %v, want %v (nothing Ready yet)", adv, want)
	}
	if hr, _ := s.KernelRoutes(); len(hr) != 0 {
		t.Fatalf("KernelRoutes = %v before Ready", hr)
	}
	if !s.SetReady(p, true) {
		t.Fatal("SetReady(true) reported no change")
	}
	if s.SetReady(p, true) {
		t.Error("repeated SetReady reported a change")
	}
	s.SetReady(pod("db"), true)
	adv, _ = s.Adverts()
	want[hostPrefix(any6)], want[hostPrefix(addr4)] = advert.Anycast, advert.Address
	if !mapsEqual(adv, advert.Paths(want)) {
		t.Fatalf("Adverts = %v, want %v", adv, want)
	}
	hr, _ := s.KernelRoutes()
	if nh := hr[hostPrefix(any6)]; len(nh) != 1 || nh[0] != (dataplane.Nexthop{Gateway: r1.IPs[0], Dev: r1.HostVeth}) {
		t.Errorf("anycast route via %v, want via %s dev %s", nh, r1.IPs[0], r1.HostVeth)
	}
	if nh := hr[hostPrefix(addr4)]; len(nh) != 1 || nh[0].Gateway != r2.IPs[1] {
		t.Errorf("addresses route via %v, want via %s", nh, r2.IPs[1])
	}
	// Deleting: out of every route at once, IPs still held.
	gen, ok := s.MarkDeleting("c2")
	if !ok || gen != s.Generation() {
		t.Fatalf("MarkDeleting = %d %v", gen, ok)
	}
	adv, _ = s.Adverts()
	delete(want, hostPrefix(addr4))
	delete(want, hostPrefix(r2.IPs[0]))
	if !mapsEqual(adv, advert.Paths(want)) {
		t.Errorf("Adverts while c2 is deleting = %v, want %v", adv, want)
	}
	if hr, _ := s.KernelRoutes(); hr[hostPrefix(addr4)] != nil {
		t.Error("kernel route of a deleting attachment")
	}
	if _, err := s.Reserve(store.Allocation{ContainerID: "c3", Addresses: []netip.Addr{addr4}}, dual()); err == nil {
		t.Error("a deleting attachment's addresses IP was handed out again")
	}
	s.Release("c2")
	if _, err := s.Reserve(store.Allocation{ContainerID: "c3", Addresses: []netip.Addr{addr4}}, dual()); err != nil {
		t.Errorf("released addresses IP: %v", err)
	}
	// The pod leaves the API: back to NotReady.
	s.ForgetPod(p)
	if hr, _ := s.KernelRoutes(); hr[hostPrefix(any6)] != nil {
		t.Error("anycast still routed after the pod left the API")
	}
}

func TestSubscribersAreWoken(t *testing.T) {
	s := newState(t, true)
	a, b := s.Changed(), s.Changed()
	add(t, s, "c1", pod("c1"), nil)
	for i, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Errorf("subscriber %d not woken", i)
		}
	}
}

func TestSetReadyByName(t *testing.T) {
	s := newState(t, true)
	add(t, s, "c1", pod("web"), func(r *store.Allocation) { r.Anycast = []netip.Addr{netip.MustParseAddr("2001:db8:ff::1")} })
	if _, err := s.SetReadyByName("default", "nope", false); err == nil || !strings.Contains(err.Error(), "default/nope") {
		t.Errorf("unknown pod: %v", err)
	}
	n, err := s.SetReadyByName("default", "web", false)
	if err != nil || n != 1 {
		t.Fatalf("SetReadyByName = %d %v", n, err)
	}
	if hr, _ := s.KernelRoutes(); len(hr) != 0 {
		t.Errorf("routes after NotReady: %v", hr)
	}
	// Standalone: the report goes with the pod's last attachment.
	s.Release("c1")
	add(t, s, "c2", pod("web"), nil)
	if !s.Ready(pod("web")) {
		t.Error("a new attachment of the pod inherited the old NotReady report")
	}
}

func TestAttachmentsAndPhases(t *testing.T) {
	s := newState(t, true)
	add(t, s, "b", pod("b"), nil)
	rec, err := s.Reserve(store.Allocation{ContainerID: "a", Pod: pod("a")}, dual())
	if err != nil {
		t.Fatal(err)
	}
	s.MarkStuck(rec.ContainerID, "test")
	var got []string
	for _, at := range s.Attachments() {
		got = append(got, at.ContainerID+":"+at.Phase.String())
	}
	if !slices.Equal(got, []string{"a:stuck", "b:committed"}) {
		t.Errorf("Attachments = %v", got)
	}
	if s.Count() != 1 || len(s.Committed()) != 1 {
		t.Errorf("Count %d Committed %d", s.Count(), len(s.Committed()))
	}
	if _, err := s.Commit(rec); err == nil {
		t.Error("Commit of a stuck attachment succeeded")
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A pod address restored outside every pool is held; once a pool covering
// it arrives, IPAM knows it is taken and hands out everything else.
func TestPoolArrivingOverRestoredAddress(t *testing.T) {
	s := newState(t, true)
	pool := netip.MustParsePrefix("2001:db8:200::/126") // .1 and .2 usable
	held := netip.MustParseAddr("2001:db8:200::1")
	if _, err := s.Restore(store.Allocation{ContainerID: "old", IfName: "eth0", Netns: "/ns/old", Pod: pod("old"),
		HostVeth: dataplane.HostVethName("old"), State: store.Committed, IPs: []netip.Addr{held}}); err != nil {
		t.Fatal(err)
	}
	if skipped, err := s.SetPodPools([]netip.Prefix{pool}); err != nil || skipped != nil {
		t.Fatalf("SetPodPools = %v, %v", skipped, err)
	}
	for i := range 2 {
		rec, err := s.Reserve(store.Allocation{ContainerID: fmt.Sprintf("new%d", i), Pod: pod("new")}, []ipam.Request{{Family: 6, Range: pool}})
		if i == 1 {
			if !errors.Is(err, ipam.ErrExhausted) {
				t.Errorf("second ADD from the pool: %v, %v; want it exhausted (its other address is held)", rec.IPs, err)
			}
			continue
		}
		if err != nil || slices.Contains(rec.IPs, held) {
			t.Fatalf("ADD from the new pool got %v, %v; %s is held by old", rec.IPs, err, held)
		}
	}
	// The old pod still holds it, once: its DEL frees it.
	s.Release("old")
	if rec, err := s.Reserve(store.Allocation{ContainerID: "after", Pod: pod("after")}, []ipam.Request{{Family: 6, Range: pool}}); err != nil || !slices.Equal(rec.IPs, []netip.Addr{held}) {
		t.Errorf("after old's release: %v, %v; want %s", rec.IPs, err, held)
	}
}
