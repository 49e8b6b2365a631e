package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

func TestNewRejectsBadSpec(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*v1alpha1.NodeConfigSpec)
		want   string
	}{
		{"asn", func(s *v1alpha1.NodeConfigSpec) { s.ASN = 0 }, "spec.asn"},
		{"pool", func(s *v1alpha1.NodeConfigSpec) { s.Pools[1].CIDR = "10.1.1.1/24" }, "spec.pools[1].cidr"},
		{"algo", func(s *v1alpha1.NodeConfigSpec) { s.Defaults.IPAlgo = "bogus" }, "spec.defaults.ipAlgo"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec()
			tc.modify(s)
			st, err := store.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			// The pools are the state's, the rest the agent's to check.
			state, err := nodestate.New(s, false)
			if err == nil {
				_, err = agent.New(agent.Config{Spec: s, State: state, Store: st, Dataplane: newFakeDP(), Source: podmeta.Standalone{}, Log: discard})
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: err %v, want one naming %s", err, tc.want)
			}
		})
	}
}

func TestAddDualStack(t *testing.T) {
	e := started(t)
	rec, err := e.a.Add(context.Background(), "c1", "/var/run/netns/cni-c1", "eth0",
		podArgs("prod", "web-0", "K8S_POD_UID=uid-1", "FLOCK_APP=web"))
	if err != nil {
		t.Fatalf("Add: %v", err)
	}
	if len(rec.IPs) != 2 {
		t.Fatalf("IPs = %v, want one IPv6 and one IPv4", rec.IPs)
	}
	if !rec.IPs[0].Is6() || !pool6.Contains(rec.IPs[0]) {
		t.Errorf("IPs[0] = %s, want an IPv6 address from %s", rec.IPs[0], pool6)
	}
	if !rec.IPs[1].Is4() || !pool4.Contains(rec.IPs[1]) {
		t.Errorf("IPs[1] = %s, want an IPv4 address from %s", rec.IPs[1], pool4)
	}
	if rec.State != store.Committed {
		t.Errorf("State = %q, want committed", rec.State)
	}
	if rec.ContainerID != "c1" || rec.IfName != "eth0" || rec.Netns != "/var/run/netns/cni-c1" {
		t.Errorf("attachment = %s %s %s", rec.ContainerID, rec.IfName, rec.Netns)
	}
	if rec.HostVeth != dataplane.HostVethName("c1") {
		t.Errorf("HostVeth = %q, want %q", rec.HostVeth, dataplane.HostVethName("c1"))
	}
	if rec.Pod != (podmeta.ID{Namespace: "prod", Name: "web-0", UID: "uid-1"}) {
		t.Errorf("Pod = %+v", rec.Pod)
	}
	// The agent picks the MACs (the pending record is whole before the
	// kernel is touched) and the veth gets exactly those.
	e.dp.mu.Lock()
	given := e.dp.macs[rec.HostVeth]
	e.dp.mu.Unlock()
	if given != [2]string{rec.HostMAC, rec.PodMAC} || rec.HostMAC == rec.PodMAC {
		t.Errorf("MACs = %s %s, Setup was handed %v", rec.HostMAC, rec.PodMAC, given)
	}
	for _, s := range []string{rec.HostMAC, rec.PodMAC} {
		if m, err := net.ParseMAC(s); err != nil || len(m) != 6 || m[0]&0x03 != 0x02 {
			t.Errorf("MAC %q (%v): want a locally administered unicast MAC", s, err)
		}
	}
	if rec.Created.IsZero() {
		t.Error("Created not set")
	}
	e.wantUsed(pool6, 1)
	e.wantUsed(pool4, 1)
	e.wantUsed(shared6, 0)

	recs := e.records()
	if len(recs) != 1 || recs[0].ContainerID != "c1" || recs[0].State != store.Committed ||
		!slices.Equal(recs[0].IPs, rec.IPs) || recs[0].HostMAC != rec.HostMAC || !recs[0].Created.Equal(rec.Created) {
		t.Errorf("store = %+v, want the committed record %+v", recs, rec)
	}
	if got := e.a.Allocations(); len(got) != 1 || got[0].ContainerID != "c1" {
		t.Errorf("Allocations = %+v", got)
	}
	if n := e.dp.count("Setup c1"); n != 1 {
		t.Errorf("Setup called %d times", n)
	}
}

func TestAddFamilies(t *testing.T) {
	tests := []struct {
		name       string
		defaultsV4 bool
		extra      []string
		want       []int // families in order
	}{
		{"node default dual", true, nil, []int{6, 4}},
		{"node default v6 only", false, nil, []int{6}},
		{"annotation turns v4 on", false, []string{annotations.IPv4 + "=true"}, []int{6, 4}},
		{"annotation turns v4 off", true, []string{annotations.IPv4 + "=false"}, []int{6}},
		{"v4 only", true, []string{annotations.IPv6 + "=false"}, []int{4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec()
			s.Defaults.IPv4 = tc.defaultsV4
			e := started(t, withSpec(s))
			rec := e.mustAdd("c1", tc.extra...)
			var got []int
			for _, ip := range rec.IPs {
				if ip.Is4() {
					got = append(got, 4)
				} else {
					got = append(got, 6)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("IPs %v: families %v, want %v", rec.IPs, got, tc.want)
			}
		})
	}
}

func TestAddIdempotent(t *testing.T) {
	e := started(t)
	first := e.mustAdd("c1")
	for i := 0; i < 3; i++ {
		again, err := e.add("c1")
		if err != nil {
			t.Fatalf("repeated Add: %v", err)
		}
		if !slices.Equal(again.IPs, first.IPs) || again.HostVeth != first.HostVeth || !again.Created.Equal(first.Created) {
			t.Errorf("repeated Add = %+v, want %+v", again, first)
		}
	}
	if n := e.dp.count("Setup c1"); n != 1 {
		t.Errorf("Setup called %d times, want 1", n)
	}
	e.wantUsed(pool6, 1)
	e.wantUsed(pool4, 1)

	// A second interface for the same container is refused and changes
	// nothing.
	_, err := e.a.Add(context.Background(), "c1", netnsOf("c1"), "net1", podArgs("default", "pod-c1"))
	if err == nil {
		t.Fatal("Add with another ifName succeeded")
	}
	if code := cniCode(t, err); code != types.ErrInvalidNetworkConfig {
		t.Errorf("code = %d, want %d", code, types.ErrInvalidNetworkConfig)
	}
	for _, w := range []string{"eth0", "net1", "c1"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if n := e.dp.countPrefix("Teardown"); n != 0 {
		t.Errorf("refused ADD tore down the existing pod (%d Teardown calls)", n)
	}
	if got := e.a.Allocations(); len(got) != 1 || !slices.Equal(got[0].IPs, first.IPs) {
		t.Errorf("Allocations after refused ADD = %+v", got)
	}
	e.wantUsed(pool6, 1)
}

// Concurrent retries of one ADD program the dataplane once.
func TestAddConcurrentSameContainer(t *testing.T) {
	e := started(t)
	const n = 10
	var wg sync.WaitGroup
	results := make([]store.Allocation, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = e.add("same")
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Add #%d: %v", i, errs[i])
		}
		if !slices.Equal(results[i].IPs, results[0].IPs) {
			t.Errorf("Add #%d IPs %v, want %v", i, results[i].IPs, results[0].IPs)
		}
	}
	if c := e.dp.count("Setup same"); c != 1 {
		t.Errorf("Setup called %d times", c)
	}
	e.wantUsed(pool6, 1)
}

func TestAddValidation(t *testing.T) {
	e := started(t)
	tests := []struct {
		name              string
		id, netns, ifName string
		args              string
		code              uint
		want              string
	}{
		{"empty container ID", "", "/ns", "eth0", podArgs("default", "p"), types.ErrUnknownContainer, "CNI_CONTAINERID"},
		{"container ID with slash", "../etc", "/ns", "eth0", podArgs("default", "p"), types.ErrInvalidEnvironmentVariables, "../etc"},
		{"empty netns", "c1", "", "eth0", podArgs("default", "p"), types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"empty ifname", "c1", "/ns", "", podArgs("default", "p"), types.ErrInvalidEnvironmentVariables, "CNI_IFNAME"},
		{"long ifname", "c1", "/ns", "eth0123456789abc", podArgs("default", "p"), types.ErrInvalidEnvironmentVariables, "eth0123456789abc"},
		{"malformed CNI_ARGS", "c1", "/ns", "eth0", "K8S_POD_NAMESPACE=default;garbage", types.ErrInvalidEnvironmentVariables, "garbage"},
		{"missing pod name", "c1", "/ns", "eth0", "K8S_POD_NAMESPACE=default", types.ErrInvalidEnvironmentVariables, podmeta.ArgName},
		{"missing namespace", "c1", "/ns", "eth0", "K8S_POD_NAME=p", types.ErrInvalidEnvironmentVariables, podmeta.ArgNamespace},
		{"bad annotation", "c1", "/ns", "eth0", podArgs("default", "p", annotations.IPv4+"=yes"), types.ErrInvalidNetworkConfig, annotations.IPv4},
		{"unknown annotation", "c1", "/ns", "eth0", podArgs("default", "p", "flock.fritzlab.net/ipv44=true"), types.ErrInvalidNetworkConfig, "flock.fritzlab.net/ipv44"},
		{"cidr6 outside every pool", "c1", "/ns", "eth0", podArgs("default", "p", annotations.CIDR6+"=2001:db8:999::/120"), types.ErrInvalidNetworkConfig, "2001:db8:999::/120"},
		{"cidr6 pool forbidden to namespace", "c1", "/ns", "eth0", podArgs("default", "p", annotations.CIDR6+"="+shared6.String()), types.ErrInvalidNetworkConfig, `"default"`},
		{"embed too wide for range", "c1", "/ns", "eth0", podArgs("prod", "p", annotations.CIDR6+"="+shared6.String(), annotations.IPAlgo+"=embed"), types.ErrInvalidNetworkConfig, "embed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.a.Add(context.Background(), tc.id, tc.netns, tc.ifName, tc.args)
			if err == nil {
				t.Fatal("Add succeeded")
			}
			if code := cniCode(t, err); code != tc.code {
				t.Errorf("code = %d, want %d (err %v)", code, tc.code, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if n := e.dp.countPrefix("Setup"); n != 0 {
				t.Errorf("Setup called %d times", n)
			}
			if ids := e.recordIDs(); len(ids) != 0 {
				t.Errorf("store holds %v", ids)
			}
			e.wantUsed(pool6, 0)
			e.wantUsed(pool4, 0)
			e.wantUsed(shared6, 0)
		})
	}
}

func TestAddSharedPool(t *testing.T) {
	e := started(t)
	rec, err := e.a.Add(context.Background(), "c1", "/ns", "eth0", podArgs("prod", "p", annotations.CIDR6+"="+shared6.String()))
	if err != nil {
		t.Fatal(err)
	}
	if !shared6.Contains(rec.IPs[0]) || !pool4.Contains(rec.IPs[1]) {
		t.Errorf("IPs = %v, want IPv6 from %s and IPv4 from %s", rec.IPs, shared6, pool4)
	}
	e.wantUsed(shared6, 1)
	e.wantUsed(pool6, 0)
}

func TestAddRollback(t *testing.T) {
	tests := []struct {
		name string
		// prepare runs before the failing ADD and returns the container ID
		// and CNI_ARGS extras to use.
		prepare func(e *env)
		extra   []string
		// touched: whether the dataplane was touched (Setup ran).
		touched bool
		errIs   error
		code    uint
	}{
		{
			name:    "setup fails",
			prepare: func(e *env) { e.dp.set(func(d *fakeDP) { d.setupErr = errors.New("veth: file exists") }) },
			touched: true,
			code:    types.ErrInternal,
		},
		{
			name: "setup fails with netns error",
			prepare: func(e *env) {
				e.dp.set(func(d *fakeDP) { d.setupErr = &dataplane.NetnsError{Path: "/ns", Err: os.ErrNotExist} })
			},
			touched: true,
			code:    types.ErrInvalidNetNS,
		},
		{
			name:    "committed Put fails",
			prepare: func(e *env) { e.st.failNthPut(2) },
			touched: true,
			errIs:   errPut,
			code:    types.ErrInternal,
		},
		{
			name:    "commit fails once the record is renamed",
			prepare: func(e *env) { e.st.failAfterCommit.Store(true) },
			touched: true,
			errIs:   errPut,
			code:    types.ErrInternal,
		},
		{
			name:    "pending Put fails",
			prepare: func(e *env) { e.st.failNthPut(1) },
			touched: false,
			errIs:   errPut,
			code:    types.ErrInternal,
		},
		{
			name:    "IPv4 forbidden after IPv6 allocated",
			extra:   []string{annotations.CIDR4 + "=10.99.0.0/28"},
			touched: false,
			errIs:   ipam.ErrForbidden,
			code:    types.ErrInvalidNetworkConfig,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec()
			s.Pools = append(s.Pools, v1alpha1.Pool{CIDR: "10.99.0.0/28", Shared: true, Namespaces: []string{"prod"}})
			e := started(t, withSpec(s))
			if tc.prepare != nil {
				tc.prepare(e)
			}
			_, err := e.add("c1", tc.extra...)
			if err == nil {
				t.Fatal("Add succeeded")
			}
			if tc.errIs != nil && !errors.Is(err, tc.errIs) {
				t.Errorf("err = %v, want %v", err, tc.errIs)
			}
			if code := cniCode(t, err); code != tc.code {
				t.Errorf("code = %d, want %d (err %v)", code, tc.code, err)
			}
			e.wantNothingFor("c1")
			e.wantUsed(pool6, 0)
			e.wantUsed(pool4, 0)
			if got := e.dp.count("Setup c1") > 0; got != tc.touched {
				t.Errorf("Setup called: %v, want %v", got, tc.touched)
			}
			if tc.touched && e.dp.count(td("c1")) == 0 {
				t.Error("dataplane was touched but not torn down")
			}
			if e.dp.hasVeth(dataplane.HostVethName("c1")) {
				t.Error("veth left behind")
			}

			// Everything is free again: the same container can be added
			// once the fault is gone.
			e.dp.set(func(d *fakeDP) { d.setupErr = nil })
			e.st.failNthPut(0)
			e.st.failAfterCommit.Store(false)
			if _, err := e.add("c1"); err != nil {
				t.Fatalf("Add after rollback: %v", err)
			}
			e.wantUsed(pool6, 1)
		})
	}
}

// Exhausting a tiny IPv4 pool: the IPv6 address already taken for the
// failing ADD goes back.
func TestAddRollbackIPv4Exhausted(t *testing.T) {
	s := testSpec()
	s.Pools[1].CIDR = "10.1.1.0/30" // two usable addresses
	e := started(t, withSpec(s))
	first := e.mustAdd("c1")
	e.mustAdd("c2")
	e.wantUsed(pool6, 2)

	_, err := e.add("c3")
	if !errors.Is(err, ipam.ErrExhausted) {
		t.Fatalf("err = %v, want ErrExhausted", err)
	}
	if code := cniCode(t, err); code != types.ErrTryAgainLater {
		t.Errorf("code = %d, want %d", code, types.ErrTryAgainLater)
	}
	if !strings.Contains(err.Error(), "10.1.1.0/30") {
		t.Errorf("error %q does not name the pool", err)
	}
	e.wantNothingFor("c3")
	e.wantUsed(pool6, 2)
	e.wantUsed(netip.MustParsePrefix("10.1.1.0/30"), 2)
	if n := e.dp.count("Setup c3"); n != 0 {
		t.Errorf("Setup called for c3")
	}

	// Freeing one IPv4 address lets c3 in.
	if err := e.a.Del(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	rec := e.mustAdd("c3")
	if rec.IPs[1] != first.IPs[1] {
		t.Errorf("c3 got %s, want the freed %s", rec.IPs[1], first.IPs[1])
	}
	e.wantUsed(pool6, 2)
}

// The pending record is on disk before the dataplane is touched.
func TestPendingRecordBeforeSetup(t *testing.T) {
	e := started(t)
	var (
		checked bool
		inSetup []store.Allocation
		err     error
	)
	e.dp.onSetup = func(p dataplane.Pod) {
		checked = true
		// Read the directory with a separate Store, as a restarted agent
		// would.
		other, oerr := store.Open(e.dir)
		if oerr != nil {
			err = oerr
			return
		}
		defer other.Close()
		inSetup, err = other.Load()
	}
	rec := e.mustAdd("c1", annotations.Anycast+"=2001:db8:ff::1", annotations.Addresses+"=2001:db8:aa::1")
	if !checked {
		t.Fatal("Setup hook did not run")
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(inSetup) != 1 {
		t.Fatalf("during Setup the store held %d records, want 1", len(inSetup))
	}
	p := inSetup[0]
	if p.ContainerID != "c1" || p.State != store.Pending || !slices.Equal(p.IPs, rec.IPs) ||
		p.HostVeth != dataplane.HostVethName("c1") ||
		!slices.Equal(p.Anycast, rec.Anycast) || !slices.Equal(p.Addresses, rec.Addresses) {
		t.Errorf("pending record %+v does not match allocation %+v", p, rec)
	}
	if recs := e.records(); len(recs) != 1 || recs[0].State != store.Committed {
		t.Errorf("after ADD the store holds %+v, want one committed record", recs)
	}
}

// The BeforeCommit hook runs after Setup, while the record is still pending.
func TestBeforeCommitHook(t *testing.T) {
	var state store.State
	var setups int
	var e *env
	e = started(t, func(c *envConfig) {
		c.Hooks = agent.Hooks{BeforeCommit: func(id string) {
			recs, _ := e.st.Load()
			if len(recs) == 1 {
				state = recs[0].State
			}
			setups = e.dp.count("Setup " + id)
		}}
	})
	if _, err := e.a.Add(context.Background(), "c1", "/ns", "eth0", podArgs("default", "p")); err != nil {
		t.Fatal(err)
	}
	if state != store.Pending || setups != 1 {
		t.Errorf("at BeforeCommit: state %q, Setup calls %d; want pending and 1", state, setups)
	}
}

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

func TestDel(t *testing.T) {
	ctx := context.Background()
	t.Run("unknown container removes leftover veth", func(t *testing.T) {
		e := started(t)
		veth := dataplane.HostVethName("ghost")
		e.dp.addVeth(veth)
		if err := e.a.Del(ctx, "ghost"); err != nil {
			t.Fatalf("Del: %v", err)
		}
		if e.dp.count(td("ghost")) != 1 {
			t.Error("Teardown not called")
		}
		if e.dp.hasVeth(veth) {
			t.Error("leftover veth not removed")
		}
		if err := e.a.Del(ctx, "ghost"); err != nil {
			t.Errorf("second Del: %v", err)
		}
	})
	t.Run("releases everything, twice is fine", func(t *testing.T) {
		e := started(t)
		rec := e.mustAdd("c1", annotations.Addresses+"=2001:db8:aa::1")
		e.mustAdd("c2")
		for i := 0; i < 2; i++ {
			if err := e.a.Del(ctx, "c1"); err != nil {
				t.Fatalf("Del #%d: %v", i+1, err)
			}
		}
		e.wantNothingFor("c1")
		if ids := e.allocIDs(); !slices.Equal(ids, []string{"c2"}) {
			t.Errorf("allocations = %v, want [c2]", ids)
		}
		if ids := e.recordIDs(); !slices.Equal(ids, []string{"c2"}) {
			t.Errorf("records = %v, want [c2]", ids)
		}
		e.wantUsed(pool6, 1)
		e.wantUsed(pool4, 1)
		if e.dp.hasVeth(rec.HostVeth) {
			t.Error("veth not removed")
		}
		// The released IPs and the claim are usable again: with a
		// sequential-free check, claim the same addresses IP.
		e.mustAdd("c3", annotations.Addresses+"=2001:db8:aa::1")
	})
	t.Run("retire failure keeps the allocation for a retry", func(t *testing.T) {
		e := started(t)
		e.mustAdd("c1")
		boom := errors.New("netlink busy")
		e.dp.set(func(d *fakeDP) {
			d.fault = func(op string) error {
				if op == "retire" {
					return boom
				}
				return nil
			}
		})
		if err := e.a.Del(ctx, "c1"); !errors.Is(err, boom) {
			t.Fatalf("Del err = %v, want %v", err, boom)
		}
		e.a.Wait()
		// Still held (the retry finds it), but the record went first: a
		// restart never finds a committed record whose veth is down.
		if ids := e.allocIDs(); !slices.Equal(ids, []string{"c1"}) {
			t.Errorf("allocations = %v", ids)
		}
		if ids := e.recordIDs(); len(ids) != 0 {
			t.Errorf("records = %v, want none", ids)
		}
		e.wantUsed(pool6, 1)
		e.dp.set(func(d *fakeDP) { d.fault = nil })
		if err := e.a.Del(ctx, "c1"); err != nil {
			t.Fatal(err)
		}
		e.a.Wait()
		e.wantNothingFor("c1")
		e.wantUsed(pool6, 0)
	})
	// The veth is unregistered after DEL returned: a removal that keeps
	// failing leaves the attachment stuck, its IPs held (its record is
	// gone) until the next DEL finishes the job.
	t.Run("teardown failure after DEL keeps the IPs until a retry", func(t *testing.T) {
		e := started(t)
		rec := e.mustAdd("c1")
		boom := errors.New("netlink busy")
		e.dp.set(func(d *fakeDP) { d.teardownErr = boom })
		if err := e.a.Del(ctx, "c1"); err != nil {
			t.Fatalf("Del: %v", err)
		}
		e.a.Wait()
		if n := e.dp.count("Teardown " + rec.HostVeth); n != 5 {
			t.Errorf("%d removal attempts, want 5", n)
		}
		if _, phase, ok := e.a.State().Get("c1"); !ok || phase != nodestate.Stuck {
			t.Errorf("c1: phase %v known %v, want stuck", phase, ok)
		}
		if ids := e.recordIDs(); len(ids) != 0 {
			t.Errorf("records = %v, want none", ids)
		}
		e.wantUsed(pool6, 1)
		if _, ok := e.sp.Held()[netip.PrefixFrom(rec.IPs[0], rec.IPs[0].BitLen())]; ok {
			t.Error("stuck attachment still advertised")
		}
		e.dp.set(func(d *fakeDP) { d.teardownErr = nil })
		if err := e.a.Del(ctx, "c1"); err != nil {
			t.Fatal(err)
		}
		e.a.Wait()
		e.wantNothingFor("c1")
		e.wantUsed(pool6, 0)
	})
	// A pod asking for an address a just-deleted pod held is not refused
	// while that pod's veth is still being unregistered.
	t.Run("address of a pod whose veth is still going", func(t *testing.T) {
		e := started(t)
		e.mustAdd("c1", annotations.Addresses+"=2001:db8:aa::1")
		gate := make(chan struct{})
		e.dp.set(func(d *fakeDP) { d.onTeardown = func(string) { <-gate } })
		if err := e.a.Del(ctx, "c1"); err != nil {
			t.Fatal(err)
		}
		go func() { time.Sleep(50 * time.Millisecond); close(gate) }()
		e.mustAdd("c2", annotations.Addresses+"=2001:db8:aa::1")
		e.wantNothingFor("c1")
	})
	t.Run("invalid container ID", func(t *testing.T) {
		e := started(t)
		err := e.a.Del(ctx, "a/b")
		if err == nil {
			t.Fatal("Del accepted a/b")
		}
		if code := cniCode(t, err); code != types.ErrInvalidEnvironmentVariables {
			t.Errorf("code = %d", code)
		}
		if e.dp.countPrefix("Teardown") != 0 {
			t.Error("Teardown called for an invalid ID")
		}
	})
}

func TestCheck(t *testing.T) {
	ctx := context.Background()
	e := started(t)
	rec := e.mustAdd("c1", annotations.Addresses+"=2001:db8:aa::1", annotations.Anycast+"=2001:db8:ff::1")
	v6, v4 := rec.IPs[0], rec.IPs[1]
	addr := mustAddr("2001:db8:aa::1")
	boom := errors.New("route to pod missing")

	tests := []struct {
		name     string
		id       string
		ifName   string
		prev     []netip.Addr
		checkErr error
		wantErr  bool
		code     uint
		errIs    error
		want     string
	}{
		{name: "ok without prev", id: "c1", ifName: "eth0"},
		{name: "ok without ifName", id: "c1"},
		{name: "ok with prev in result order", id: "c1", ifName: "eth0", prev: []netip.Addr{v6, v4, addr}},
		{name: "ok with prev in other order", id: "c1", ifName: "eth0", prev: []netip.Addr{addr, v4, v6}},
		{name: "unknown container", id: "nope", ifName: "eth0", wantErr: true, code: types.ErrUnknownContainer, want: "nope"},
		{name: "wrong ifName", id: "c1", ifName: "net1", wantErr: true, code: types.ErrInvalidNetworkConfig, want: "net1"},
		{name: "prev missing an IP", id: "c1", ifName: "eth0", prev: []netip.Addr{v6, v4}, wantErr: true, code: types.ErrInternal, want: v6.String()},
		{name: "prev other IP", id: "c1", ifName: "eth0", prev: []netip.Addr{v6, otherV4(v4), addr}, wantErr: true, want: otherV4(v4).String()},
		{name: "prev empty", id: "c1", ifName: "eth0", prev: []netip.Addr{}, wantErr: true},
		{name: "dataplane check fails", id: "c1", ifName: "eth0", checkErr: boom, wantErr: true, errIs: boom, code: types.ErrInternal, want: boom.Error()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.dp.set(func(d *fakeDP) { d.checkErr = tc.checkErr; d.checked = nil })
			err := e.a.Check(ctx, tc.id, tc.ifName, tc.prev)
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				e.dp.set(func(d *fakeDP) {
					if len(d.checked) != 1 {
						t.Fatalf("dataplane Check called %d times", len(d.checked))
					}
					p := d.checked[0]
					if p.ContainerID != "c1" || p.IfName != "eth0" || p.Netns != rec.Netns || !slices.Equal(p.IPs, rec.IPs) ||
						!slices.Equal(p.Addresses, rec.Addresses) || !slices.Equal(p.Anycast, rec.Anycast) {
						t.Errorf("dataplane checked %+v, want the record %+v", p, rec)
					}
				})
				return
			}
			if err == nil {
				t.Fatal("Check succeeded")
			}
			if tc.errIs != nil && !errors.Is(err, tc.errIs) {
				t.Errorf("err %v is not %v", err, tc.errIs)
			}
			if tc.code != 0 {
				if code := cniCode(t, err); code != tc.code {
					t.Errorf("code = %d, want %d (err %v)", code, tc.code, err)
				}
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestGC(t *testing.T) {
	ctx := context.Background()
	e := started(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		e.mustAdd(id)
	}
	valid := []agent.Attachment{
		{ContainerID: "a", IfName: "eth0"},
		{ContainerID: "c", IfName: "eth0"},
		{ContainerID: "d", IfName: "net1"}, // other interface: d's eth0 is stale
		{ContainerID: "zzz", IfName: "eth0"},
	}
	if err := e.a.GC(ctx, valid); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if ids := e.allocIDs(); !slices.Equal(ids, []string{"a", "c"}) {
		t.Errorf("allocations = %v, want [a c]", ids)
	}
	if ids := e.recordIDs(); !slices.Equal(ids, []string{"a", "c"}) {
		t.Errorf("records = %v, want [a c]", ids)
	}
	for _, id := range []string{"b", "d"} {
		if e.dp.count(td(id)) != 1 {
			t.Errorf("%s not torn down", id)
		}
	}
	for _, id := range []string{"a", "c"} {
		if e.dp.count(td(id)) != 0 {
			t.Errorf("%s torn down", id)
		}
	}
	e.wantUsed(pool6, 2)
	e.wantUsed(pool4, 2)

	// Teardown errors are reported, the rest still runs.
	e.dp.set(func(d *fakeDP) { d.teardownErr = errors.New("busy") })
	if err := e.a.GC(ctx, nil); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Errorf("GC with failing teardown: err %v", err)
	}
	e.dp.set(func(d *fakeDP) { d.teardownErr = nil })
	if err := e.a.GC(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if ids := e.allocIDs(); len(ids) != 0 {
		t.Errorf("allocations after GC(nil) = %v", ids)
	}
	e.wantUsed(pool6, 0)
}

// putRecord writes a record straight into the store directory.
func putRecord(t *testing.T, dir string, r store.Allocation) {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if r.HostVeth == "" {
		r.HostVeth = dataplane.HostVethName(r.ContainerID)
	}
	if r.IfName == "" {
		r.IfName = "eth0"
	}
	if r.Netns == "" {
		r.Netns = netnsOf(r.ContainerID)
	}
	r.Created = time.Now().UTC()
	if err := st.Put(r); err != nil {
		t.Fatal(err)
	}
}

func TestStartRecovery(t *testing.T) {
	s := testSpec()
	s.Defaults.IPAlgo = "sequential"
	e := newEnv(t, withSpec(s), readyOnCommit())
	keepV6, keepV4 := mustAddr("fd00:10:1::1"), mustAddr("10.1.1.1")
	putRecord(t, e.dir, store.Allocation{
		ContainerID: "keep", State: store.Committed, Pod: podmeta.ID{Namespace: "default", Name: "keep"},
		IPs: []netip.Addr{keepV6, keepV4}, Addresses: []netip.Addr{mustAddr("2001:db8:aa::1")},
		Anycast: []netip.Addr{mustAddr("2001:db8:ff::1")},
	})
	putRecord(t, e.dir, store.Allocation{
		ContainerID: "half", State: store.Pending, Pod: podmeta.ID{Namespace: "default", Name: "half"},
		IPs: []netip.Addr{mustAddr("fd00:10:1::2"), mustAddr("10.1.1.2")},
	})
	orphan := "flockdeadbeef"
	e.dp.addVeth(dataplane.HostVethName("keep"))
	e.dp.addVeth(dataplane.HostVethName("half"))
	e.dp.addVeth(orphan)
	stale := netip.MustParsePrefix("2001:db8:ee::1/128")
	e.dp.set(func(d *fakeDP) {
		d.routes[stale] = []dataplane.Nexthop{{Gateway: keepV6, Dev: dataplane.HostVethName("keep")}}
	})
	if err := e.run(); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	e.settled()
	if got := e.dp.summaries; !slices.Equal(got, []netip.Prefix{pool6, pool4}) {
		t.Errorf("EnsureNode summaries = %v", got)
	}

	// Pending: torn down and forgotten.
	if e.dp.count(td("half")) != 1 {
		t.Error("pending allocation not torn down")
	}
	if e.dp.hasVeth(dataplane.HostVethName("half")) {
		t.Error("pending allocation's veth left")
	}
	if ids := e.recordIDs(); !slices.Equal(ids, []string{"keep"}) {
		t.Errorf("records = %v, want [keep]", ids)
	}
	// Committed: restored.
	allocs := e.a.Allocations()
	if len(allocs) != 1 || allocs[0].ContainerID != "keep" || !slices.Equal(allocs[0].IPs, []netip.Addr{keepV6, keepV4}) {
		t.Errorf("Allocations = %+v", allocs)
	}
	if e.dp.count(td("keep")) != 0 || !e.dp.hasVeth(dataplane.HostVethName("keep")) {
		t.Error("committed allocation was torn down")
	}
	e.wantUsed(pool6, 1)
	e.wantUsed(pool4, 1)
	// Orphan veth removed.
	if e.dp.count("Teardown "+orphan) != 1 || e.dp.hasVeth(orphan) {
		t.Error("orphan veth not removed")
	}
	if e.dp.countPrefix("Teardown") != 2 {
		t.Errorf("Teardown called %d times, want only for the pending record and the orphan", e.dp.countPrefix("Teardown"))
	}
	// Anycast routes rebuilt, the stale gateway route removed.
	if e.dp.count("SetRoute "+stale.String()+" 0") != 1 {
		t.Errorf("stale gateway route %s not removed; calls %v", stale, e.dp.calls)
	}
	if rts := e.dp.kernelRoutes(); len(rts) != 2 {
		t.Errorf("kernel routes after Restore = %+v, want anycast and addresses routes", rts)
	}

	// A new ADD never gets a restored IP; the pending one's are free again.
	rec := e.mustAdd("new")
	if want := []netip.Addr{mustAddr("fd00:10:1::2"), mustAddr("10.1.1.2")}; !slices.Equal(rec.IPs, want) {
		t.Errorf("new ADD got %v, want %v (sequential after the restored ::1)", rec.IPs, want)
	}
	// The restored addresses claim holds.
	if _, err := e.add("thief", annotations.Addresses+"=2001:db8:aa::1"); err == nil || !strings.Contains(err.Error(), "keep") {
		t.Errorf("claiming a restored addresses IP: err %v", err)
	}
	// DEL of the restored allocation works.
	if err := e.a.Del(context.Background(), "keep"); err != nil {
		t.Fatal(err)
	}
	e.a.Wait()
	e.wantUsed(pool6, 1)
}

func TestStartRestoresManyWithoutCollision(t *testing.T) {
	s := testSpec()
	s.Defaults.IPAlgo = "sequential"
	e := newEnv(t, withSpec(s))
	restored := map[netip.Addr]bool{}
	for i := 1; i <= 5; i++ {
		v6 := netip.MustParseAddr(fmt.Sprintf("fd00:10:1::%x", i))
		v4 := netip.MustParseAddr(fmt.Sprintf("10.1.1.%d", i))
		restored[v6], restored[v4] = true, true
		putRecord(t, e.dir, store.Allocation{ContainerID: fmt.Sprintf("old%d", i), State: store.Committed, IPs: []netip.Addr{v6, v4}})
	}
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		rec := e.mustAdd(fmt.Sprintf("new%d", i))
		for _, ip := range rec.IPs {
			if restored[ip] {
				t.Errorf("new%d got restored IP %s", i, ip)
			}
		}
	}
	e.wantUsed(pool6, 10)
}

func TestStartFailures(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns a substring the error must contain
	}{
		{
			name: "corrupt record",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "allocations", "broken.json")
				if err := os.WriteFile(p, []byte("{not json"), 0o600); err != nil {
					t.Fatal(err)
				}
				return p
			},
		},
		{
			name: "empty record",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "allocations", "empty.json")
				if err := os.WriteFile(p, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				return p
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			want := tc.setup(t, e.dir)
			err := e.a.Restore(context.Background())
			if err == nil {
				t.Fatal("Restore succeeded")
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Restore error %q does not contain %q", err, want)
			}
		})
	}
}

// A committed record whose IP is no longer inside any pool is kept.
func TestStartKeepsAllocationOutsidePools(t *testing.T) {
	e := newEnv(t)
	putRecord(t, e.dir, store.Allocation{ContainerID: "old", State: store.Committed, IPs: []netip.Addr{mustAddr("fd99::5")}})
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	if ids := e.allocIDs(); !slices.Equal(ids, []string{"old"}) {
		t.Errorf("allocations = %v", ids)
	}
	if err := e.a.Del(context.Background(), "old"); err != nil {
		t.Fatal(err)
	}
}

// 50 concurrent ADDs with distinct IDs get 50 distinct addresses.
func TestConcurrentAdds(t *testing.T) {
	e := started(t)
	const n = 50
	var wg sync.WaitGroup
	recs := make([]store.Allocation, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs[i], errs[i] = e.add(fmt.Sprintf("c%02d", i))
		}()
	}
	// Readers run concurrently with the writers.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 20; i++ {
			e.a.Allocations()
			e.state.IPAM()
		}
	}()
	wg.Wait()
	seen6 := map[netip.Addr]string{}
	seen4 := map[netip.Addr]string{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Add c%02d: %v", i, errs[i])
		}
		id := recs[i].ContainerID
		v6, v4 := recs[i].IPs[0], recs[i].IPs[1]
		if prev, dup := seen6[v6]; dup {
			t.Errorf("%s and %s both got %s", prev, id, v6)
		}
		if prev, dup := seen4[v4]; dup {
			t.Errorf("%s and %s both got %s", prev, id, v4)
		}
		seen6[v6], seen4[v4] = id, id
	}
	if len(seen6) != n {
		t.Errorf("%d distinct IPv6 addresses, want %d", len(seen6), n)
	}
	e.wantUsed(pool6, n)
	e.wantUsed(pool4, n)
	if got := len(e.a.Allocations()); got != n {
		t.Errorf("%d allocations", got)
	}
	if got := len(e.records()); got != n {
		t.Errorf("%d records", got)
	}

	// And 50 concurrent DELs release them all.
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.a.Del(context.Background(), fmt.Sprintf("c%02d", i))
		}()
	}
	wg.Wait()
	e.a.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("Del c%02d: %v", i, errs[i])
		}
	}
	e.wantUsed(pool6, 0)
	e.wantUsed(pool4, 0)
	if got := len(e.records()); got != 0 {
		t.Errorf("%d records left", got)
	}
}

// A rollback whose teardown fails keeps the IPs reserved (the veth may still
// route them) and the pending record; the DEL the runtime sends after the
// failed ADD finishes the job and frees them.
func TestRollbackTeardownFailureHoldsIPs(t *testing.T) {
	e := started(t)
	e.dp.set(func(d *fakeDP) {
		d.setupErr = errors.New("boom")
		d.teardownErr = errors.New("device busy")
	})
	if _, err := e.add("c1"); err == nil {
		t.Fatal("Add succeeded")
	}
	e.wantUsed(pool6, 1)
	e.wantUsed(pool4, 1)
	if ids := e.recordIDs(); !slices.Equal(ids, []string{"c1"}) {
		t.Errorf("records %v, want the pending c1 kept", ids)
	}
	if err := e.a.Del(context.Background(), "c1"); err == nil {
		t.Error("DEL succeeded although teardown still fails")
	}
	e.wantUsed(pool6, 1)
	e.dp.set(func(d *fakeDP) { d.setupErr, d.teardownErr = nil, nil })
	if err := e.a.Del(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	e.wantNothingFor("c1")
	e.wantUsed(pool6, 0)
	e.wantUsed(pool4, 0)
	if e.dp.hasVeth(dataplane.HostVethName("c1")) {
		t.Error("veth left behind")
	}
}

// A retried ADD after a stuck rollback cleans up first, then succeeds
// without leaking the first attempt's addresses.
func TestAddAfterStuckRollback(t *testing.T) {
	e := started(t)
	e.dp.set(func(d *fakeDP) {
		d.setupErr = errors.New("boom")
		d.teardownErr = errors.New("device busy")
	})
	if _, err := e.add("c1"); err == nil {
		t.Fatal("Add succeeded")
	}
	e.dp.set(func(d *fakeDP) { d.setupErr, d.teardownErr = nil, nil })
	if _, err := e.add("c1"); err != nil {
		t.Fatal(err)
	}
	e.wantUsed(pool6, 1)
	e.wantUsed(pool4, 1)
}

// A record that cannot be restored as it is never keeps the node from
// serving (the DEL that clears it needs a running agent): it is
// quarantined, routed nowhere, and a DEL removes it.
func TestRestoreQuarantines(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, e *env) string // returns a substring of the reason
	}{
		{"two records hold one IP", func(t *testing.T, e *env) string {
			ip := mustAddr("fd00:10:1::7")
			putRecord(t, e.dir, store.Allocation{ContainerID: "x1", State: store.Committed, IPs: []netip.Addr{ip}})
			putRecord(t, e.dir, store.Allocation{ContainerID: "x2", State: store.Committed, IPs: []netip.Addr{ip}})
			return "fd00:10:1::7"
		}},
		{"two records claim one addresses IP", func(t *testing.T, e *env) string {
			a := []netip.Addr{mustAddr("2001:db8:aa::9")}
			putRecord(t, e.dir, store.Allocation{ContainerID: "x1", State: store.Committed, IPs: []netip.Addr{mustAddr("fd00:10:1::1")}, Addresses: a})
			putRecord(t, e.dir, store.Allocation{ContainerID: "x2", State: store.Committed, IPs: []netip.Addr{mustAddr("fd00:10:1::2")}, Addresses: a})
			return "2001:db8:aa::9"
		}},
		{"its anycast IP is another record's pod address", func(t *testing.T, e *env) string {
			putRecord(t, e.dir, store.Allocation{ContainerID: "x1", State: store.Committed, IPs: []netip.Addr{mustAddr("fd00:10:1::1")}})
			putRecord(t, e.dir, store.Allocation{ContainerID: "x2", State: store.Committed, IPs: []netip.Addr{mustAddr("fd00:10:1::2")}, Anycast: []netip.Addr{mustAddr("fd00:10:1::1")}})
			return "fd00:10:1::1 is the pod address of container x1"
		}},
		{"a pending record whose teardown fails", func(t *testing.T, e *env) string {
			putRecord(t, e.dir, store.Allocation{ContainerID: "x1", State: store.Committed, IPs: []netip.Addr{mustAddr("fd00:10:1::1")}})
			putRecord(t, e.dir, store.Allocation{ContainerID: "x2", State: store.Pending, IPs: []netip.Addr{mustAddr("fd00:10:1::2")}})
			e.dp.set(func(d *fakeDP) {
				d.fault = func(op string) error {
					if op == "teardown" {
						return errors.New("device busy")
					}
					return nil
				}
			})
			return "device busy"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, readyOnCommit())
			want := tc.setup(t, e)
			if err := e.run(); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			e.settled()
			at := e.state.Attachments()
			if len(at) != 2 || at[0].ContainerID != "x1" || at[0].Phase != nodestate.Committed ||
				at[1].ContainerID != "x2" || at[1].Phase != nodestate.Stuck || !strings.Contains(at[1].Reason, want) {
				t.Fatalf("attachments %+v, want x1 committed and x2 stuck for %q", at, want)
			}
			for p := range e.sp.Held() {
				if p.Addr() == mustAddr("fd00:10:1::2") || p.Addr() == mustAddr("10.1.1.77") {
					t.Errorf("quarantined x2's %s is advertised", p)
				}
			}
			e.dp.set(func(d *fakeDP) { d.fault = nil })
			if err := e.a.Del(context.Background(), "x2"); err != nil {
				t.Fatal(err)
			}
			e.wantNothingFor("x2")
			if _, _, ok := e.state.Get("x1"); !ok {
				t.Fatal("DEL of the quarantined x2 took x1")
			}
			e.wantUsed(pool6, 1) // x1's address is still held
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

// A runtime may ADD into a netns right after a DEL from it: the pod's
// interface name is then a deleted pod's whose veth is still being
// removed, and the ADD waits for that instead of failing. A name held by
// a live pod is refused, naming it, and the refused ADD leaves nothing.
func TestAddIntoNetnsOfDeletedPod(t *testing.T) {
	ctx := context.Background()
	t.Run("waits for the removal", func(t *testing.T) {
		e := started(t)
		old, err := e.a.Add(ctx, "old", netnsOf("shared"), "eth0", podArgs("default", "pod-old"))
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		e.dp.set(func(d *fakeDP) {
			d.onTeardown = func(string) { <-release }
		})
		if err := e.a.Del(ctx, "old"); err != nil {
			t.Fatal(err)
		}
		added := make(chan error, 1)
		go func() {
			_, err := e.a.Add(ctx, "new", netnsOf("shared"), "eth0", podArgs("default", "pod-new"))
			added <- err
		}()
		select {
		case err := <-added:
			t.Fatalf("ADD returned (%v) while the old veth still holds eth0", err)
		case <-time.After(50 * time.Millisecond):
		}
		close(release)
		if err := <-added; err != nil {
			t.Fatalf("ADD once the old veth is gone: %v", err)
		}
		e.a.Wait()
		if e.dp.hasVeth(old.HostVeth) {
			t.Error("old veth still there")
		}
		if ids := e.allocIDs(); !slices.Equal(ids, []string{"new"}) {
			t.Errorf("allocations = %v, want [new]", ids)
		}
	})
	t.Run("a live pod's name is refused", func(t *testing.T) {
		e := started(t)
		if _, err := e.a.Add(ctx, "live", netnsOf("shared"), "eth0", podArgs("default", "pod-live")); err != nil {
			t.Fatal(err)
		}
		_, err := e.a.Add(ctx, "intruder", netnsOf("shared"), "eth0", podArgs("default", "pod-intruder"))
		if !errors.Is(err, dataplane.ErrInterfaceExists) || !strings.Contains(err.Error(), `"eth0"`) || !strings.Contains(err.Error(), netnsOf("shared")) {
			t.Fatalf("ADD into a netns whose eth0 a live pod holds: %v", err)
		}
		e.a.Wait()
		e.wantNothingFor("intruder")
		e.wantUsed(pool6, 1)
		e.wantUsed(pool4, 1)
		if n := e.dp.count("Setup intruder"); n != 1 {
			t.Errorf("%d Setups of the refused pod, want 1 (no removal was running)", n)
		}
	})
}
