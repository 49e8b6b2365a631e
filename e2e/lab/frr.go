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
)

// FRR is zebra + bgpd running in a namespace as the ToR. The daemons run in
// the foreground (the lab owns their PIDs) with a pathspace of their own,
// so `vtysh -N <pathspace>` reaches exactly this instance.
type FRR struct {
	NS        *NS
	Dir       string
	Pathspace string
	procs     []*exec.Cmd
	logs      []*syncBuffer
	dones     []chan error
}

// StartFRR writes the configs and starts zebra, then bgpd.
func StartFRR(ns *NS, dir, pathspace, zebraConf, bgpdConf string) (*FRR, error) {
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
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			return nil, err
		}
		_ = os.Chown(p, uid, gid)
	}
	_ = os.Chown(dir, uid, gid)
	for _, d := range []string{"zebra", "bgpd"} {
		log := &syncBuffer{}
		cmd := exec.Command("/usr/lib/frr/"+d, "-N", pathspace, "-f", filepath.Join(dir, d+".conf"))
		cmd.Stdout, cmd.Stderr = log, log
		if err := ns.InNS(cmd.Start); err != nil {
			f.Stop()
			return nil, fmt.Errorf("start %s in %s: %w (is frr installed?)", d, ns.Name, err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		f.procs, f.logs, f.dones = append(f.procs, cmd), append(f.logs, log), append(f.dones, done)
		// bgpd needs zebra's socket; vtysh needs the daemon's vty socket.
		sock := filepath.Join("/var/run/frr", pathspace, d+".vty")
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			select {
			case err := <-done:
				done <- err
				f.Stop()
				return nil, fmt.Errorf("%s exited: %v\n%s", d, err, log.String())
			default:
			}
			if time.Now().After(deadline) {
				f.Stop()
				return nil, fmt.Errorf("%s did not create %s:\n%s", d, sock, log.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return f, nil
}

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
{{- range .Nodes}}
 neighbor {{.Peer}} remote-as {{$.NodeASN}}
{{- if .Iface}}
 neighbor {{.Peer}} interface {{.Iface}}
{{- end}}
 neighbor {{.Peer}} capability extended-nexthop
 neighbor {{.Peer}} timers 3 9
 neighbor {{.Peer}} timers connect 1
{{- end}}
 !
 address-family ipv4 unicast
  maximum-paths 8
{{- range .Nodes}}
  neighbor {{.Peer}} activate
{{- end}}
 exit-address-family
 !
 address-family ipv6 unicast
  maximum-paths 8
{{- range .Nodes}}
  neighbor {{.Peer}} activate
{{- end}}
 exit-address-family
exit
!
`))

// FRRConfig renders bgpd.conf for the lab. lls maps unnumbered node
// indexes to the node's link-local address.
func (l *BGPLab) FRRConfig(lls map[int]string) string {
	type node struct{ Peer, Iface string }
	data := struct {
		Dir             string
		TorASN, NodeASN int
		Nodes           []node
	}{Dir: l.frrDir, TorASN: TorASN, NodeASN: NodeASN}
	for _, n := range l.Nodes {
		if ll, ok := lls[n.Index]; ok {
			data.Nodes = append(data.Nodes, node{Peer: ll, Iface: n.TorIf})
		} else {
			data.Nodes = append(data.Nodes, node{Peer: n.V6.String()})
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
	dir, err := os.MkdirTemp("", "flock-frr-")
	if err != nil {
		return err
	}
	l.frrDir = dir
	f, err := StartFRR(l.Tor, dir, l.Opts.Prefix+"tor", "hostname tor\n", l.FRRConfig(lls))
	if err != nil {
		return err
	}
	l.FRR = f
	return nil
}
