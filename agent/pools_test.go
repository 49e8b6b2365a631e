package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
)

// podsOverAnycast is a pod pool an operator created over an anycast range
// in use (issue 18, defect 4).
var podsOverAnycast = netip.MustParsePrefix("2001:db8:ff::/124")

// A pod pool created over an anycast IP in use: IPAM never hands that IP
// to another pod, its route stays via the anycast pod (through another
// pod's ADD and DEL), the range is full when every other address is taken,
// and a new claim inside the pod pool is refused.
func TestPodPoolOverInUseAnycast(t *testing.T) {
	pools := append(addressPools(), v1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: "over"},
		Spec: v1alpha1.AddressPoolSpec{CIDRs: []string{podsOverAnycast.String()}, Use: []string{"pod"}, Namespaces: []string{"default"}}})
	set, err := authz.Compile(pools)
	if err != nil {
		t.Fatal(err)
	}
	e := started(t, withSpec(summariesOnly()), readyOnCommit(), func(c *envConfig) { c.Authority = authority{set} })
	anycast := mustAddr("2001:db8:ff::1")
	route := netip.PrefixFrom(anycast, 128)
	a := e.mustAdd("a", annotations.Anycast+"="+anycast.String())
	want := []dataplane.Nexthop{{Gateway: a.IPs[0], Dev: a.HostVeth}}
	e.settled()
	if got := e.dp.kernelRoutes()[route]; !slices.Equal(got, want) {
		t.Fatalf("anycast route %v, want %v", got, want)
	}

	if _, err := e.state.SetPodPools([]netip.Prefix{podsOverAnycast}); err != nil {
		t.Fatal(err)
	}
	seq := []string{annotations.CIDR6 + "=" + podsOverAnycast.String(), annotations.IPAlgo + "=sequential", annotations.IPv4 + "=false"}
	b := e.mustAdd("b", seq...)
	if slices.Contains(b.IPs, anycast) {
		t.Fatalf("b got %v: the anycast IP pod a holds", b.IPs)
	}
	e.settled()
	if got := e.dp.kernelRoutes()[route]; !slices.Equal(got, want) {
		t.Errorf("with b added: anycast route %v, want %v", got, want)
	}
	if err := e.a.Del(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	e.a.Wait()
	e.settled()
	if got := e.dp.kernelRoutes()[route]; !slices.Equal(got, want) {
		t.Errorf("with b deleted: anycast route %v, want %v", got, want)
	}

	n := 0
	for i := range 14 {
		rec, err := e.add(fmt.Sprintf("p%d", i), seq...)
		if err != nil {
			if !errors.Is(err, ipam.ErrExhausted) || !strings.Contains(err.Error(), "14 of 14 usable addresses in use, 1 of them as anycast") {
				t.Fatalf("ADD %d: %v; want the range full, counting the anycast IP", i, err)
			}
			break
		}
		if slices.Contains(rec.IPs, anycast) {
			t.Fatalf("p%d got the anycast IP pod a holds", i)
		}
		n++
	}
	if n != 13 {
		t.Errorf("%d pods got an address of the /124, want 13 (14 usable, 1 in use as anycast)", n)
	}
	_, err = e.add("c", annotations.Anycast+"="+anycast.String())
	if err == nil || !strings.Contains(err.Error(), "inside pod pool "+podsOverAnycast.String()) {
		t.Errorf("a new claim on %s inside the pod pool: %v, want it refused", anycast, err)
	}
	e.wantNothingFor("c")
}

// A record whose anycast IP a pool came to cover is restored as it was,
// routed, and IPAM never hands its anycast IP out (nothing in use moves).
func TestRestoreKeepsAnycastAPoolCovers(t *testing.T) {
	e := newEnv(t, readyOnCommit())
	anycast := mustAddr("10.1.1.77") // inside the IPv4 summary
	putRecord(t, e.dir, store.Allocation{ContainerID: "x", State: store.Committed,
		IPs: []netip.Addr{mustAddr("fd00:10:1::1"), mustAddr("10.1.1.2")}, Anycast: []netip.Addr{anycast}})
	e.dp.addVeth(dataplane.HostVethName("x"))
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	if _, ph, ok := e.state.Get("x"); !ok || ph != nodestate.Committed {
		t.Fatalf("x is %v (present %v), want committed", ph, ok)
	}
	e.settled()
	route := netip.PrefixFrom(anycast, 32)
	if got := e.dp.kernelRoutes()[route]; len(got) != 1 || got[0].Gateway != mustAddr("10.1.1.2") {
		t.Errorf("anycast route %v, want via x's 10.1.1.2", got)
	}
	for i := range 16 {
		rec, err := e.add(fmt.Sprintf("p%d", i), annotations.CIDR4+"=10.1.1.64/28", annotations.IPAlgo+"=sequential", annotations.IPv6+"=false")
		if err != nil {
			if i != 15 || !errors.Is(err, ipam.ErrExhausted) {
				t.Fatalf("ADD %d: %v (15 of the /28's 16 addresses are free)", i, err)
			}
			continue
		}
		if slices.Contains(rec.IPs, anycast) {
			t.Fatalf("p%d got %s, x's anycast IP", i, anycast)
		}
	}
}
