package agent_test

import (
	"maps"
	"net/netip"
	"slices"
	"time"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/dataplane"
)

// check verifies the invariants at a quiescent point.
func (m *model) check(when string) {
	t, e := m.t, m.e
	t.Helper()
	if t.Failed() {
		return
	}
	live := m.liveCtrs()
	m.mu.Lock()
	ready := maps.Clone(m.ready)
	deleted := maps.Clone(m.deleted)
	m.mu.Unlock()
	// Kubernetes mode: NotReady until reported. A static pod is named by
	// its static UID, whichever mirror its ADD and the reports saw.
	isReady := func(c *ctr) bool { return ready[c.pod] }

	// The state, the store and the dataplane hold exactly the live ones.
	var wantIDs []string
	for _, c := range live {
		wantIDs = append(wantIDs, c.id)
	}
	if got := e.allocIDs(); !slices.Equal(got, wantIDs) {
		for _, a := range e.state.Attachments(nodestate.Stuck) {
			t.Logf("%s: %s stuck: %s", when, a.ContainerID, a.Reason)
		}
		t.Fatalf("%s: state holds %v, want the live containers %v", when, got, wantIDs)
	}
	recs := e.records()
	var recIDs []string
	ipOwner := map[netip.Addr]string{}
	vethOwner := map[string]string{}
	for _, r := range recs {
		recIDs = append(recIDs, r.ContainerID)
		if r.State != store.Committed {
			t.Errorf("%s: record %s is %s", when, r.ContainerID, r.State)
		}
		for _, ip := range append(slices.Clone(r.IPs), r.Addresses...) {
			if o, dup := ipOwner[ip]; dup {
				t.Errorf("%s: %s held by %s and %s", when, ip, o, r.ContainerID)
			}
			ipOwner[ip] = r.ContainerID
		}
		if o, dup := vethOwner[r.HostVeth]; dup {
			t.Errorf("%s: veth %s shared by %s and %s", when, r.HostVeth, o, r.ContainerID)
		}
		vethOwner[r.HostVeth] = r.ContainerID
		if !e.dp.hasVeth(r.HostVeth) {
			t.Errorf("%s: live %s has no veth %s", when, r.ContainerID, r.HostVeth)
		}
	}
	if !slices.Equal(recIDs, wantIDs) {
		t.Fatalf("%s: store holds %v, want %v", when, recIDs, wantIDs)
	}
	// Each record is what its ADD returned to the runtime: the oracle below
	// is built from the runtime's knowledge, not from the agent's store.
	for i, r := range recs {
		c := live[i].rec
		if !slices.Equal(r.IPs, c.IPs) || r.HostVeth != c.HostVeth || !slices.Equal(r.Anycast, c.Anycast) ||
			!slices.Equal(r.Addresses, c.Addresses) || r.Pod != c.Pod {
			t.Errorf("%s: record of %s %+v differs from what its ADD returned %+v", when, r.ContainerID, r, c)
		}
	}
	recs = nil
	for _, c := range live {
		recs = append(recs, c.rec)
	}
	veths, _ := e.dp.HostVeths()
	for _, v := range veths {
		if _, ok := vethOwner[v]; !ok {
			t.Errorf("%s: veth %s belongs to no live container", when, v)
		}
	}
	// IPAM counts exactly the live IPs.
	perPool := map[netip.Prefix]uint64{}
	for _, r := range recs {
		for _, ip := range r.IPs {
			for _, p := range []netip.Prefix{pool6, pool4, shared6} {
				if p.Contains(ip) {
					perPool[p]++
				}
			}
		}
	}
	for _, p := range []netip.Prefix{pool6, pool4, shared6} {
		if got := e.used(p); got != perPool[p] {
			t.Errorf("%s: IPAM %s used %d, live IPs %d", when, p, got, perPool[p])
		}
	}
	m.checkInUse(when, recs)

	// The oracle: what must be advertised and routed.
	wantAdv := map[netip.Prefix]advert.Kind{pool6: advert.Summary, pool4: advert.Summary}
	wantKernel := map[netip.Prefix][]dataplane.Nexthop{}
	for _, c := range live {
		r := c.rec
		for _, ip := range r.IPs {
			if !pool6.Contains(ip) && !pool4.Contains(ip) {
				wantAdv[netip.PrefixFrom(ip, ip.BitLen())] = advert.Pod
			}
		}
		if !isReady(c) {
			continue
		}
		for kind, ips := range map[advert.Kind][]netip.Addr{advert.Anycast: r.Anycast, advert.Address: r.Addresses} {
			for _, ip := range ips {
				p := netip.PrefixFrom(ip, ip.BitLen())
				wantAdv[p] = kind
				for _, own := range r.IPs {
					if own.Is4() == ip.Is4() {
						wantKernel[p] = append(wantKernel[p], dataplane.Nexthop{Gateway: own, Dev: r.HostVeth})
					}
				}
			}
		}
	}
	for p := range wantKernel {
		slices.SortFunc(wantKernel[p], dataplane.CompareNexthops)
	}
	// The reconcilers converge on their own (event passes, retries, the
	// periodic repair).
	deadline := time.Now().Add(10 * time.Second)
	for {
		adv, kern := e.sp.Held(), e.dp.kernelRoutes()
		okAdv := maps.Equal(adv, wantAdv)
		okKern := maps.EqualFunc(kern, wantKernel, func(a, b []dataplane.Nexthop) bool { return slices.Equal(a, b) })
		if okAdv && okKern {
			break
		}
		if time.Now().After(deadline) {
			if !okAdv {
				t.Errorf("%s: advertised\n%v\nwant\n%v", when, adv, wantAdv)
			}
			if !okKern {
				t.Errorf("%s: kernel routes\n%v\nwant\n%v", when, kern, wantKernel)
			}
			t.FailNow()
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A deleted container owns nothing anywhere.
	adv := e.sp.Held()
	kern := e.dp.kernelRoutes()
	for id, r := range deleted {
		if _, _, ok := e.state.Get(id); ok {
			t.Errorf("%s: deleted %s is in the state", when, id)
		}
		if _, ok := vethOwner[r.HostVeth]; !ok {
			// (unless the name went to another live container later)
			if r.HostVeth != "" && e.dp.hasVeth(r.HostVeth) {
				t.Errorf("%s: deleted %s left veth %s", when, id, r.HostVeth)
			}
			for p, nhs := range kern {
				for _, nh := range nhs {
					if nh.Dev == r.HostVeth {
						t.Errorf("%s: kernel route %s still via deleted %s's veth", when, p, id)
					}
				}
			}
		}
		for _, ip := range r.IPs {
			if o, ok := e.state.IPOwner(ip); ok && o == id {
				t.Errorf("%s: IPAM still gives deleted %s's %s to it", when, id, ip)
			}
		}
		for _, ip := range r.IPs {
			if o, ok := ipOwner[ip]; (ok && o != id) || claimedByLive(recs, ip) {
				continue // reused by a live container: fine
			}
			if _, ok := adv[netip.PrefixFrom(ip, ip.BitLen())]; ok && !pool6.Contains(ip) && !pool4.Contains(ip) {
				t.Errorf("%s: deleted %s's %s is advertised", when, id, ip)
			}
		}
	}
	// Cluster-wide claims: exactly the live allocations' addresses IPs and
	// pod IPs outside the summaries, each held by its container.
	wantClaims := map[netip.Addr]string{}
	for _, r := range recs {
		for _, ip := range append(slices.Clone(r.IPs), r.Addresses...) {
			if !pool6.Contains(ip) && !pool4.Contains(ip) {
				wantClaims[ip] = "node/" + r.ContainerID
			}
		}
	}
	if got := m.claims.holders(); !maps.Equal(got, wantClaims) {
		t.Errorf("%s: claims\n%v\nwant\n%v", when, got, wantClaims)
	}
	for _, st := range []reconcile.Status{e.kernelLoop.Status(), e.bgpLoop.Status()} {
		if st.Failing {
			t.Errorf("%s: %s reconciler failing with chaos off: %s", when, st.Target, st.LastError)
		}
	}
}
