package agent_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
)

func TestAddressesExclusive(t *testing.T) {
	e := started(t)
	const ip = "2001:db8:aa::1"
	first := e.mustAdd("c1", annotations.Addresses+"="+ip)
	if !slices.Equal(first.Addresses, []netip.Addr{mustAddr(ip)}) {
		t.Fatalf("Addresses = %v", first.Addresses)
	}

	_, err := e.add("c2", annotations.Addresses+"=2001:db8:aa::2,"+ip)
	if err == nil {
		t.Fatal("second claim of an addresses IP succeeded")
	}
	for _, w := range []string{ip, "c1", annotations.Addresses} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if code := cniCode(t, err); code != types.ErrInvalidNetworkConfig {
		t.Errorf("code = %d", code)
	}
	e.wantNothingFor("c2")
	e.wantUsed(pool6, 1)

	// The IP cannot be used as anycast either.
	_, err = e.add("c3", annotations.Anycast+"="+ip)
	if err == nil || !strings.Contains(err.Error(), ip) || !strings.Contains(err.Error(), "c1") {
		t.Errorf("anycast of c1's addresses IP: err %v", err)
	}
	e.wantNothingFor("c3")

	// A failed ADD must not release the first owner's claim.
	if _, err := e.add("c2", annotations.Addresses+"="+ip); err == nil {
		t.Fatal("claim succeeded after a failed competing ADD")
	}

	if err := e.a.Del(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	rec, err := e.add("c2", annotations.Addresses+"="+ip)
	if err != nil {
		t.Fatalf("claim after the owner was deleted: %v", err)
	}
	if !slices.Equal(rec.Addresses, []netip.Addr{mustAddr(ip)}) {
		t.Errorf("Addresses = %v", rec.Addresses)
	}
	// The same container may retry its ADD with its own claim.
	if _, err := e.add("c2", annotations.Addresses+"="+ip); err != nil {
		t.Errorf("retried ADD of the owner: %v", err)
	}
}

// An addresses claim that fails mid-ADD is released.
func TestAddressesReleasedOnRollback(t *testing.T) {
	e := started(t)
	const ip = "2001:db8:aa::1"
	e.dp.set(func(d *fakeDP) { d.setupErr = errors.New("boom") })
	if _, err := e.add("c1", annotations.Addresses+"="+ip); err == nil {
		t.Fatal("Add succeeded")
	}
	e.dp.set(func(d *fakeDP) { d.setupErr = nil })
	if _, err := e.add("c2", annotations.Addresses+"="+ip); err != nil {
		t.Fatalf("claim after rolled-back ADD: %v", err)
	}
}

// An IP some pod uses as anycast cannot become another pod's exclusive
// addresses IP (nor the other way round).
func TestAnycastNotClaimableAsAddresses(t *testing.T) {
	e := started(t)
	const ip = "2001:db8:ff::1"
	e.mustAdd("c1", annotations.Anycast+"="+ip)
	_, err := e.add("c2", annotations.Addresses+"="+ip)
	if err == nil {
		t.Fatal("addresses claim of c1's anycast IP succeeded")
	}
	for _, w := range []string{ip, "c1"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if code := cniCode(t, err); code != types.ErrInvalidNetworkConfig {
		t.Errorf("code = %d", code)
	}
	e.wantNothingFor("c2")
	if err := e.a.Del(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	e.mustAdd("c2", annotations.Addresses+"="+ip)
}

func TestAnycastShared(t *testing.T) {
	e := started(t, readyOnCommit())
	const ip = "2001:db8:ff::1"
	r1 := e.mustAdd("c1", annotations.Anycast+"="+ip)
	r2 := e.mustAdd("c2", annotations.Anycast+"="+ip+",192.0.2.50")
	routes, _ := e.state.HostRoutes()
	if len(routes) != 2 {
		t.Fatalf("HostRoutes = %+v, want 2 routes", routes)
	}
	v4, v6 := routes[0], routes[1]
	if v6.Prefix.Addr() != mustAddr(ip) || len(v6.Nexthops) != 2 || !slices.Equal(v6.Owners, []string{"c1", "c2"}) {
		t.Errorf("IPv6 anycast route = %+v, want 2 next hops owned by c1, c2", v6)
	}
	wantNH := []dataplane.Nexthop{{Gateway: r1.IPs[0], Dev: r1.HostVeth}, {Gateway: r2.IPs[0], Dev: r2.HostVeth}}
	slices.SortFunc(wantNH, func(a, b dataplane.Nexthop) int { return a.Gateway.Compare(b.Gateway) })
	if !slices.Equal(v6.Nexthops, wantNH) {
		t.Errorf("next hops = %v, want %v", v6.Nexthops, wantNH)
	}
	if v4.Prefix.Addr() != mustAddr("192.0.2.50") || len(v4.Nexthops) != 1 || v4.Nexthops[0].Gateway != r2.IPs[1] {
		t.Errorf("IPv4 anycast route = %+v, want via %s", v4, r2.IPs[1])
	}
	if nhs := e.dp.kernelRoutes()[netip.MustParsePrefix(ip+"/128")]; len(nhs) != 2 {
		t.Errorf("dataplane route for %s has %d next hops", ip, len(nhs))
	}

	if err := e.a.Del(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	if nhs := e.dp.kernelRoutes()[netip.MustParsePrefix(ip+"/128")]; len(nhs) != 1 || nhs[0].Dev != r2.HostVeth {
		t.Errorf("after DEL c1 the kernel routes %s via %v", ip, nhs)
	}
	if err := e.a.Del(context.Background(), "c2"); err != nil {
		t.Fatal(err)
	}
	if routes, _ := e.state.HostRoutes(); len(routes) != 0 {
		t.Errorf("after DEL c2: %+v", routes)
	}
	if rts := e.dp.kernelRoutes(); len(rts) != 0 {
		t.Errorf("dataplane routes left: %v", rts)
	}
}

func TestAnycastAddressesInsidePodPool(t *testing.T) {
	tests := []struct {
		key, ip string
	}{
		{annotations.Anycast, "fd00:10:1::5"},
		{annotations.Anycast, "10.1.1.5"},
		{annotations.Anycast, "2001:db8:100::5"},
		{annotations.Addresses, "fd00:10:1::ffff"},
		{annotations.Addresses, "10.1.1.200"},
		{annotations.Addresses, "2001:db8:100::1"},
	}
	for _, tc := range tests {
		t.Run(tc.key+"="+tc.ip, func(t *testing.T) {
			e := started(t)
			_, err := e.add("c1", tc.key+"="+tc.ip)
			if err == nil {
				t.Fatal("Add succeeded")
			}
			var ae *annotations.Error
			if !errors.As(err, &ae) {
				t.Fatalf("err %v (%T) is not an *annotations.Error", err, err)
			}
			if ae.Key != tc.key || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.ip) {
				t.Errorf("error %q: want it to name %s and %s", err, tc.key, tc.ip)
			}
			if code := cniCode(t, err); code != types.ErrInvalidNetworkConfig {
				t.Errorf("code = %d", code)
			}
			e.wantNothingFor("c1")
			e.wantUsed(pool6, 0)
			e.wantUsed(pool4, 0)
		})
	}
}

// A restored pod address outside every pool cannot be claimed by another
// pod as its `addresses` or anycast IP.
func TestOutOfPoolAddressStaysExclusive(t *testing.T) {
	e := newEnv(t)
	putRecord(t, e.dir, store.Allocation{ContainerID: "x", State: store.Committed, IPs: []netip.Addr{mustAddr("192.0.2.50")}})
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{annotations.Addresses, annotations.Anycast} {
		_, err := e.add("y", key+"=192.0.2.50")
		if err == nil || !strings.Contains(err.Error(), "192.0.2.50") || !strings.Contains(err.Error(), "container x") {
			t.Errorf("%s=192.0.2.50: err %v, want a conflict naming container x", key, err)
		}
		e.wantNothingFor("y")
	}
	if err := e.a.Del(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	e.mustAdd("y", annotations.Addresses+"=192.0.2.50")
}
