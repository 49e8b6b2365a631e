package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/podmeta"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// fakeDP is an in-memory agent.Dataplane. It records every call, can be told
// to fail, and remembers which host veths "exist".
type fakeDP struct {
	mu    sync.Mutex
	calls []string
	veths map[string]bool
	// routes holds the anycast/addresses routes SetRoute installed.
	routes    map[netip.Prefix][]dataplane.Nexthop
	summaries []netip.Prefix
	checked   []dataplane.Pod

	setupErr    error
	teardownErr error
	checkErr    error
	gatewayRts  []netip.Prefix
	// onSetup, if set, runs at the start of Setup (outside the lock).
	onSetup func(p dataplane.Pod)
}

func newFakeDP() *fakeDP {
	return &fakeDP{veths: map[string]bool{}, routes: map[netip.Prefix][]dataplane.Nexthop{}}
}

func (d *fakeDP) record(format string, args ...any) {
	d.calls = append(d.calls, fmt.Sprintf(format, args...))
}

func (d *fakeDP) Setup(p dataplane.Pod) (dataplane.Link, error) {
	d.mu.Lock()
	hook := d.onSetup
	d.mu.Unlock()
	if hook != nil {
		hook(p)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("Setup %s", p.ContainerID)
	name := dataplane.HostVethName(p.ContainerID)
	// Even a failed Setup may have created the veth: that is what
	// rollback must clean up.
	d.veths[name] = true
	if d.setupErr != nil {
		return dataplane.Link{}, d.setupErr
	}
	return dataplane.Link{
		HostVeth: name,
		HostMAC:  net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01},
		PodMAC:   net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02},
	}, nil
}

func (d *fakeDP) Teardown(containerID string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("Teardown %s", containerID)
	if d.teardownErr != nil {
		return d.teardownErr
	}
	delete(d.veths, dataplane.HostVethName(containerID))
	return nil
}

func (d *fakeDP) Check(p dataplane.Pod) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("Check %s", p.ContainerID)
	d.checked = append(d.checked, p)
	return d.checkErr
}

func (d *fakeDP) HostVeths() ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.veths))
	for v := range d.veths {
		out = append(out, v)
	}
	slices.Sort(out)
	return out, nil
}

func (d *fakeDP) DeleteVeth(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("DeleteVeth %s", name)
	delete(d.veths, name)
	return nil
}

func (d *fakeDP) EnsureNode(summaries []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("EnsureNode")
	d.summaries = slices.Clone(summaries)
	return nil
}

func (d *fakeDP) SetRoute(dst netip.Prefix, nhs []dataplane.Nexthop) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("SetRoute %s %d", dst, len(nhs))
	if len(nhs) == 0 {
		delete(d.routes, dst)
	} else {
		d.routes[dst] = slices.Clone(nhs)
	}
	return nil
}

func (d *fakeDP) GatewayRoutes() ([]netip.Prefix, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.gatewayRts), nil
}

// count returns how many calls were exactly call.
func (d *fakeDP) count(call string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.calls {
		if c == call {
			n++
		}
	}
	return n
}

func (d *fakeDP) countPrefix(prefix string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

func (d *fakeDP) hasVeth(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.veths[name]
}

func (d *fakeDP) addVeth(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.veths[name] = true
}

func (d *fakeDP) set(f func(d *fakeDP)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

// faultStore wraps the real store and can fail the Nth Put (1-based,
// counted from when failPutOn was set).
type faultStore struct {
	*store.Store
	puts      atomic.Int64
	failPutOn atomic.Int64
}

var errPut = errors.New("injected Put failure")

func (s *faultStore) Put(a store.Allocation) error {
	n := s.puts.Add(1)
	if f := s.failPutOn.Load(); f > 0 && n == f {
		return errPut
	}
	return s.Store.Put(a)
}

// failNthPut makes the nth Put from now on fail.
func (s *faultStore) failNthPut(n int64) {
	s.puts.Store(0)
	s.failPutOn.Store(n)
}

// Test pools.
var (
	pool6   = netip.MustParsePrefix("fd00:10:1::/64")
	pool4   = netip.MustParsePrefix("10.1.1.0/24")
	shared6 = netip.MustParsePrefix("2001:db8:100::/120")
)

// testSpec is a dual-stack node: IPv6 and IPv4 summaries plus a shared IPv6
// pool only namespace "prod" may use.
func testSpec() *v1alpha1.NodeConfigSpec {
	return &v1alpha1.NodeConfigSpec{
		ASN:      65001,
		RouterID: "192.0.2.1",
		Pools: []v1alpha1.Pool{
			{CIDR: pool6.String()},
			{CIDR: pool4.String()},
			{CIDR: shared6.String(), Shared: true, Namespaces: []string{"prod"}},
		},
		Defaults: v1alpha1.Defaults{IPv4: true},
	}
}

type env struct {
	t     *testing.T
	a     *agent.Agent
	dp    *fakeDP
	st    *faultStore
	dir   string
	hooks agent.Hooks
}

type envOpt func(*agent.Config)

func withSpec(s *v1alpha1.NodeConfigSpec) envOpt { return func(c *agent.Config) { c.Spec = s } }
func readyOnCommit() envOpt                      { return func(c *agent.Config) { c.ReadyOnCommit = true } }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// newEnv builds an agent on a fake dataplane and a real store in a temp dir,
// without starting it.
func newEnv(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dp: newFakeDP(), st: &faultStore{Store: st}, dir: dir}
	cfg := agent.Config{Spec: testSpec(), Store: e.st, Dataplane: e.dp, Source: podmeta.Standalone{}, Log: discard}
	for _, o := range opts {
		o(&cfg)
	}
	e.a, err = agent.New(cfg)
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	return e
}

// started is newEnv plus Start.
func started(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	e := newEnv(t, opts...)
	if err := e.a.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return e
}

// podArgs builds CNI_ARGS for ns/name plus extra "K=V" pairs.
func podArgs(ns, name string, extra ...string) string {
	return strings.Join(append([]string{"IgnoreUnknown=1", "K8S_POD_NAMESPACE=" + ns, "K8S_POD_NAME=" + name}, extra...), ";")
}

func netnsOf(id string) string { return "/var/run/netns/cni-" + id }

func (e *env) add(id string, extra ...string) (store.Allocation, error) {
	return e.a.Add(context.Background(), id, netnsOf(id), "eth0", podArgs("default", "pod-"+id, extra...))
}

func (e *env) mustAdd(id string, extra ...string) store.Allocation {
	e.t.Helper()
	rec, err := e.add(id, extra...)
	if err != nil {
		e.t.Fatalf("Add(%s): %v", id, err)
	}
	return rec
}

// used returns the IPAM used count of pool p.
func (e *env) used(p netip.Prefix) uint64 {
	e.t.Helper()
	for _, s := range e.a.IPAM() {
		if s.Pool.Prefix == p {
			return s.Used
		}
	}
	e.t.Fatalf("pool %s not in IPAM stats", p)
	return 0
}

func (e *env) wantUsed(p netip.Prefix, n uint64) {
	e.t.Helper()
	if got := e.used(p); got != n {
		e.t.Errorf("IPAM pool %s used = %d, want %d", p, got, n)
	}
}

// records returns the store content.
func (e *env) records() []store.Allocation {
	e.t.Helper()
	recs, err := e.st.Load()
	if err != nil {
		e.t.Fatalf("store Load: %v", err)
	}
	return recs
}

func (e *env) recordIDs() []string {
	e.t.Helper()
	var ids []string
	for _, r := range e.records() {
		ids = append(ids, r.ContainerID)
	}
	return ids
}

func (e *env) allocIDs() []string {
	var ids []string
	for _, r := range e.a.Allocations() {
		ids = append(ids, r.ContainerID)
	}
	return ids
}

// wantNothingFor asserts that container id left no trace: no record, no
// committed allocation.
func (e *env) wantNothingFor(id string) {
	e.t.Helper()
	if slices.Contains(e.recordIDs(), id) {
		e.t.Errorf("store still holds a record for %s", id)
	}
	if slices.Contains(e.allocIDs(), id) {
		e.t.Errorf("agent still lists an allocation for %s", id)
	}
}

// cniCode maps err through ToCNI.
func cniCode(t *testing.T, err error) uint {
	t.Helper()
	ce := agent.ToCNI(err)
	if ce == nil {
		t.Fatalf("ToCNI(%v) = nil", err)
	}
	if !strings.HasPrefix(ce.Msg, "flock: ") {
		t.Errorf("CNI message %q does not start with \"flock: \"", ce.Msg)
	}
	return ce.Code
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// otherV4 returns an address of pool4 that is not ip.
func otherV4(ip netip.Addr) netip.Addr {
	if o := mustAddr("10.1.1.254"); o != ip {
		return o
	}
	return mustAddr("10.1.1.253")
}
