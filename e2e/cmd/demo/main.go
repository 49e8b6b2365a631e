// Command demo runs flock's local demo lab: a "node" network namespace with
// flock-agent in standalone mode on an embedded default NodeConfig, a few
// pods created through libcni (as containerd would), pings between node and
// pods in both families, then a clean teardown.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

//go:embed nodeconfig.yaml
var defaultConfig string

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type pod struct {
	lab.Pod
	ips []netip.Addr
}

func run() error {
	bin := flag.String("bin", "bin", "directory with the flock binaries (make build)")
	config := flag.String("config", "", "NodeConfig file (default: the embedded demo config)")
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("the demo creates network namespaces: run it as root")
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
	cfg := defaultConfig
	if *config != "" {
		b, err := os.ReadFile(*config)
		if err != nil {
			return err
		}
		cfg = string(b)
	}

	var cleanup []func()
	defer func() {
		fmt.Println("\n== teardown")
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	step := func(format string, a ...any) { fmt.Printf("\n== "+format+"\n", a...) }

	step("network namespace \"node\" with flock-agent (standalone mode)")
	node, err := lab.NewNS("node")
	if err != nil {
		return fmt.Errorf("%w (a netns named node exists already: `ip netns del node` if it is a leftover)", err)
	}
	cleanup = append(cleanup, func() { report("delete netns node", node.Delete()) })
	nodeV6, nodeV4 := netip.MustParseAddr("fd00:ffff::1"), netip.MustParseAddr("192.0.2.1")
	for _, ip := range []netip.Addr{nodeV6, nodeV4} {
		if err := node.AddAddr(ip); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("", "flock-demo-")
	if err != nil {
		return err
	}
	cleanup = append(cleanup, func() { report("remove "+dir, os.RemoveAll(dir)) })
	agent, err := lab.NewAgent(node, dir, cfg)
	if err != nil {
		return err
	}
	if err := agent.Start(filepath.Join(binDir, "flock-agent"), 30*time.Second); err != nil {
		return err
	}
	cleanup = append(cleanup, func() { report(fmt.Sprintf("stop flock-agent (pid %d)", agent.Pid()), agent.Stop()) })
	fmt.Printf("flock-agent pid %d, CNI socket %s\n", agent.Pid(), agent.CNISocket)

	cni, err := lab.NewCNI(binDir, filepath.Join(dir, "cni-cache"), agent.CNISocket, "1.1.0")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	step("pods through libcni (the flock plugin binary, as containerd runs it)")
	specs := []struct {
		name  string
		extra []string
	}{
		{"web-1", []string{"FLOCK_APP", "web", "flock.fritzlab.net/anycast", "2001:db8:a::80"}},
		{"web-2", []string{"FLOCK_APP", "web", "flock.fritzlab.net/anycast", "2001:db8:a::80"}},
		{"db-1", []string{"FLOCK_APP", "db", "flock.fritzlab.net/ip-algo", "sequential"}},
	}
	var pods []*pod
	for i, s := range specs {
		ns, err := lab.NewNS(fmt.Sprintf("pod-%s", s.name))
		if err != nil {
			return err
		}
		cleanup = append(cleanup, func() { report("delete netns "+ns.Name, ns.Delete()) })
		p := &pod{Pod: lab.Pod{ContainerID: fmt.Sprintf("demo%04d", i+1), NS: ns, Args: lab.PodArgs("demo", s.name, s.extra...)}}
		start := time.Now()
		res, err := cni.Add(ctx, p.Pod)
		if err != nil {
			return fmt.Errorf("ADD %s: %w", s.name, err)
		}
		cleanup = append(cleanup, func() { report("CNI DEL "+s.name, cni.Del(context.Background(), p.Pod)) })
		p.ips = resultIPs(res)
		fmt.Printf("ADD %-6s -> %v  (%s)\n", s.name, p.ips, time.Since(start).Round(time.Microsecond))
		pods = append(pods, p)
	}

	for _, c := range []string{"pods", "ipam", "routes"} {
		step("flockctl %s", c)
		out, err := exec.Command(filepath.Join(binDir, "flockctl"), "--socket", agent.AdminSocket, c).CombinedOutput()
		fmt.Print(string(out))
		if err != nil {
			return fmt.Errorf("flockctl %s: %w", c, err)
		}
	}

	step("pings")
	failed := 0
	ping := func(from *lab.NS, to netip.Addr, label string) {
		err := lab.Ping(from, to, 3*time.Second)
		status := "ok"
		if err != nil {
			status, failed = "FAIL: "+err.Error(), failed+1
		}
		fmt.Printf("%-26s %-34s %s\n", label, to, status)
	}
	for _, p := range pods {
		for _, ip := range p.ips {
			ping(node, ip, "node -> "+p.NS.Name)
		}
		ping(p.NS, nodeV6, p.NS.Name+" -> node")
		ping(p.NS, nodeV4, p.NS.Name+" -> node")
	}
	for _, ip := range pods[2].ips {
		ping(pods[0].NS, ip, pods[0].NS.Name+" -> "+pods[2].NS.Name)
	}
	ping(node, netip.MustParseAddr("2001:db8:a::80"), "node -> anycast (ECMP)")
	if failed > 0 {
		return fmt.Errorf("%d pings failed", failed)
	}
	fmt.Println("\nall pings answered")
	return nil
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
	fmt.Println(strings.TrimSpace(what))
}
