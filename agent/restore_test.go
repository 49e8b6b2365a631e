package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

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
