package k8slab

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
)

// SvcChain is the lab's nat chain, jumped to from OUTPUT, that stands in for
// kube-proxy for connections from the host network namespace.
const SvcChain = "FLOCKLAB-SVC"

// kubeletChains are the chains kubelet creates on start and never removes.
var kubeletChains = []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"}

var builtinChains = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
}

func ipt(bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, append([]string{"-w"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// installServiceDNAT makes the kubernetes Service address reach the
// apiserver from the host netns: nat OUTPUT sees locally generated
// connections before routing is final, and DNAT there to 127.0.0.1 needs no
// route_localnet. Any leftover chain of an earlier lab is replaced.
func installServiceDNAT() error {
	if err := removeChains("iptables", []string{SvcChain}); err != nil {
		return err
	}
	rules := [][]string{
		{"-t", "nat", "-N", SvcChain},
		{"-t", "nat", "-A", SvcChain, "-d", KubernetesServiceIP + "/32", "-p", "tcp", "--dport", "443",
			"-j", "DNAT", "--to-destination", "127.0.0.1:" + strconv.Itoa(APIServerPort)},
		{"-t", "nat", "-I", "OUTPUT", "-j", SvcChain},
	}
	for _, r := range rules {
		if _, err := ipt("iptables", r...); err != nil {
			return fmt.Errorf("install service DNAT: %w", err)
		}
	}
	return nil
}

// ChainExists reports whether table has chain, for tests of Down.
func ChainExists(bin, table, chain string) bool {
	_, err := ipt(bin, "-t", table, "-S", chain)
	return err == nil
}

// removeChains deletes every rule in a built-in chain that jumps to one of
// chains, then flushes and deletes the chains, in filter, nat and mangle.
// Absent chains are not an error.
func removeChains(bin string, chains []string) error {
	var errs []error
	for table, builtins := range builtinChains {
		for _, b := range builtins {
			errs = append(errs, deleteJumps(bin, table, b, chains))
		}
		for _, ch := range chains {
			if !ChainExists(bin, table, ch) {
				continue
			}
			_, err1 := ipt(bin, "-t", table, "-F", ch)
			_, err2 := ipt(bin, "-t", table, "-X", ch)
			errs = append(errs, err1, err2)
		}
	}
	return errors.Join(errs...)
}

// deleteJumps removes the rules of table/chain whose target is in targets,
// by rule number from the highest down so numbers stay valid.
func deleteJumps(bin, table, chain string, targets []string) error {
	out, err := ipt(bin, "-t", table, "-L", chain, "-n", "--line-numbers")
	if err != nil {
		return nil // table or chain not present
	}
	var nums []int
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, err := strconv.Atoi(f[0])
		if err != nil {
			continue // header lines
		}
		for _, t := range targets {
			if f[1] == t {
				nums = append(nums, n)
			}
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(nums)))
	var errs []error
	for _, n := range nums {
		_, err := ipt(bin, "-t", table, "-D", chain, strconv.Itoa(n))
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeIptables undoes the lab's chain and kubelet's, for IPv4 and IPv6.
func removeIptables() error {
	errs := []error{removeChains("iptables", append(append([]string{SvcChain}, kubeletChains...), portmapChains("iptables")...))}
	errs = append(errs, removeChains("ip6tables", append(append([]string{}, kubeletChains...), portmapChains("ip6tables")...)))
	return errors.Join(errs...)
}

// portmapChains are the nat chains the portmap plugin made (its
// CNI-HOSTPORT-* and one CNI-DN-*/CNI-SN-* per sandbox). A DEL removes a
// sandbox's, but a lab whose test process was killed never runs it, and
// a stale DNAT chain ahead of a new one sends its hostPort to a dead IP.
func portmapChains(bin string) []string {
	out, err := ipt(bin, "-t", "nat", "-S")
	if err != nil {
		return nil
	}
	var chains []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "-N" && (strings.HasPrefix(f[1], "CNI-HOSTPORT-") || strings.HasPrefix(f[1], "CNI-DN-") || strings.HasPrefix(f[1], "CNI-SN-")) {
			chains = append(chains, f[1])
		}
	}
	// A chain is deleted once nothing jumps to it: the entry chains
	// (DNAT, MASQ) first, then the per-sandbox ones, SETMARK (which those
	// jump to) last.
	rank := func(c string) int {
		switch {
		case c == "CNI-HOSTPORT-SETMARK":
			return 2
		case strings.HasPrefix(c, "CNI-HOSTPORT-"):
			return 0
		}
		return 1
	}
	sort.SliceStable(chains, func(i, j int) bool { return rank(chains[i]) < rank(chains[j]) })
	return chains
}
