package daemon

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

type recordingTarget struct {
	mu   sync.Mutex
	last map[netip.Prefix]advert.Path
}

func (r *recordingTarget) Set(_ context.Context, d map[netip.Prefix]advert.Path, _ bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = d
	return nil
}

func (r *recordingTarget) get(p netip.Prefix) advert.Path {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[p]
}

// A planned stop with drainOnStopSeconds re-sends every Service route with
// GRACEFUL_SHUTDOWN before it waits, and the controller's later answers
// do not undo it; without the setting nothing changes and nobody waits.
func TestDrainServicesOnStop(t *testing.T) {
	lb := netip.MustParsePrefix("2001:db8:1b::1/128")
	for _, secs := range []int32{0, 7} {
		d := testDaemon(t)
		d.spec.Services.DrainOnStopSeconds = secs
		target := &recordingTarget{}
		d.bgpLoop = &reconcile.Loop[map[netip.Prefix]advert.Path]{Name: "bgp", Target: target, Desired: d.state.Adverts, Wake: d.state.Changed()}
		testutil.Run(t, d.bgpLoop.Run)
		d.state.SetServiceRoutes(map[netip.Prefix]nodestate.ServiceRoute{lb: {Path: advert.Path{Kind: advert.Service, Weight: 2}, Owners: []string{"shop/web"}}})
		testutil.Eventually(t, "the route sent", func() (bool, string) { return target.get(lb).Kind == advert.Service, "" })
		var waited time.Duration
		d.drainServices(func(w time.Duration) { waited = w })
		want := advert.Path{Kind: advert.Service, Weight: 2, Drain: secs > 0}
		if got := target.get(lb); got != want {
			t.Errorf("drainOnStopSeconds %d: the speaker holds %+v, want %+v (sent before the wait)", secs, got, want)
		}
		if waited != time.Duration(secs)*time.Second {
			t.Errorf("drainOnStopSeconds %d: waited %v", secs, waited)
		}
		if secs > 0 {
			if !d.draining.Load() {
				t.Fatal("not marked draining")
			}
			d.applyServiceRoutes() // the controller's next answer: ignored (no kube here to ask)
			if got := d.state.ServiceRoutes()[lb].Path; !got.Drain {
				t.Errorf("the drain was undone: %+v", got)
			}
		}
	}
}
