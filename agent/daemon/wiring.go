package daemon

import (
	"context"
	"math/big"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/metrics"
	"code.fritzlab.net/fritzlab/flock/bgp"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

type nodeconfigSpec = v1alpha1.NodeConfigSpec

type speakerRef struct{ p atomic.Pointer[bgp.Speaker] }

func (r *speakerRef) get() *bgp.Speaker { return r.p.Load() }

func (d *daemon) setSpeaker(sp *bgp.Speaker) { d.speaker.p.Store(sp) }

// watchConfig reloads on SIGHUP and whenever the config file changes. The
// directory is watched, not the file, so editors' and ConfigMap-style
// rename-into-place updates are seen too.
func (d *daemon) watchConfig(ctx context.Context, path string) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var events <-chan fsnotify.Event
	if w, err := fsnotify.NewWatcher(); err != nil {
		d.log.Warn("reload: cannot watch the config file; SIGHUP still works", "err", err)
	} else {
		defer w.Close()
		if err := w.Add(filepath.Dir(path)); err != nil {
			d.log.Warn("reload: cannot watch the config dir; SIGHUP still works", "err", err)
		} else {
			events = w.Events
		}
	}
	abs, _ := filepath.Abs(path)
	var debounce <-chan time.Time
	reload := func(why string) {
		d.log.Info("reload: node config", "trigger", why, "file", path)
		if err := d.reload(path); err != nil {
			d.log.Error("reload: keeping the running config", "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			reload("SIGHUP")
		case ev := <-events:
			if p, _ := filepath.Abs(ev.Name); p == abs && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
				// An editor writes in several steps: wait for the burst to end.
				debounce = time.After(100 * time.Millisecond)
			}
		case <-debounce:
			debounce = nil
			reload("file changed")
		}
	}
}

// Admin API.

func (d *daemon) Pods() []admin.Pod     { return agent.AdminSource{A: d.agent}.Pods() }
func (d *daemon) Pools() []admin.Pool   { return agent.AdminSource{A: d.agent}.Pools() }
func (d *daemon) Routes() []admin.Route { return agent.AdminSource{A: d.agent}.Routes() }

func (d *daemon) Neighbors() []admin.Neighbor {
	sp := d.speaker.get()
	if sp == nil {
		return []admin.Neighbor{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := []admin.Neighbor{}
	for _, n := range sp.Neighbors(ctx) {
		an := admin.Neighbor{Peer: n.Peer, Address: n.Address, LocalASN: n.LocalASN, PeerASN: n.PeerASN, State: n.State,
			Since: n.Since, BFD: n.BFD, GR: n.GR, Warnings: n.Warnings, LastError: n.LastError}
		if n.Uptime > 0 {
			an.Uptime = n.Uptime.String()
		}
		for _, f := range n.Families {
			an.Families = append(an.Families, admin.FamilyCounts(f))
		}
		out = append(out, an)
	}
	return out
}

func (d *daemon) BGPRoutes() []admin.BGPRoute {
	names := map[string]string{}
	for _, r := range d.agent.Allocations() {
		names[r.ContainerID] = r.Pod.Namespace + "/" + r.Pod.Name
	}
	var held map[netip.Prefix]string
	if sp := d.speaker.get(); sp != nil {
		held = map[netip.Prefix]string{}
		for p, k := range sp.Held() {
			held[p] = string(k)
		}
	}
	out := []admin.BGPRoute{}
	for _, r := range d.adverts.Routes() {
		br := admin.BGPRoute{Prefix: r.Prefix.String(), Kind: string(r.Kind), Advertised: held[r.Prefix] == string(r.Kind)}
		for _, o := range r.Owners {
			if n, ok := names[o]; ok {
				o = n
			}
			br.Owners = append(br.Owners, o)
		}
		out = append(out, br)
	}
	return out
}

func (d *daemon) metricsSource() metrics.Source {
	return metrics.Source{
		Pools: func() []metrics.PoolUsage {
			var out []metrics.PoolUsage
			for _, p := range d.agent.IPAM() {
				free, _ := new(big.Float).SetString(p.Free)
				f, _ := free.Float64()
				out = append(out, metrics.PoolUsage{CIDR: p.Pool.Prefix.String(), Used: float64(p.Used), Free: f})
			}
			return out
		},
		Advertised: func() map[string]int {
			out := map[string]int{}
			if sp := d.speaker.get(); sp != nil {
				for _, k := range sp.Held() {
					out[string(k)]++
				}
			}
			return out
		},
		Sessions: func() []metrics.Session {
			sp := d.speaker.get()
			if sp == nil {
				return nil
			}
			mis := map[string]bool{}
			for _, k := range sp.Mismatches() {
				mis[k] = true
			}
			var out []metrics.Session
			for _, st := range sp.Sessions() {
				out = append(out, metrics.Session{Peer: st.Peer, Established: st.Established, Mismatch: mis[st.Peer]})
			}
			return out
		},
	}
}
