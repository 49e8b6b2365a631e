package daemon

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/advert"
	"code.fritzlab.net/fritzlab/flock/agent/nodestate"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/bgp"
	"code.fritzlab.net/fritzlab/flock/cni/install/conffile"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// speakerSets is a BGP target that remembers what it was told to hold.
type speakerSets struct {
	mu   sync.Mutex
	last map[netip.Prefix]advert.Path
	sets int
}

func (s *speakerSets) Set(_ context.Context, desired map[netip.Prefix]advert.Path, _ bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.sets = desired, s.sets+1
	return nil
}

func (s *speakerSets) held() (map[netip.Prefix]advert.Path, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.sets
}

// withSpeaker gives d a speaker that listens nowhere (leave opens its
// peers).
func withSpeaker(t *testing.T, d *daemon) *bgp.Speaker {
	t.Helper()
	sp, err := bgp.New(bgp.Config{ASN: 65001, RouterID: "192.0.2.1", BGP: v1alpha1.BGP{ListenPort: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Stop)
	d.speaker = sp
	return sp
}

// An uninstall's first steps: the conflist (and the installer's temp dir
// beside it) goes, then every route is withdrawn, confirmed by a pass of
// the BGP loop before leave returns; removePaths takes the files, and
// paths already gone are no error.
func TestLeave(t *testing.T) {
	d := testDaemon(t)
	conf := t.TempDir()
	for _, p := range []string{conffile.ConfName, filepath.Join(conffile.TempDir, "x.tmp"), "10-other.conflist"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(conf, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(conf, p), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d.o.CNIConfDir = conf
	target := &speakerSets{}
	d.bgpLoop = &reconcile.Loop[map[netip.Prefix]advert.Path]{Name: "bgp", Target: target, Desired: d.state.Adverts, Wake: d.state.Changed()}
	testutil.Run(t, d.bgpLoop.Run)
	lb := netip.MustParsePrefix("2001:db8:5e::1/128")
	gen := d.state.SetServiceRoutes(map[netip.Prefix]nodestate.ServiceRoute{lb: {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/web"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.bgpLoop.Wait(ctx, gen); err != nil {
		t.Fatal(err)
	}
	if held, _ := target.held(); len(held) != 2 { // the summary and the Service
		t.Fatalf("before: the speaker holds %v", held)
	}
	d.ready.Store(true)
	sp := withSpeaker(t, d)
	d.spec.BGP.Peers = []v1alpha1.Peer{{Address: "2001:db8:ffff::1", ASN: 65002}}
	// Start-up is still waiting for the Service routes: no peer yet.
	d.leave()
	// The ToR holds the routes of the agent before under graceful
	// restart: leave opens the session, whose End-of-RIB flushes them.
	if n := sp.Neighbors(ctx); len(n) != 1 || n[0].Peer != "2001:db8:ffff::1" {
		t.Errorf("after leave during start-up the speaker has peers %+v, want the ToR", n)
	}
	if held, _ := target.held(); len(held) != 0 {
		t.Errorf("after leave the speaker still holds %v", held)
	}
	for _, p := range []string{conffile.ConfName, conffile.TempDir} {
		if _, err := os.Stat(filepath.Join(conf, p)); !os.IsNotExist(err) {
			t.Errorf("%s left in the conf dir: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(conf, "10-other.conflist")); err != nil {
		t.Errorf("another CNI's conflist went too: %v", err)
	}

	dir := t.TempDir()
	state, plugin := filepath.Join(dir, "var-lib-flock"), filepath.Join(dir, "bin", "flock")
	for _, p := range []string{filepath.Join(state, "records", "a"), plugin, filepath.Join(dir, "bin", "portmap")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d.o.UninstallRemove = []string{state, plugin, filepath.Join(dir, "never-there")}
	d.removePaths()
	for _, p := range []string{state, plugin} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s not removed: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "portmap")); err != nil {
		t.Errorf("another plugin went too: %v", err)
	}
}

// An uninstall that comes while start-up still runs (the stop's
// preparations run before start-up's context ends): start-up must not
// publish the conflist again, nor advertise anything.
func TestLeaveDuringStartup(t *testing.T) {
	d := testDaemon(t)
	conf, run := t.TempDir(), t.TempDir()
	staged := filepath.Join(run, "staged.conflist")
	if err := os.WriteFile(staged, []byte(`{"name":"flock"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d.o.CNIConfDir, d.staged = conf, staged
	if _, err := conffile.Publish(staged, conf); err != nil { // the agent before's
		t.Fatal(err)
	}
	d.leave()                      // not ready yet: start-up is past restore
	(&daemonStartup{d: d}).serve() // start-up goes on
	if _, err := os.Stat(filepath.Join(conf, conffile.ConfName)); err == nil {
		t.Error("start-up published the conflist again after the uninstall removed it")
	}
	if adv, _ := d.state.Adverts(); len(adv) != 0 {
		t.Errorf("after the uninstall the node would advertise %v", adv)
	}
}

// An uninstall that comes while start-up is between originating routes
// and serving waits for it, then withdraws what it originated.
func TestLeaveWaitsForStartup(t *testing.T) {
	d := testDaemon(t)
	withSpeaker(t, d)
	target := &speakerSets{}
	d.bgpLoop = &reconcile.Loop[map[netip.Prefix]advert.Path]{Name: "bgp", Target: target, Desired: d.state.Adverts, Wake: d.state.Changed()}
	lb := netip.MustParsePrefix("2001:db8:5e::1/128")
	d.state.SetServiceRoutes(map[netip.Prefix]nodestate.ServiceRoute{lb: {Path: advert.Path{Kind: advert.Service}, Owners: []string{"shop/web"}}})
	s := &daemonStartup{d: d}
	release := s.hold()
	s.originate(context.Background()) // routes out, start-up not done
	left := make(chan struct{})
	go func() {
		defer close(left)
		d.leave()
	}()
	select {
	case <-left:
		t.Fatal("leave ran between originating and serving")
	case <-time.After(100 * time.Millisecond):
	}
	s.serve()
	release()
	testutil.Run(t, d.bgpLoop.Run) // the serving phase's reconciler
	<-left
	if held, _ := target.held(); len(held) != 0 {
		t.Errorf("after the uninstall the speaker still holds %v", held)
	}
}
