package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

// TestAddressAuthority: standalone nodes behind a BIRD ToR. Values no
// AddressPool allows — an anycast 8.8.8.8, an `addresses` IP, a cidr6
// outside every pool, an allowed range from a namespace the pool does not
// list — are refused at ADD with the value and the reason named, leave
// nothing behind and never reach the ToR; authorized ones work; a pool
// added by a live reload allows what it covers.
func TestAddressAuthority(t *testing.T) {
	l := newLab(t, 1, nil)
	if err := l.StartBird(lab.BirdOptions{}); err != nil {
		t.Fatal(err)
	}
	n := l.Nodes[0]
	tr := birdTor{l}
	waitEstablished(t, n)
	testutil.EventuallyWithin(t, 20*time.Second, "the ToR to see node1", func() (bool, string) { return tr.sessionUp(t, n), "" })
	ctx := ctxT(t)

	refused := []struct {
		name  string
		args  [][2]string
		value string
		want  string
	}{
		{"anycast outside every pool", lab.PodArgs("default", "bad-any", "flock.fritzlab.net/anycast", "8.8.8.8"), "8.8.8.8",
			"no AddressPool allows namespace default to use 8.8.8.8 as anycast (none covers it)"},
		{"addresses from an anycast pool", lab.PodArgs("default", "bad-addr", "flock.fritzlab.net/addresses", "2001:db8:a::9"), "2001:db8:a::9",
			"AddressPool lab-anycast covers it for use anycast only"},
		{"addresses outside every pool", lab.PodArgs("default", "bad-addr2", "flock.fritzlab.net/addresses", "2001:db8:dead::1"), "2001:db8:dead::1",
			"none covers it"},
		{"cidr6 outside every pool", lab.PodArgs("default", "bad-cidr", "flock.fritzlab.net/cidr6", "2001:db8:999::/120"), "2001:db8:999::/120",
			"no AddressPool allows namespace default to use 2001:db8:999::/120 as pod"},
		{"a pool's range from another namespace", lab.PodArgs("tenant-a", "bad-ns", "flock.fritzlab.net/cidr6", "2001:db8:100::/120"), "2001:db8:100::/120",
			"AddressPool lab-pods allows it to namespaces default"},
	}
	for i, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			p := lab.Pod{ContainerID: fmt.Sprintf("refused%02d", i), NS: newNS(t, "flkp-"), Args: tc.args}
			_, err := n.CNI.Add(ctx, p)
			if err == nil {
				_ = n.CNI.Del(ctx, p)
				t.Fatal("ADD succeeded")
			}
			for _, w := range []string{tc.value, tc.want, "pod " + tc.args[1][1] + "/" + tc.args[2][1]} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ADD error %q does not contain %q", err, w)
				}
			}
			if v := flockVeths(t, n.NS); len(v) != 0 {
				t.Errorf("veths left: %v", v)
			}
			if r := records(t, n.Agent); len(r) != 0 {
				t.Errorf("records left: %+v", r)
			}
			assertPodNSEmpty(t, p.NS)
			_ = n.CNI.Del(ctx, p) // the runtime's DEL after a failed ADD succeeds
		})
	}
	for k, v := range used(t, n.Agent) {
		if v != 0 {
			t.Errorf("pool %s has %d addresses in use after refused ADDs", k, v)
		}
	}

	// Authorized values work and reach the ToR.
	_, ips := addPod(t, n, "good", "flock.fritzlab.net/anycast", "2001:db8:a::5,203.0.113.5",
		"flock.fritzlab.net/addresses", "2001:db8:aa::5", "flock.fritzlab.net/cidr6", "2001:db8:100::/120")
	for _, p := range []string{"2001:db8:a::5/128", "203.0.113.5/32", "2001:db8:aa::5/128", host(ipOf(ips, true)).String()} {
		torPaths(t, tr, netip.MustParsePrefix(p), 1)
	}
	// The refused values never reached it.
	time.Sleep(500 * time.Millisecond)
	for _, p := range []string{"8.8.8.8/32", "2001:db8:a::9/128", "2001:db8:dead::1/128"} {
		if c := tr.paths(t, netip.MustParsePrefix(p)); c != 0 {
			t.Errorf("the ToR holds refused %s", p)
		}
	}
	for p := range birdTable(t, l) {
		if netip.MustParsePrefix("2001:db8:999::/48").Overlaps(p) {
			t.Errorf("the ToR holds %s from the refused cidr6", p)
		}
	}

	// A live reload adds a pool: what was refused is allowed now.
	bench := lab.PodArgs("default", "bench", "flock.fritzlab.net/anycast", "198.18.0.1")
	pb := lab.Pod{ContainerID: "bench01", NS: newNS(t, "flkp-"), Args: bench}
	if _, err := n.CNI.Add(ctx, pb); err == nil || !strings.Contains(err.Error(), "198.18.0.1") {
		t.Fatalf("anycast 198.18.0.1 before its pool exists: %v", err)
	}
	cfg := lab.DefaultNodeConfig(n) + `---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: lab-bench
spec:
  cidrs: [198.18.0.0/15]
  use: [anycast]
  namespaceSelector: {}
`
	if err := l.SetNodeConfig(n, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("reload log:\n%s\n%s\n%s", grepLines(n.Agent.Log(), "reload"), grepLines(n.Agent.Log(), "watch"), grepLines(n.Agent.Log(), "serving"))
		}
	})
	testutil.EventuallyWithin(t, 10*time.Second, "the reloaded AddressPool to allow 198.18.0.1", func() (bool, string) {
		_, err := n.CNI.Add(ctx, pb)
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	t.Cleanup(func() { _ = n.CNI.Del(ctx, pb) })
	torPaths(t, tr, netip.MustParsePrefix("198.18.0.1/32"), 1)
	out := flockctl(t, n.Agent, "ipam")
	for _, w := range []string{"lab-bench", "198.18.0.0/15", "anycast", "lab-pods", "2001:db8:100::/112", "pod", "summary"} {
		if !strings.Contains(out, w) {
			t.Errorf("flockctl ipam lacks %q:\n%s", w, out)
		}
	}

	// An AddressPool that overlaps the node's summary: the summary is not
	// advertised until the overlap is gone, and the agent says why.
	torPaths(t, tr, n.Summary6, 1)
	overlap := cfg + `---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: too-wide
spec:
  cidrs: [fd00:10::/32]
  use: [anycast]
  namespaces: [default]
`
	if err := l.SetNodeConfig(n, overlap); err != nil {
		t.Fatal(err)
	}
	torPaths(t, tr, n.Summary6, 0)
	torPaths(t, tr, n.Summary4, 1)
	want := fmt.Sprintf("not advertised: summary %s overlaps AddressPool too-wide spec.cidrs[0] fd00:10::/32", n.Summary6)
	var st struct{ Problems []string }
	flockctlJSON(t, n.Agent, &st, "status")
	if !slices.Contains(st.Problems, want) {
		t.Errorf("flockctl status problems %q, want %q", st.Problems, want)
	}
	if !strings.Contains(n.Agent.Log(), "summary not advertised until the overlap is resolved") {
		t.Error("the agent did not log the overlap")
	}
	if err := l.SetNodeConfig(n, cfg); err != nil {
		t.Fatal(err)
	}
	torPaths(t, tr, n.Summary6, 1)
}
