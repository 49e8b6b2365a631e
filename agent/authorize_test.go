package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/authz"
)

var (
	clusterPods6 = netip.MustParsePrefix("2001:db8:100::/120")
	clusterPods4 = netip.MustParsePrefix("198.51.100.0/28")
)

func addressPools() []v1alpha1.AddressPool {
	mk := func(name string, cidrs, use, ns []string) v1alpha1.AddressPool {
		return v1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.AddressPoolSpec{CIDRs: cidrs, Use: use, Namespaces: ns}}
	}
	return []v1alpha1.AddressPool{
		mk("pods", []string{clusterPods6.String(), clusterPods4.String()}, []string{"pod"}, []string{"prod"}),
		mk("anycast", []string{"2001:db8:ff::/64", "203.0.113.0/28"}, []string{"anycast"}, []string{"prod", "default"}),
		mk("public", []string{"2001:db8:aa::/64"}, []string{"addresses"}, []string{"prod", "default"}),
	}
}

// summariesOnly is testSpec without the legacy shared pool.
func summariesOnly() *v1alpha1.NodeConfigSpec {
	s := testSpec()
	s.Pools = s.Pools[:2]
	return s
}

// authorized builds an env whose agent checks AddressPools and, if cs is
// set, claims cluster-wide.
func authorized(t *testing.T, cs agent.Claims, opts ...envOpt) *env {
	t.Helper()
	set, err := authz.Compile(addressPools())
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]envOpt{withSpec(summariesOnly()), func(c *envConfig) {
		c.Authority = authority{set}
		if cs != nil {
			c.Claims = cs
		}
	}}, opts...)
	e := newEnv(t, opts...)
	if _, err := e.state.SetPodPools([]netip.Prefix{clusterPods6, clusterPods4}); err != nil {
		t.Fatal(err)
	}
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) addIn(ns, id string, extra ...string) (store.Allocation, error) {
	return e.a.Add(context.Background(), id, netnsOf(id), "eth0", podArgs(ns, "pod-"+id, extra...))
}

// Every value a pod asks for must be allowed by an AddressPool: else ADD
// fails naming the pod, the annotation, the value and the reason, and
// nothing is allocated, recorded, claimed or set up.
func TestUnauthorizedValuesAreRefused(t *testing.T) {
	tests := []struct {
		name, ns string
		extra    []string
		want     []string
	}{
		{"anycast outside every pool", "tenant-a", []string{annotations.Anycast + "=8.8.8.8"},
			[]string{"pod tenant-a/pod-c1", annotations.Anycast, "8.8.8.8", "no AddressPool allows namespace tenant-a to use 8.8.8.8 as anycast"}},
		{"anycast of a namespace the pool does not list", "tenant-a", []string{annotations.Anycast + "=2001:db8:ff::1"},
			[]string{annotations.Anycast, "2001:db8:ff::1", "AddressPool anycast allows it to namespaces prod, default"}},
		{"addresses from an anycast pool", "prod", []string{annotations.Addresses + "=2001:db8:ff::1"},
			[]string{annotations.Addresses, "2001:db8:ff::1", "covers it for use anycast only"}},
		{"cidr6 outside every pool", "prod", []string{annotations.CIDR6 + "=2001:db8:999::/120"},
			[]string{annotations.CIDR6, "2001:db8:999::/120", "none covers it"}},
		{"cidr6 of a pool the namespace may not use", "default", []string{annotations.CIDR6 + "=" + clusterPods6.String()},
			[]string{annotations.CIDR6, clusterPods6.String(), "no AddressPool allows namespace default"}},
		{"cidr4 of a pool the namespace may not use", "default", []string{annotations.CIDR4 + "=" + clusterPods4.String()},
			[]string{annotations.CIDR4, clusterPods4.String()}},
		{"the other node's /128 as addresses", "prod", []string{annotations.Addresses + "=fd00:10:2::5"},
			[]string{annotations.Addresses, "fd00:10:2::5", "none covers it"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := newClaimStore()
			e := authorized(t, cs.node("a"))
			_, err := e.addIn(tc.ns, "c1", tc.extra...)
			if err == nil {
				t.Fatal("ADD succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			var ae *agent.AuthError
			if !errors.As(err, &ae) || cniCode(t, err) != types.ErrInvalidNetworkConfig {
				t.Errorf("err %T %v: want an AuthError with code %d", err, err, types.ErrInvalidNetworkConfig)
			}
			e.wantNothingFor("c1")
			e.wantUsed(pool6, 0)
			e.wantUsed(clusterPods6, 0)
			if n := e.dp.countPrefix("Setup"); n != 0 {
				t.Errorf("Setup called %d times", n)
			}
			if h := cs.holders(); len(h) != 0 {
				t.Errorf("claims left: %v", h)
			}
			if _, ok := e.sp.Held()[netip.MustParsePrefix("8.8.8.8/32")]; ok {
				t.Error("8.8.8.8 advertised")
			}
		})
	}
}

// Authorized values work; the node's own summary pools need no pool and no
// claim; `addresses` IPs and pod addresses from a cluster-wide pool are
// claimed, anycast is not; DEL and a failed ADD give the claims back.
func TestAuthorizedValuesAndClaims(t *testing.T) {
	cs := newClaimStore()
	e := authorized(t, cs.node("a"))
	plain := e.mustAdd("c0") // default namespace, summary pools
	if h := cs.holders(); len(h) != 0 {
		t.Errorf("a summary-pool pod made claims: %v", h)
	}
	rec, err := e.addIn("prod", "c1", annotations.CIDR6+"="+clusterPods6.String(), annotations.CIDR4+"="+clusterPods4.String(),
		annotations.Anycast+"=2001:db8:ff::1", annotations.Addresses+"=2001:db8:aa::1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]string{rec.IPs[0]: "a/c1", rec.IPs[1]: "a/c1", mustAddr("2001:db8:aa::1"): "a/c1"}
	if got := cs.holders(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("claims %v, want %v (pod IPs from the cluster pool and the addresses IP; not anycast, not summary IPs like %v)", got, want, plain.IPs)
	}
	// A failing Setup gives the claims back.
	e.dp.set(func(d *fakeDP) { d.setupErr = errors.New("boom") })
	if _, err := e.addIn("prod", "c2", annotations.Addresses+"=2001:db8:aa::2"); err == nil {
		t.Fatal("ADD with a failing Setup succeeded")
	}
	e.dp.set(func(d *fakeDP) { d.setupErr = nil })
	if got := cs.holders(); len(got) != 3 {
		t.Errorf("claims after a failed ADD: %v", got)
	}
	if err := e.a.Del(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	if got := cs.holders(); len(got) != 0 {
		t.Errorf("claims after DEL: %v", got)
	}
	// The API down: an ADD that needs a claim fails cleanly (fail closed),
	// a summary-pool ADD does not care.
	cs.set(func(s *claimStore) { s.down = true })
	if _, err := e.addIn("prod", "c3", annotations.Addresses+"=2001:db8:aa::3"); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("ADD with the API down: %v", err)
	}
	e.wantNothingFor("c3")
	e.mustAdd("c4")
	// DEL of a claimed pod finishes locally with the API down; the claim
	// it could not release is the claim GC's (the node no longer holds
	// the IP), and until then the API refuses the IP to everyone else.
	cs.set(func(s *claimStore) { s.down = false })
	e.mustAdd("c5", annotations.Addresses+"=2001:db8:aa::5")
	cs.set(func(s *claimStore) { s.down = true })
	if err := e.a.Del(context.Background(), "c5"); err != nil {
		t.Errorf("DEL with the API down: %v", err)
	}
	e.a.Wait()
	e.wantNothingFor("c5")
	cs.set(func(s *claimStore) { s.down = false })
	if got := cs.holders(); len(got) != 1 {
		t.Errorf("claims after the DEL with the API down: %v, want c5's left over", got)
	}
	cs.gc("a", e.state.Holds)
	if got := cs.holders(); len(got) != 0 {
		t.Errorf("claims after the claim GC: %v", got)
	}
}

// Two nodes: an `addresses` IP claimed on node a is refused on node b with
// the holder named; deleting the pod frees it for b.
func TestAddressesClaimedAcrossNodes(t *testing.T) {
	cs := newClaimStore()
	a := authorized(t, cs.node("node-a"))
	b := authorized(t, cs.node("node-b"))
	a.mustAdd("ca", annotations.Addresses+"=2001:db8:aa::7")
	_, err := b.addIn("default", "cb", annotations.Addresses+"=2001:db8:aa::7")
	if err == nil {
		t.Fatal("node b took an addresses IP node a holds")
	}
	for _, w := range []string{"2001:db8:aa::7", "default/pod-ca", "node-a", annotations.Addresses, "pod default/pod-cb"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %q", err, w)
		}
	}
	b.wantNothingFor("cb")
	if err := a.a.Del(context.Background(), "ca"); err != nil {
		t.Fatal(err)
	}
	b.mustAdd("cb", annotations.Addresses+"=2001:db8:aa::7")
}

// Two nodes race to give 50 pods each addresses from one cluster-wide pool,
// with caches that lag: 100 distinct IPs, the claims say who holds which.
func TestClusterPoolRace(t *testing.T) {
	cs := newClaimStore()
	cs.lag = 3
	nodes := []*env{authorized(t, cs.node("node-a")), authorized(t, cs.node("node-b"))}
	type res struct {
		node, id string
		ip       netip.Addr
	}
	out := make(chan res, 100)
	var wg sync.WaitGroup
	for n, e := range nodes {
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("n%d-%02d", n, i)
				rec, err := e.addIn("prod", id, annotations.CIDR6+"=2001:db8:100::/121", annotations.IPv4+"=false")
				if err != nil {
					t.Errorf("ADD %s: %v", id, err)
					return
				}
				out <- res{fmt.Sprint(n), id, rec.IPs[0]}
			}()
		}
	}
	wg.Wait()
	close(out)
	seen := map[netip.Addr]string{}
	for r := range out {
		if o, dup := seen[r.ip]; dup {
			t.Errorf("%s and %s both got %s", o, r.id, r.ip)
		}
		seen[r.ip] = r.id
	}
	if len(seen) != 100 {
		t.Fatalf("%d distinct IPs, want 100", len(seen))
	}
	holders := cs.holders()
	if len(holders) != 100 {
		t.Errorf("%d claims, want 100", len(holders))
	}
	for ip, id := range seen {
		if !strings.HasSuffix(holders[ip], "/"+id) {
			t.Errorf("%s held by %q, given to %s", ip, holders[ip], id)
		}
	}
	// What each node advertises is disjoint.
	for _, e := range nodes {
		e.settled()
	}
	a, b := nodes[0].sp.Held(), nodes[1].sp.Held()
	for p := range a {
		if _, both := b[p]; both && clusterPods6.Contains(p.Addr()) {
			t.Errorf("%s advertised by both nodes", p)
		}
	}
}

// At start the node's claims are made to match its records: a lost claim
// is re-created, one another pod took meanwhile quarantines the record, a
// claim no record owns is released.
func TestRestoreRechecksClaims(t *testing.T) {
	cs := newClaimStore()
	nc := cs.node("node-a")
	set, err := authz.Compile(addressPools())
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, withSpec(summariesOnly()), func(c *envConfig) { c.Authority = authority{set}; c.Claims = nc })
	putRecord(t, e.dir, store.Allocation{ContainerID: "lost", State: store.Committed, Pod: podID("lost"),
		IPs: []netip.Addr{mustAddr("fd00:10:1::1")}, Addresses: []netip.Addr{mustAddr("2001:db8:aa::1")}})
	putRecord(t, e.dir, store.Allocation{ContainerID: "stolen", State: store.Committed, Pod: podID("stolen"),
		IPs: []netip.Addr{mustAddr("fd00:10:1::2")}, Addresses: []netip.Addr{mustAddr("2001:db8:aa::2")}})
	ctx := context.Background()
	_ = cs.node("node-b").Claim(ctx, agent.Claim{IP: mustAddr("2001:db8:aa::2"), Use: "addresses", Pod: podID("thief"), ContainerID: "thief"})
	_ = nc.Claim(ctx, agent.Claim{IP: mustAddr("2001:db8:aa::3"), Use: "addresses", Pod: podID("gone"), ContainerID: "gone"})
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]string{mustAddr("2001:db8:aa::1"): "node-a/lost", mustAddr("2001:db8:aa::2"): "node-b/thief"}
	if got := cs.holders(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("claims after restore %v, want %v", got, want)
	}
	_, phase, _ := e.state.Get("stolen")
	if phase != nodestate.Stuck {
		t.Errorf("the record whose address another pod holds is %s, want stuck", phase)
	}
	e.settled()
	if _, ok := e.sp.Held()[netip.MustParsePrefix("2001:db8:aa::2/128")]; ok {
		t.Error("node a advertises an address node b holds")
	}
	at := e.state.Attachments(nodestate.Stuck)
	if len(at) != 1 || !slices.ContainsFunc(at, func(a nodestate.Attachment) bool { return strings.Contains(a.Reason, "node-b") }) {
		t.Errorf("stuck attachments %+v, want stolen with the holder named", at)
	}
}
