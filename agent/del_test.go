package agent_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/dataplane"
)

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
		// The removal ends a moment after the ADD began (the scenario, not
		// a synchronization: should the ADD start later, it just finds the
		// address free).
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
