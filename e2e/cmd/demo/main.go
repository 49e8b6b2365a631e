// Command demo runs flock's local demo lab: a ToR network namespace running
// BIRD 2 and two node namespaces, each running flock-agent in standalone
// mode with its embedded BGP speaker peering with the ToR. Pods are created
// through libcni (as containerd would), then the demo prints the BGP
// sessions, the ToR's routes and ping results, and tears everything down
// (or, with -keep, leaves it running until `demo -down`).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

const (
	prefix    = "demo-"
	stateFile = "/run/flock-demo/state.json"
)

// state is what -down needs to clean up a kept lab.
type state struct {
	Dir        string   `json:"dir"`
	PIDs       []int    `json:"pids"`
	Namespaces []string `json:"namespaces"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("bin", "bin", "directory with the flock binaries (make build)")
	keep := flag.Bool("keep", false, "leave the lab running; tear it down later with -down")
	down := flag.Bool("down", false, "tear down a lab left running by -keep")
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("the demo creates network namespaces: run it as root")
	}
	if *down {
		return teardown()
	}
	if _, err := os.Stat(stateFile); err == nil {
		return fmt.Errorf("a kept demo lab is still running (%s): run `make demo-down` first", stateFile)
	}
	binDir, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	for _, b := range []string{"flock", "flock-agent", "flockctl"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return fmt.Errorf("%s missing in %s: run `make build` first", b, binDir)
		}
	}
	if _, err := exec.LookPath("bird"); err != nil {
		return errors.New("bird not found: install Debian's bird2 (make deps)")
	}
	dir, err := os.MkdirTemp("", "flock-demo-")
	if err != nil {
		return err
	}
	step := func(format string, a ...any) { fmt.Printf("\n== "+format+"\n", a...) }

	step("lab: ToR (BIRD 2, AS %d) + 2 nodes (flock-agent, AS %d), one veth each", lab.TorASN, lab.NodeASN)
	l, err := lab.NewBGPLab(lab.LabOptions{Prefix: prefix, Dir: dir, BinDir: binDir, Nodes: 2})
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	var pods []*lab.NS
	cleanup := func() {
		fmt.Println("\n== teardown")
		for _, n := range l.Nodes {
			// CNI DEL for every pod, as the runtime would.
			var recs []struct {
				ContainerID, Namespace, Name string
			}
			if out, err := exec.Command(filepath.Join(binDir, "flockctl"), "--socket", n.Agent.AdminSocket, "-o", "json", "pods").Output(); err == nil {
				_ = json.Unmarshal(out, &recs)
			}
			for _, r := range recs {
				ns := &lab.NS{Name: prefix + "pod-" + r.Name, Path: filepath.Join(lab.NetnsDir, prefix+"pod-"+r.Name)}
				report("CNI DEL "+r.Name, n.CNI.Del(context.Background(), lab.Pod{ContainerID: r.ContainerID, NS: ns, Args: lab.PodArgs(r.Namespace, r.Name)}))
			}
		}
		for _, p := range pods {
			report("delete netns "+p.Name, p.Delete())
		}
		report("stop agents and BIRD, delete lab namespaces", l.Close())
		report("remove "+dir, os.RemoveAll(dir))
	}
	ok := false
	defer func() {
		if !ok || !*keep {
			cleanup()
		}
	}()
	if err := l.StartBird(lab.BirdOptions{GR: true}); err != nil {
		return err
	}
	for _, n := range l.Nodes {
		fmt.Printf("%s: uplink %s / %s, summaries %s %s, agent pid %d\n", n.Name, n.V6, n.V4, n.Summary6, n.Summary4, n.Agent.Pid())
	}
	if err := waitUp(binDir, l); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	step("pods through libcni (the flock plugin binary, as containerd runs it)")
	specs := []struct {
		node  int
		name  string
		extra []string
	}{
		{0, "web-1", []string{"FLOCK_APP", "web", "flock.fritzlab.net/anycast", "2001:db8:a::80,203.0.113.80"}},
		{1, "web-2", []string{"FLOCK_APP", "web", "flock.fritzlab.net/anycast", "2001:db8:a::80,203.0.113.80"}},
		{0, "db-1", []string{"FLOCK_APP", "db", "flock.fritzlab.net/cidr6", "2001:db8:100::100/120"}},
		{1, "api-1", []string{"FLOCK_APP", "api"}},
	}
	ips := map[string][]netip.Addr{}
	nsOf := map[string]*lab.NS{}
	for i, s := range specs {
		ns, err := lab.NewNS(prefix + "pod-" + s.name)
		if err != nil {
			return err
		}
		pods = append(pods, ns)
		nsOf[s.name] = ns
		n := l.Nodes[s.node]
		// Namespace default: the lab's AddressPools (lab.LabAddressPools)
		// give the anycast range to it alone.
		p := lab.Pod{ContainerID: fmt.Sprintf("demo%04d", i+1), NS: ns, Args: lab.PodArgs("default", s.name, s.extra...)}
		start := time.Now()
		res, err := n.CNI.Add(ctx, p)
		if err != nil {
			return fmt.Errorf("ADD %s: %w", s.name, err)
		}
		ips[s.name] = resultIPs(res)
		fmt.Printf("ADD %-6s on %s -> %v  (%s)\n", s.name, n.Name, ips[s.name], time.Since(start).Round(time.Microsecond))
	}
	time.Sleep(500 * time.Millisecond) // let the ToR settle before showing it

	for _, n := range l.Nodes {
		step("%s: flockctl bgp neighbors", n.Name)
		fmt.Print(flockctl(binDir, n, "bgp", "neighbors"))
	}
	step("node1: flockctl bgp routes")
	fmt.Print(flockctl(binDir, l.Nodes[0], "bgp", "routes"))
	step("node1: flockctl routes (anycast and addresses host routes: kernel and wanted)")
	fmt.Print(flockctl(binDir, l.Nodes[0], "routes"))
	step("node1: flockctl status")
	fmt.Print(flockctl(binDir, l.Nodes[0], "status"))
	step("ToR: birdc show route")
	out, err := l.Bird.Cmd("show route")
	fmt.Print(out)
	if err != nil {
		return err
	}

	step("pings")
	failed := 0
	ping := func(from *lab.NS, to netip.Addr, label string) {
		err := lab.Ping(from, to, 3*time.Second)
		status := "ok"
		if err != nil {
			status, failed = "FAIL: "+err.Error(), failed+1
		}
		fmt.Printf("%-34s %-34s %s\n", label, to, status)
	}
	for _, s := range specs {
		for _, ip := range ips[s.name] {
			ping(l.Tor, ip, "ToR -> "+s.name)
		}
	}
	for _, ip := range ips["api-1"] {
		ping(nsOf["web-1"], ip, "web-1 (node1) -> api-1 (node2)")
	}
	for _, ip := range ips["db-1"] {
		ping(nsOf["api-1"], ip, "api-1 (node2) -> db-1 (node1)")
	}
	for _, a := range []string{"2001:db8:a::80", "203.0.113.80"} {
		ping(l.Tor, netip.MustParseAddr(a), "ToR -> anycast (ECMP, 2 nodes)")
	}
	if failed > 0 {
		return fmt.Errorf("%d pings failed", failed)
	}
	fmt.Println("\nall pings answered")
	ok = true
	if *keep {
		st := state{Dir: dir}
		for _, n := range l.Nodes {
			st.PIDs = append(st.PIDs, n.Agent.Pid())
			st.Namespaces = append(st.Namespaces, n.NS.Name)
		}
		st.PIDs = append(st.PIDs, l.Bird.Pid())
		st.Namespaces = append(st.Namespaces, l.Tor.Name)
		for _, p := range pods {
			st.Namespaces = append(st.Namespaces, p.Name)
		}
		if err := os.MkdirAll(filepath.Dir(stateFile), 0o755); err != nil {
			return err
		}
		b, _ := json.MarshalIndent(st, "", "  ")
		if err := os.WriteFile(stateFile, b, 0o644); err != nil {
			return err
		}
		fmt.Printf("\nlab left running. Try:\n  bin/flockctl --socket %s bgp neighbors\n  birdc -s %s show route\n  ip netns exec %spod-web-1 ping 2001:db8:a::80\nTear down with: make demo-down\n",
			l.Nodes[0].Agent.AdminSocket, l.Bird.Socket, prefix)
		// The processes must outlive this one.
		for _, n := range l.Nodes {
			n.Agent.Detach()
		}
		l.Bird.Detach()
	}
	return nil
}

func waitUp(binDir string, l *lab.BGPLab) error {
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range l.Nodes {
		for {
			var nb []struct{ State string }
			out, err := exec.Command(filepath.Join(binDir, "flockctl"), "--socket", n.Agent.AdminSocket, "-o", "json", "bgp", "neighbors").Output()
			if err == nil && json.Unmarshal(out, &nb) == nil && len(nb) > 0 && nb[0].State == "Established" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: BGP session not Established after 30s", n.Name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func flockctl(binDir string, n *lab.LabNode, args ...string) string {
	out, err := exec.Command(filepath.Join(binDir, "flockctl"), append([]string{"--socket", n.Agent.AdminSocket}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("flockctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// teardown stops what a kept lab left running: only the PIDs it recorded,
// and only if they still run the lab's programs.
func teardown() error {
	b, err := os.ReadFile(stateFile)
	if err != nil {
		return fmt.Errorf("no kept demo lab (%w)", err)
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%s: %w", stateFile, err)
	}
	for _, pid := range st.PIDs {
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			continue // already gone
		}
		if !strings.Contains(string(cmdline), "flock-agent") && !strings.Contains(string(cmdline), "bird") {
			fmt.Printf("pid %d is no longer a lab process; leaving it alone\n", pid)
			continue
		}
		report(fmt.Sprintf("stop pid %d", pid), syscall.Kill(pid, syscall.SIGTERM))
	}
	time.Sleep(500 * time.Millisecond)
	for _, ns := range st.Namespaces {
		n := &lab.NS{Name: ns, Path: filepath.Join(lab.NetnsDir, ns)}
		report("delete netns "+ns, n.Delete())
	}
	report("remove "+st.Dir, os.RemoveAll(st.Dir))
	return os.Remove(stateFile)
}

func resultIPs(r types.Result) []netip.Addr {
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func report(what string, err error) {
	if err != nil {
		fmt.Printf("%s: %v\n", what, err)
		return
	}
	fmt.Println(what)
}
