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
	"time"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/dataplane/anycast"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// fakeDP is an in-memory agent.Dataplane and anycast.Kernel. It records
// every call, can be told to fail, and remembers which host veths "exist",
// which network namespaces are gone and which host routes are installed.
type fakeDP struct {
	mu    sync.Mutex
	calls []string
	veths map[string]bool
	// routes holds the anycast/addresses routes SetRoute installed.
	routes    map[netip.Prefix][]dataplane.Nexthop
	summaries []netip.Prefix
	checked   []dataplane.Pod
	goneNetns map[string]bool

	setupErr    error
	teardownErr error
	checkErr    error
	// routeErrs fails the next n SetRoute calls.
	routeErrs int
	// fault, if set, may inject an error into "setup", "teardown" and
	// "route" calls (the model test's chaos).
	fault func(op string) error
	// onSetup and onTeardown, if set, run at the start of Setup and
	// Teardown (outside the lock).
	onSetup func(p dataplane.Pod)
	// ifaces holds each netns's pod interface names ("netns/ifname") and
	// the host veth whose peer holds the name.
	ifaces map[string]string
	// macs are the MACs each Setup was handed, by host veth.
	macs       map[string][2]string
	onTeardown func(veth string)
}

func newFakeDP() *fakeDP {
	return &fakeDP{veths: map[string]bool{}, ifaces: map[string]string{}, routes: map[netip.Prefix][]dataplane.Nexthop{}, goneNetns: map[string]bool{}}
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
	if p.HostVeth == "" {
		return dataplane.Link{}, errors.New("fake: Setup without a host veth name")
	}
	// Like the real one: a netns that is gone cannot be opened.
	if d.goneNetns[p.Netns] {
		return dataplane.Link{}, &dataplane.NetnsError{Path: p.Netns, Err: errors.New("fake: no such netns")}
	}
	// Like the real one: the pod's interface name is refused while the
	// peer of another veth holds it in that netns, and nothing is created.
	iface := p.Netns + "/" + p.IfName
	if holder, ok := d.ifaces[iface]; ok && holder != p.HostVeth && d.veths[holder] {
		return dataplane.Link{}, fmt.Errorf("fake: interface %q already exists in netns %s: %w", p.IfName, p.Netns, dataplane.ErrInterfaceExists)
	}
	// Like the real one: a leftover veth of that name is replaced.
	// Even a failed Setup may have created the veth: that is what
	// rollback must clean up.
	d.veths[p.HostVeth] = true
	d.ifaces[iface] = p.HostVeth
	if d.setupErr != nil {
		return dataplane.Link{}, d.setupErr
	}
	if err := d.inject("setup"); err != nil {
		return dataplane.Link{}, err
	}
	// Like the real one: the MACs asked for, else the kernel's pick.
	l := dataplane.Link{HostVeth: p.HostVeth, HostMAC: p.HostMAC, PodMAC: p.PodMAC}
	if l.HostMAC == nil {
		l.HostMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	}
	if l.PodMAC == nil {
		l.PodMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	}
	if d.macs == nil {
		d.macs = map[string][2]string{}
	}
	d.macs[p.HostVeth] = [2]string{l.HostMAC.String(), l.PodMAC.String()}
	return l, nil
}

// Teardown of a veth also removes the kernel routes through it, as the
// kernel does: an IPv6 route loses that next hop, an IPv4 multipath route
// goes entirely (other replicas' next hops with it).
func (d *fakeDP) Teardown(veth string) error {
	d.mu.Lock()
	hook := d.onTeardown
	d.mu.Unlock()
	if hook != nil {
		hook(veth)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("Teardown %s", veth)
	if d.teardownErr != nil {
		return d.teardownErr
	}
	if err := d.inject("teardown"); err != nil {
		return err
	}
	delete(d.veths, veth)
	d.dropRoutesLocked(veth)
	for k, holder := range d.ifaces {
		if holder == veth {
			delete(d.ifaces, k)
		}
	}
	return nil
}

// Retire takes a veth down: the kernel drops the routes through it as for
// Teardown, but the veth exists until Teardown.
func (d *fakeDP) Retire(veth string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("Retire %s", veth)
	if err := d.inject("retire"); err != nil {
		return err
	}
	d.dropRoutesLocked(veth)
	return nil
}

func (d *fakeDP) dropRoutesLocked(veth string) {
	for p, nhs := range d.routes {
		live := slices.DeleteFunc(slices.Clone(nhs), func(nh dataplane.Nexthop) bool { return nh.Dev == veth })
		if len(live) == 0 || (p.Addr().Is4() && len(live) < len(nhs)) {
			delete(d.routes, p)
		} else {
			d.routes[p] = live
		}
	}
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

func (d *fakeDP) NetnsExists(path string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.goneNetns[path], nil
}

func (d *fakeDP) EnsureNode(summaries []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("EnsureNode")
	d.summaries = slices.Clone(summaries)
	return nil
}

// SetRoute fails like the kernel when a next hop's device is missing.
func (d *fakeDP) SetRoute(dst netip.Prefix, nhs []dataplane.Nexthop) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record("SetRoute %s %d", dst, len(nhs))
	if d.routeErrs > 0 {
		d.routeErrs--
		return fmt.Errorf("fake: injected route failure for %s", dst)
	}
	if err := d.inject("route"); err != nil {
		return err
	}
	for _, nh := range nhs {
		if !d.veths[nh.Dev] {
			return fmt.Errorf("fake: route %s via %s dev %s: no such device", dst, nh.Gateway, nh.Dev)
		}
	}
	if len(nhs) == 0 {
		delete(d.routes, dst)
	} else {
		d.routes[dst] = slices.Clone(nhs)
	}
	return nil
}

func (d *fakeDP) HostRoutes() (map[netip.Prefix][]dataplane.Nexthop, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.inject("read"); err != nil {
		return nil, err
	}
	out := map[netip.Prefix][]dataplane.Nexthop{}
	for p, nhs := range d.routes {
		out[p] = slices.Clone(nhs)
	}
	return out, nil
}

func (d *fakeDP) inject(op string) error {
	if d.fault == nil {
		return nil
	}
	return d.fault(op)
}

func (d *fakeDP) kernelRoutes() map[netip.Prefix][]dataplane.Nexthop {
	r, _ := d.HostRoutes()
	return r
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

// td is the Teardown call for a container's default veth.
func td(id string) string { return "Teardown " + dataplane.HostVethName(id) }

// fakeSpeaker is the BGP reconcile target: it holds paths, can fail.
type fakeSpeaker struct {
	mu   sync.Mutex
	held map[netip.Prefix]advert.Path
	// errs fails the next n Sets (after applying half of the diff, like a
	// partly failed batch); fault, if set, may fail any Set the same way.
	errs  int
	fault func() bool
	sets  int
	fulls int
}

func newFakeSpeaker() *fakeSpeaker { return &fakeSpeaker{held: map[netip.Prefix]advert.Path{}} }

func (f *fakeSpeaker) Set(_ context.Context, desired map[netip.Prefix]advert.Path, full bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets++
	if full {
		f.fulls++
	}
	announce, withdraw := advert.Diff(desired, f.held)
	fail := f.errs > 0
	if fail {
		f.errs--
	}
	if f.fault != nil && f.fault() {
		fail = true
	}
	i := 0
	for p, k := range announce {
		if fail && i%2 == 1 {
			continue
		}
		f.held[p] = k
		i++
	}
	for j, p := range withdraw {
		if fail && j%2 == 1 {
			continue
		}
		delete(f.held, p)
	}
	if fail {
		return errors.New("fake speaker: injected batch failure")
	}
	return nil
}

// Held returns the kinds held (pod routes carry nothing else).
func (f *fakeSpeaker) Held() map[netip.Prefix]advert.Kind {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[netip.Prefix]advert.Kind, len(f.held))
	for p, a := range f.held {
		out[p] = a.Kind
	}
	return out
}

func (f *fakeSpeaker) set(fn func(f *fakeSpeaker)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// faultStore wraps the real store and can fail the Nth write (1-based,
// counted from when failPutOn was set): an ADD writes twice, its pending
// record (Begin) and the commit.
type faultStore struct {
	*store.Store
	puts      atomic.Int64
	failPutOn atomic.Int64
	// failAfterCommit fails Commit once the record is renamed to
	// committed (as a failed directory fsync would).
	failAfterCommit atomic.Bool
	// fault, if set, may fail any Put or Delete (the model test).
	fault func(op string) error
}

var errPut = errors.New("injected Put failure")

func (s *faultStore) put() error {
	n := s.puts.Add(1)
	if f := s.failPutOn.Load(); f > 0 && n == f {
		return errPut
	}
	if s.fault != nil {
		return s.fault("put")
	}
	return nil
}

func (s *faultStore) Begin(a store.Allocation) (*store.Draft, error) {
	if err := s.put(); err != nil {
		return nil, err
	}
	return s.Store.Begin(a)
}

func (s *faultStore) Commit(d *store.Draft) error {
	if err := s.put(); err != nil {
		return err
	}
	if err := s.Store.Commit(d); err != nil || !s.failAfterCommit.Load() {
		return err
	}
	return errPut
}

func (s *faultStore) Delete(id string) error {
	if s.fault != nil {
		if err := s.fault("delete"); err != nil {
			return err
		}
	}
	return s.Store.Delete(id)
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
	t          *testing.T
	a          *agent.Agent
	state      *nodestate.State
	dp         *fakeDP
	sp         *fakeSpeaker
	kernel     *anycast.Routes
	bgpLoop    *reconcile.Loop[map[netip.Prefix]advert.Path]
	kernelLoop *reconcile.Loop[map[netip.Prefix][]dataplane.Nexthop]
	st         *faultStore
	dir        string
	cancel     context.CancelFunc
	done       sync.WaitGroup
}

type envConfig struct {
	agent.Config
	standalone bool // pods count as Ready unless reported otherwise
}

type envOpt func(*envConfig)

func withSpec(s *v1alpha1.NodeConfigSpec) envOpt { return func(c *envConfig) { c.Spec = s } }
func readyOnCommit() envOpt                      { return func(c *envConfig) { c.standalone = true } }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// newEnv builds an agent on a fake dataplane, a fake speaker and a real
// store in a temp dir, with the two real reconcile loops, without
// restoring or running anything.
func newEnv(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Before the temp dir goes: the store's background work must be over.
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, dp: newFakeDP(), sp: newFakeSpeaker(), st: &faultStore{Store: st}, dir: dir}
	cfg := envConfig{Config: agent.Config{Spec: testSpec(), Store: e.st, Dataplane: e.dp, Source: podmeta.Standalone{}, Log: discard}}
	for _, o := range opts {
		o(&cfg)
	}
	e.build(cfg)
	return e
}

func (e *env) build(cfg envConfig) {
	t := e.t
	var err error
	if e.state, err = nodestate.New(cfg.Spec, cfg.standalone); err != nil {
		t.Fatalf("nodestate.New: %v", err)
	}
	e.kernel = anycast.New(e.dp)
	e.bgpLoop = &reconcile.Loop[map[netip.Prefix]advert.Path]{Name: "bgp", Target: e.sp, Desired: e.state.Adverts, Wake: e.state.Changed(),
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Log: discard}
	e.kernelLoop = &reconcile.Loop[map[netip.Prefix][]dataplane.Nexthop]{Name: "kernel", Target: e.kernel, Desired: e.state.KernelRoutes, Wake: e.state.Changed(),
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Log: discard}
	cfg.State = e.state
	cfg.Settle = func(ctx context.Context, gen uint64) error {
		return errors.Join(e.bgpLoop.Wait(ctx, gen), e.kernelLoop.Wait(ctx, gen))
	}
	if e.a, err = agent.New(cfg.Config); err != nil {
		t.Fatalf("agent.New: %v", err)
	}
}

// run restores the agent and starts the reconcile loops (stopped when the
// test ends).
func (e *env) run() error {
	if err := e.a.Restore(context.Background()); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	for _, run := range []func(context.Context) error{e.bgpLoop.Run, e.kernelLoop.Run} {
		e.done.Add(1)
		go func() {
			defer e.done.Done()
			_ = run(ctx)
		}()
	}
	e.t.Cleanup(e.stop)
	return nil
}

func (e *env) stop() {
	e.a.Wait() // as the daemon does on its way out
	if e.cancel != nil {
		e.cancel()
		e.done.Wait()
		e.cancel = nil
	}
}

// started is newEnv plus run.
func started(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	e := newEnv(t, opts...)
	if err := e.run(); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	return e
}

// settled waits until both loops applied the current state.
func (e *env) settled() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gen := e.state.Generation()
	if err := errors.Join(e.bgpLoop.Wait(ctx, gen), e.kernelLoop.Wait(ctx, gen)); err != nil {
		e.t.Fatalf("reconcilers did not apply generation %d: %v", gen, err)
	}
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
	for _, s := range e.state.IPAM() {
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

// allocIDs lists every attachment the state holds, whatever its phase.
func (e *env) allocIDs() []string {
	var ids []string
	for _, r := range e.state.Attachments() {
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
