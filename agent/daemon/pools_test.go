package daemon

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

var summary6 = netip.MustParsePrefix("fd00:10:1::/64")

// testDaemon is a standalone daemon with just what the AddressPool
// handling needs: node state, logger, the file's pools.
func testDaemon(t *testing.T, pools ...v1alpha1.AddressPool) *daemon {
	t.Helper()
	spec := v1alpha1.NodeConfigSpec{ASN: 65001, RouterID: "192.0.2.1", Pools: []v1alpha1.Pool{{CIDR: summary6.String()}}}
	st, err := nodestate.New(&spec, true)
	if err != nil {
		t.Fatal(err)
	}
	return &daemon{log: slog.New(slog.NewTextHandler(io.Discard, nil)), nodeName: "node1", state: st, spec: spec,
		warned: map[string]bool{}, filePools: pools}
}

func addressPool(name, cidr, use string) v1alpha1.AddressPool {
	return v1alpha1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.AddressPoolSpec{CIDRs: []string{cidr}, Use: []string{use}, Namespaces: []string{"dns"}}}
}

func (d *daemon) setFilePools(pools ...v1alpha1.AddressPool) {
	d.mu.Lock()
	d.filePools = pools
	d.mu.Unlock()
}

// race runs first until it reaches hookPoolsRead (its inputs read,
// nothing written), then the pools change to next and second runs: on
// its own to the end, or until it waits for first, whichever comes first.
// Then first goes on, and race returns once both are done. Without
// serialization that is the lost update: first's older result lands last.
func race(t *testing.T, d *daemon, first func(), next []v1alpha1.AddressPool, second func()) {
	t.Helper()
	paused, release := make(chan struct{}), make(chan struct{})
	waiting := make(chan struct{}, 1)
	var paused1 atomic.Bool
	d.poolHook = func(point string) {
		switch point {
		case hookPoolsRead:
			if paused1.CompareAndSwap(false, true) {
				close(paused)
				<-release
			}
		case hookPoolsWait:
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}
	defer func() { d.poolHook = nil }()
	var wg sync.WaitGroup
	wg.Go(first)
	<-paused
	d.setFilePools(next...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		second()
	}()
	select {
	case <-done:
	case <-waiting:
	}
	close(release)
	wg.Wait()
	<-done
}

// Two AddressPool changes close together: the later set wins, in IPAM and
// in the authority, whatever order the applies reach their writes in.
func TestApplyPoolsLaterSetWins(t *testing.T) {
	older := addressPool("pods", "2001:db8:300::/124", v1alpha1.UsePod)
	newer := addressPool("pods", "2001:db8:400::/124", v1alpha1.UsePod)
	d := testDaemon(t, older)
	race(t, d, d.applyPools, []v1alpha1.AddressPool{newer}, d.applyPools)
	if _, ok := d.state.PoolOf(netip.MustParseAddr("2001:db8:400::1")); !ok {
		t.Errorf("IPAM pools %v: the newer pool is missing", d.state.IPAM())
	}
	if _, ok := d.state.PoolOf(netip.MustParseAddr("2001:db8:300::1")); ok {
		t.Errorf("IPAM pools %v: the older pool is still handed out", d.state.IPAM())
	}
	if _, err := d.Authorize(v1alpha1.UsePod, netip.MustParsePrefix("2001:db8:400::/124"), "dns"); err != nil {
		t.Errorf("the authority is not the newer set: %v", err)
	}
}

// An overlap check (another node's NodeConfig changed) racing a pool
// change must not put back the suppression the pool change lifted.
func TestCheckOverlapsRacingApplyPools(t *testing.T) {
	over := addressPool("over", "fd00:10:1::/112", v1alpha1.UsePod) // inside this node's summary
	d := testDaemon(t, over)
	d.applyPools()
	if _, suppressed := d.state.Suppressed()[summary6]; !suppressed {
		t.Fatalf("summary %s overlapping pool %s not suppressed: %v", summary6, over.Name, d.state.Suppressed())
	}
	race(t, d, d.checkOverlaps, nil, d.applyPools)
	if s := d.state.Suppressed(); len(s) != 0 {
		t.Errorf("suppressed %v after the overlapping pool went: a stale overlap check won", s)
	}
}

// A pod pool created over an anycast IP in use (issue 18, defect 4) is
// reported on its row in `flockctl ipam` and in this node's status.inUse
// entry; the IP is counted as held, not free.
func TestPodPoolOverInUseAnycastReported(t *testing.T) {
	anycast := netip.MustParseAddr("2001:db8:300::5")
	d := testDaemon(t, addressPool("dns-anycast", "2001:db8:300::/120", v1alpha1.UseAnycast))
	d.applyPools()
	rec, err := d.state.Reserve(store.Allocation{ContainerID: "c1", Pod: podmeta.ID{Namespace: "dns", Name: "coredns-1"},
		Anycast: []netip.Addr{anycast}}, []ipam.Request{{Family: 6}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.state.Commit(rec); err != nil {
		t.Fatal(err)
	}
	d.setFilePools(addressPool("dns-anycast", "2001:db8:300::/120", v1alpha1.UseAnycast), addressPool("pods", "2001:db8:300::/124", v1alpha1.UsePod))
	d.applyPools()

	rows := d.Pools()
	i := slices.IndexFunc(rows, func(r admin.Pool) bool { return r.Name == "pods" })
	if i < 0 {
		t.Fatalf("no row for pool pods: %+v", rows)
	}
	r := rows[i]
	if r.Held != 1 || r.Free != "13" || !strings.Contains(r.Note, "2001:db8:300::5 (anycast: dns/coredns-1)") {
		t.Errorf("row %+v: want 1 held, 13 free, and a note naming %s and its pod", r, anycast)
	}
	st := d.inUseStatus()
	want := v1alpha1.NodeInUse{Node: "node1", Count: 1, Addresses: []v1alpha1.InUseAddress{{IP: anycast.String(), Use: v1alpha1.UseAnycast, Pods: []string{"dns/coredns-1"}}}}
	if len(st) != 1 || !slices.EqualFunc(st["pods"].Addresses, want.Addresses, func(a, b v1alpha1.InUseAddress) bool {
		return a.IP == b.IP && a.Use == b.Use && slices.Equal(a.Pods, b.Pods)
	}) || st["pods"].Node != want.Node || st["pods"].Count != want.Count {
		t.Errorf("status.inUse entries %+v, want pods: %+v", st, want)
	}

	d.state.Release("c1")
	if st := d.inUseStatus(); len(st) != 0 {
		t.Errorf("status.inUse entries %+v once the anycast pod is gone, want none", st)
	}
}
