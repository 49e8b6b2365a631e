package nodestate

import (
	"net/netip"
	"testing"

	"code.fritzlab.net/fritzlab/flock/advert"
)

// Leave (an uninstall) empties the advertised set for good, with a new
// generation, while the kernel's routes stay for the pods until the
// dataplane goes; a pod or Service route added after it is not advertised.
func TestLeave(t *testing.T) {
	s := newState(t, true)
	lb := netip.MustParsePrefix("2001:db8:5e::1/128")
	s.SetServiceRoutes(map[netip.Prefix]ServiceRoute{lb: {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/web"}}})
	add(t, s, "c1", pod("web"), nil)
	if adv, _ := s.Adverts(); len(adv) == 0 {
		t.Fatal("nothing advertised before Leave")
	}
	kernel, _ := s.KernelRoutes()
	gen := s.Generation()
	if g := s.Leave(); g <= gen {
		t.Errorf("Leave returned generation %d, want past %d", g, gen)
	}
	if adv, g := s.Adverts(); len(adv) != 0 || g != s.Generation() {
		t.Errorf("Adverts after Leave = %v (generation %d)", adv, g)
	}
	if kr, _ := s.KernelRoutes(); len(kr) != len(kernel) {
		t.Errorf("KernelRoutes after Leave = %v, want %v: the pods keep forwarding until the dataplane goes", kr, kernel)
	}
	add(t, s, "c2", pod("api"), nil)
	s.SetServiceRoutes(map[netip.Prefix]ServiceRoute{netip.MustParsePrefix("2001:db8:5e::2/128"): {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/api"}}})
	if adv, _ := s.Adverts(); len(adv) != 0 {
		t.Errorf("advertised after Leave: %v", adv)
	}
}
