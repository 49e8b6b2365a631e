package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// The LoadBalancer step of TestUpgrade met "no route to host" once in
// about 35 rollouts (RELIABILITY.md, Upgrades), too rarely to catch by
// hand. Two knobs help hunt it:
//
//	FLOCK_UPGRADE_LB_REPEAT=N  roll the DaemonSet N times in that step
//	FLOCK_UPGRADE_LB_DEBUG=dir capture meanwhile, into dir: packets (SYN,
//	                           RST, FIN and ICMP, pcap) and route, neighbour,
//	                           address and link changes in the ToR, vm and
//	                           vm2; nftables and conntrack events (port 80)
//	                           on both nodes; the Service's and its
//	                           EndpointSlices' watch events. Needs tcpdump,
//	                           conntrack and nft (Debian packages).

// lbDebug starts the captures FLOCK_UPGRADE_LB_DEBUG asks for; the
// function it returns stops them.
func lbDebug(t *testing.T, tor, vm2 *lab.NS, kubectl []string) func() {
	dir := os.Getenv("FLOCK_UPGRADE_LB_DEBUG")
	if dir == "" {
		return func() {}
	}
	os.MkdirAll(dir, 0o755)
	var cmds []*exec.Cmd
	start := func(name string, ns *lab.NS, args ...string) {
		c := exec.Command(args[0], args[1:]...)
		if ns != nil {
			c = exec.Command("nsenter", append([]string{"--net=" + ns.Path}, args...)...)
		}
		f, _ := os.Create(filepath.Join(dir, name))
		c.Stdout, c.Stderr = f, f
		if err := c.Start(); err != nil {
			t.Logf("lbdebug %s: %v", name, err)
			return
		}
		cmds = append(cmds, c)
	}
	filter := "icmp6 or icmp or ((tcp port 80 or tcp port 8080) and ((ip and tcp[13] & 7 != 0) or (ip6 and ip6[53] & 7 != 0)))"
	for _, n := range []struct {
		name string
		ns   *lab.NS
	}{{"tor", tor}, {"vm", nil}, {"vm2", vm2}} {
		start(n.name+".pcap.log", n.ns, "tcpdump", "-U", "-n", "-i", "any", "-w", filepath.Join(dir, n.name+".pcap"), filter)
		start(n.name+".mon.txt", n.ns, "ip", "-ts", "monitor", "route", "neigh", "addr", "link")
		if n.ns != tor {
			start(n.name+".nft.txt", n.ns, "nft", "monitor")
			start(n.name+".ct.txt", n.ns, "conntrack", "-E", "-o", "timestamp", "-f", "ipv6", "-p", "tcp", "--orig-port-dst", "80")
		}
	}
	start("svc.txt", nil, append(kubectl, "get", "service", "up-lb", "-w", "--output-watch-events", "-o", "jsonpath={.type} {.object.metadata.resourceVersion} {.object.status.loadBalancer.ingress[*].ip}{\"\\n\"}")...)
	start("eps.txt", nil, append(kubectl, "get", "endpointslices", "-l", "kubernetes.io/service-name=up-lb", "-w", "--output-watch-events", "-o", "json")...)
	return func() {
		for _, c := range cmds {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
		}
	}
}

func lbRepeat() int {
	n := 1
	if s := os.Getenv("FLOCK_UPGRADE_LB_REPEAT"); s != "" {
		fmt.Sscan(s, &n)
	}
	return n
}
