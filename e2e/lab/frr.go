package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// FRR is zebra + bgpd running in a namespace as the ToR. The daemons run in
// the foreground (the lab owns their PIDs) with a pathspace of their own,
// so `vtysh -N <pathspace>` reaches exactly this instance.
type FRR struct {
	NS        *NS
	Dir       string
	Pathspace string
	daemons   []string
	names     []string // of procs
	procs     []*exec.Cmd
	logs      []*testutil.SyncBuffer
	dones     []chan error
}

// StartFRR writes the configs and starts zebra, then bgpd (and bfdd
// before bgpd when bfddConf is not empty).
func StartFRR(ns *NS, dir, pathspace, zebraConf, bgpdConf string, bfddConf ...string) (*FRR, error) {
	// FRR drops to the frr user before reading its config, so the config
	// lives in a directory of its own that frr owns (a test's temp dir is
	// not traversable for other users).
	if dir == "" {
		d, err := os.MkdirTemp("", "flock-frr-")
		if err != nil {
			return nil, err
		}
		dir = d
	}
	f := &FRR{NS: ns, Dir: dir, Pathspace: pathspace}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	uid, gid := frrIDs()
	files := map[string]string{"zebra.conf": zebraConf, "bgpd.conf": bgpdConf}
	f.daemons = []string{"zebra", "bgpd"}
	if len(bfddConf) > 0 && bfddConf[0] != "" {
		files["bfdd.conf"] = bfddConf[0]
		f.daemons = []string{"zebra", "bfdd", "bgpd"}
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			return nil, err
		}
		_ = os.Chown(p, uid, gid)
	}
	_ = os.Chown(dir, uid, gid)
	if err := f.start(); err != nil {
		f.Stop()
		return nil, err
	}
	return f, nil
}

// start runs the daemons in order, each once the previous one answers.
func (f *FRR) start() error {
	for _, d := range f.daemons {
		if err := f.startOne(d); err != nil {
			return err
		}
	}
	return nil
}

func (f *FRR) startOne(d string) error {
	log := &testutil.SyncBuffer{}
	cmd := exec.Command("/usr/lib/frr/"+d, "-N", f.Pathspace, "-f", filepath.Join(f.Dir, d+".conf"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := f.NS.InNS(cmd.Start); err != nil {
		return fmt.Errorf("start %s in %s: %w (is frr installed?)", d, f.NS.Name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	f.procs, f.logs, f.dones, f.names = append(f.procs, cmd), append(f.logs, log), append(f.dones, done), append(f.names, d)
	// bgpd needs zebra's socket; vtysh needs the daemon's vty socket.
	sock := filepath.Join("/var/run/frr", f.Pathspace, d+".vty")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("%s exited: %v\n%s", d, err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not create %s:\n%s", d, sock, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// KillDaemon SIGKILLs one daemon (e.g. bfdd: the ToR's BFD sessions are
// re-created with new discriminators) and starts it again.
func (f *FRR) KillDaemon(d string) error {
	for i, name := range f.names {
		if name != d || f.procs[i].Process == nil {
			continue
		}
		_ = f.procs[i].Process.Kill()
		err := <-f.dones[i]
		f.dones[i] <- err
		f.procs = append(f.procs[:i], f.procs[i+1:]...)
		f.dones = append(f.dones[:i], f.dones[i+1:]...)
		f.names = append(f.names[:i], f.names[i+1:]...)
		for _, ext := range []string{".vty", ".pid"} {
			_ = os.Remove(filepath.Join("/var/run/frr", f.Pathspace, d+ext))
		}
		return f.startOne(d)
	}
	return fmt.Errorf("frr: no %s running", d)
}

// Kill SIGKILLs every daemon (a ToR crash: no NOTIFICATION, no BFD
// AdminDown) and waits for them; Restart brings them back.
func (f *FRR) Kill() {
	for i, p := range f.procs {
		if p.Process == nil {
			continue
		}
		_ = p.Process.Kill()
		err := <-f.dones[i]
		f.dones[i] <- err
	}
	f.procs, f.dones, f.names = nil, nil, nil
	// Stale sockets would make start() think a daemon is up already.
	entries, _ := os.ReadDir(filepath.Join("/var/run/frr", f.Pathspace))
	for _, e := range entries {
		_ = os.Remove(filepath.Join("/var/run/frr", f.Pathspace, e.Name()))
	}
}

// Restart starts the daemons again after Kill.
func (f *FRR) Restart() error { return f.start() }

func frrIDs() (int, int) {
	u, err := user.Lookup("frr")
	if err != nil {
		return 0, 0
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid
}

// Vtysh runs one vtysh command against this instance.
func (f *FRR) Vtysh(command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "vtysh", "-N", f.Pathspace, "-c", command).CombinedOutput()
	// vtysh warns about a missing per-pathspace vtysh.conf; that is noise.
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.Contains(l, "vtysh.conf") {
			lines = append(lines, l)
		}
	}
	s := strings.Join(lines, "\n")
	if err != nil {
		return s, fmt.Errorf("vtysh -c %q: %w: %s", command, err, s)
	}
	return s, nil
}

// Log returns the daemons' output.
func (f *FRR) Log() string {
	var b strings.Builder
	for _, l := range f.logs {
		b.WriteString(l.String())
	}
	return b.String()
}

// Stop ends bgpd and zebra and removes the pathspace's run directory.
func (f *FRR) Stop() {
	for i := len(f.procs) - 1; i >= 0; i-- {
		p := f.procs[i]
		if p.Process == nil {
			continue
		}
		_ = p.Process.Signal(os.Interrupt)
		select {
		case err := <-f.dones[i]:
			f.dones[i] <- err
		case <-time.After(5 * time.Second):
			_ = p.Process.Kill()
			<-f.dones[i]
		}
	}
	_ = os.RemoveAll(filepath.Join("/var/run/frr", f.Pathspace))
	_ = os.RemoveAll(f.Dir)
}

var frrTmpl = template.Must(template.New("frr").Parse(`frr defaults datacenter
hostname tor
log file {{.Dir}}/bgpd.log informational
!
router bgp {{.TorASN}}
 bgp router-id 10.255.0.1
 no bgp ebgp-requires-policy
 no bgp default ipv4-unicast
 bgp bestpath as-path multipath-relax
{{- if .GR}}
 bgp graceful-restart
{{- end}}
{{- if .Dynamic}}
 ! Server ports as most ToRs configure them: one peer group, neighbours
 ! accepted from the link ranges (FRR only listens; the node connects).
 neighbor NODES peer-group
 neighbor NODES remote-as {{.NodeASN}}
 neighbor NODES capability extended-nexthop
 neighbor NODES timers 3 9
{{- if .BFD}}
 neighbor NODES bfd
 neighbor NODES bfd profile flock
{{- if .CheckCPFailure}}
 neighbor NODES bfd check-control-plane-failure
{{- end}}
{{- end}}
 bgp listen range fd00::/16 peer-group NODES
{{- end}}
{{- range .Nodes}}
 neighbor {{.Peer}} remote-as {{$.NodeASN}}
{{- if .Iface}}
 neighbor {{.Peer}} interface {{.Iface}}
{{- end}}
 neighbor {{.Peer}} capability extended-nexthop
 neighbor {{.Peer}} timers 3 9
 neighbor {{.Peer}} timers connect 1
{{- if .Source}}
 ! The session's source pinned, as deploy/tor/frr.conf recommends.
 neighbor {{.Peer}} update-source {{.Source}}
{{- end}}
{{- if $.BFD}}
 neighbor {{.Peer}} bfd
 neighbor {{.Peer}} bfd profile flock
{{- if $.CheckCPFailure}}
 neighbor {{.Peer}} bfd check-control-plane-failure
{{- end}}
{{- end}}
{{- end}}
 !
 address-family ipv4 unicast
  maximum-paths 8
{{- if .Dynamic}}
  neighbor NODES activate
  neighbor NODES prefix-list NOTHING-V4 out
{{- end}}
{{- range .Nodes}}
  neighbor {{.Peer}} activate
{{- end}}
 exit-address-family
 !
 address-family ipv6 unicast
  maximum-paths 8
{{- if .Dynamic}}
  neighbor NODES activate
  neighbor NODES prefix-list NOTHING-V6 out
{{- end}}
{{- range .Nodes}}
  neighbor {{.Peer}} activate
{{- end}}
 exit-address-family
exit
!
{{- if .Dynamic}}
! The listen range's nodes are sent nothing, as deploy/tor/frr.conf's.
ip prefix-list NOTHING-V4 seq 10 deny any
ipv6 prefix-list NOTHING-V6 seq 10 deny any
{{- end}}
`))

// FRRBFDConfig is bfdd.conf for the lab: the profile flock's neighbours use
// (300 ms × 3, the node's default).
const FRRBFDConfig = `hostname tor
!
bfd
 profile flock
  detect-multiplier 3
  receive-interval 300
  transmit-interval 300
 exit
 !
exit
!
`

// FRROptions vary the ToR's FRR config.
type FRROptions struct {
	// Unnumbered maps node indexes to the node's link-local address: those
	// nodes are peered over the link (neighbor <ll> interface <if>).
	Unnumbered map[int]string
	// Dynamic peers the nodes through `bgp listen range` and a peer group
	// instead of one neighbor statement each (unnumbered nodes excepted).
	Dynamic bool
	// BFD runs bfdd and enables BFD on every neighbour.
	BFD bool
	// CheckCPFailure: `bfd check-control-plane-failure` (with GR: a BFD
	// Down from a peer without the C bit does not end its GR helper mode).
	CheckCPFailure bool
	// GR: FRR is graceful-restart capable (restarting speaker); as helper
	// it is by default.
	GR bool
}

// FRRConfig renders bgpd.conf for the lab. lls maps unnumbered node
// indexes to the node's link-local address.
func (l *BGPLab) FRRConfig(lls map[int]string) string {
	return l.FRRConfigWith(FRROptions{Unnumbered: lls})
}

// FRRConfigWith renders bgpd.conf for the lab.
func (l *BGPLab) FRRConfigWith(o FRROptions) string {
	type node struct{ Peer, Iface, Source string }
	data := struct {
		Dir                              string
		TorASN, NodeASN                  int
		Dynamic, BFD, CheckCPFailure, GR bool
		Nodes                            []node
	}{Dir: l.frrDir, TorASN: TorASN, NodeASN: NodeASN, Dynamic: o.Dynamic, BFD: o.BFD, CheckCPFailure: o.CheckCPFailure, GR: o.GR}
	for _, n := range l.Nodes {
		if ll, ok := o.Unnumbered[n.Index]; ok {
			data.Nodes = append(data.Nodes, node{Peer: ll, Iface: n.TorIf})
		} else if !o.Dynamic {
			data.Nodes = append(data.Nodes, node{Peer: n.V6.String(), Source: n.TorV6.String()})
		}
	}
	var b strings.Builder
	if err := frrTmpl.Execute(&b, data); err != nil {
		panic(err)
	}
	return b.String()
}

// StartFRR runs FRR as the ToR.
func (l *BGPLab) StartFRR(lls map[int]string) error {
	return l.StartFRRWith(FRROptions{Unnumbered: lls})
}

// StartFRRWith runs FRR as the ToR with the given options.
func (l *BGPLab) StartFRRWith(o FRROptions) error {
	dir, err := os.MkdirTemp("", "flock-frr-")
	if err != nil {
		return err
	}
	l.frrDir = dir
	bfdd := ""
	if o.BFD {
		bfdd = FRRBFDConfig
	}
	f, err := StartFRR(l.Tor, dir, l.Opts.Prefix+"tor", "hostname tor\n", l.FRRConfigWith(o), bfdd)
	if err != nil {
		return err
	}
	l.FRR = f
	return nil
}
