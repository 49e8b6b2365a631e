package nodestate

import (
	"net/netip"
	"testing"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/store"
)

// Service routes join the BGP set with their drain and weight, bump the
// generation only when they change, never reach the kernel set, and yield
// to a pod's route on the same prefix.
func TestServiceRoutes(t *testing.T) {
	s := newState(t, true)
	lb := netip.MustParsePrefix("2001:db8:5e::1/128")
	any6 := netip.MustParseAddr("2001:db8:ff::1")
	routes := map[netip.Prefix]ServiceRoute{
		lb:               {Path: advert.Path{Kind: advert.Service, Weight: 2}, Owners: []string{"shop/web"}},
		hostPrefix(any6): {Path: advert.Path{Kind: advert.Service, Drain: true}, Owners: []string{"shop/api"}},
	}
	gen := s.Generation()
	if g := s.SetServiceRoutes(routes); g == gen {
		t.Fatal("SetServiceRoutes did not bump the generation")
	}
	gen = s.Generation()
	if g := s.SetServiceRoutes(map[netip.Prefix]ServiceRoute{lb: routes[lb], hostPrefix(any6): routes[hostPrefix(any6)]}); g != gen {
		t.Error("the same routes bumped the generation")
	}
	adv, _ := s.Adverts()
	if adv[lb] != routes[lb].Path || adv[hostPrefix(any6)] != routes[hostPrefix(any6)].Path {
		t.Errorf("Adverts = %v", adv)
	}
	if kr, _ := s.KernelRoutes(); len(kr) != 0 {
		t.Errorf("KernelRoutes = %v: Service routes are kube-proxy's to deliver", kr)
	}
	// A Ready pod's anycast route on the same prefix outranks the Service's.
	add(t, s, "c1", pod("web"), func(r *store.Allocation) { r.Anycast = []netip.Addr{any6} })
	adv, _ = s.Adverts()
	if adv[hostPrefix(any6)] != (advert.Path{Kind: advert.Anycast}) {
		t.Errorf("anycast prefix advertised as %v, want the pod's anycast route", adv[hostPrefix(any6)])
	}
	rs, _ := s.AdvertRoutes()
	found := false
	for _, r := range rs {
		if r.Prefix == lb {
			found = true
			if r.Path() != routes[lb].Path || len(r.Owners) != 1 || r.Owners[0] != "shop/web" {
				t.Errorf("AdvertRoutes has %+v for %s", r, lb)
			}
		}
	}
	if !found {
		t.Errorf("AdvertRoutes lacks %s", lb)
	}
	// A weight change re-sends; the empty set withdraws them all.
	s.SetServiceRoutes(map[netip.Prefix]ServiceRoute{lb: {Path: advert.Path{Kind: advert.Service, Weight: 3}, Owners: []string{"shop/web"}}})
	if adv, _ = s.Adverts(); adv[lb].Weight != 3 {
		t.Errorf("weight change not in Adverts: %v", adv[lb])
	}
	s.SetServiceRoutes(nil)
	if adv, _ = s.Adverts(); adv[lb] != (advert.Path{}) {
		t.Errorf("withdrawn Service route still desired: %v", adv[lb])
	}
	// The caller's map is not kept.
	mine := map[netip.Prefix]ServiceRoute{lb: {Path: advert.Path{Kind: advert.Service}, Owners: []string{"a/b"}}}
	s.SetServiceRoutes(mine)
	mine[lb].Owners[0] = "x/y"
	if got := s.ServiceRoutes()[lb].Owners[0]; got != "a/b" {
		t.Errorf("the state kept the caller's owners slice: %s", got)
	}
}
