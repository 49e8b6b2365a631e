package bgp

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

type failingLinks struct{}

func (failingLinks) Watch(context.Context) (<-chan Carrier, error) {
	return nil, errors.New("no netlink here")
}

// endedLinks: the watch ends on its own (a Recvfrom error) before Run
// does. Run must return all the same, as with failingLinks.
type endedLinks struct{}

func (endedLinks) Watch(context.Context) (<-chan Carrier, error) {
	ch := make(chan Carrier)
	close(ch)
	return ch, nil
}

func runReturns(t *testing.T, l Links) {
	sp := newIdleSpeaker(t, func(c *Config) { c.Links = l })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sp.Run(ctx) }()
	time.Sleep(300 * time.Millisecond) // Run is in its loop (saw the close)
	cancel()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestRunReturnsWhenCarrierWatchFails(t *testing.T) { runReturns(t, failingLinks{}) }
func TestRunReturnsWhenCarrierWatchEnded(t *testing.T) { runReturns(t, endedLinks{}) }

// A BFD reset in flight when the carrier goes: the peer is deleted, the
// queued NOTIFICATION with it, and so is bfdReset: else the next
// session's ordinary end would delete the peer again (GR's stale routes
// gone).
func TestCarrierLossClearsBFDReset(t *testing.T) {
	sp := newIdleSpeaker(t, func(c *Config) { c.Neighbours = &fakeNeighbours{} })
	ctx := context.Background()
	addr := netip.MustParseAddr("fd00::1")
	add := func() {
		if err := sp.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{Conf: &api.PeerConf{NeighborAddress: addr.String(), PeerAsn: torASN, AdminDown: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	add()
	spec := v1alpha1.Peer{Interface: "eth9", ASN: torASN}
	key := Key(spec)
	p := &peer{key: key, spec: spec, fp: "fake", added: true, enabled: true, apiAddr: addr, state: bgp.BGP_FSM_ESTABLISHED, since: time.Now(), bfdReset: true}
	sp.mu.Lock()
	sp.want[key] = wantPeer{spec: spec, fp: "fake"}
	sp.peers[key] = p
	sp.mu.Unlock()
	ev := func(st bgp.FSMState, msg string) *apiutil.WatchEventMessage_PeerEvent {
		return &apiutil.WatchEventMessage_PeerEvent{Type: apiutil.PEER_EVENT_STATE, Peer: apiutil.Peer{
			Conf:  apiutil.PeerConf{NeighborInterface: "eth9", PeerASN: torASN},
			State: apiutil.PeerState{NeighborAddress: addr, PeerASN: torASN, SessionState: st, DisconnectMessage: msg},
		}}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	sp.handleCarrier(ctx, Carrier{Iface: "eth9", Up: false}, time.Now())
	sp.mu.Lock()
	if p.added {
		sp.mu.Unlock()
		t.Fatal("setup: peer not deleted")
	}
	sp.mu.Unlock()
	sp.handlePeerEvent(ctx, &wg, ev(bgp.BGP_FSM_IDLE, "")) // the deleted session's end
	// Added again (syncPeers), the next session comes up, then ends by
	// the ToR's graceful restart.
	add()
	sp.mu.Lock()
	p.added, p.enabled, p.apiAddr = true, true, addr
	sp.mu.Unlock()
	sp.handlePeerEvent(ctx, &wg, ev(bgp.BGP_FSM_ESTABLISHED, ""))
	sp.handlePeerEvent(ctx, &wg, ev(bgp.BGP_FSM_ACTIVE, "peer restarting"))
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !p.added || !p.enabled {
		t.Errorf("a later session's ordinary end deleted the peer (stale bfdReset from before the carrier loss): added %v enabled %v", p.added, p.enabled)
	}
}
