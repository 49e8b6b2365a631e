package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
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
