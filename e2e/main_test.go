// Package e2e holds flock's integration tests: real network namespaces,
// real flock-agent processes, the real plugin binary invoked through libcni.
// They need root and fail (never skip) without it.
package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

var binDir string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: these tests create network namespaces and must run as root (sudo make test)")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "flock-e2e-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	if err := lab.Build(binDir, true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func randName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// newNS creates a namespace that is deleted when the test ends.
func newNS(t *testing.T, prefix string) *lab.NS {
	t.Helper()
	ns, err := lab.NewNS(randName(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Delete(); err != nil {
			t.Errorf("delete netns %s: %v", ns.Name, err)
		}
	})
	return ns
}

// node is a node namespace with a running agent and a libcni client.
type node struct {
	ns    *lab.NS
	agent *lab.Agent
	cni   *lab.CNI
	dir   string
}

const defaultConfig = `apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: test-node
spec:
  asn: 64512
  routerID: 192.0.2.1
  defaults:
    ipv4: true
  pools:
  - cidr: fd00:10:1::/64
  - cidr: 10.1.1.0/24
  - cidr: 2001:db8:100::/120
    shared: true
    namespaces: [prod]
  - cidr: 198.51.100.0/29
    shared: true
---
# The anycast and addresses IPs the tests use (the shared pools above are
# the deprecated form of use-pod AddressPools, read as such).
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: test-anycast
spec:
  cidrs: [2001:db8:a::/64, 203.0.113.0/24]
  use: [anycast]
  namespaces: [default]
---
apiVersion: flock.fritzlab.net/v1alpha1
kind: AddressPool
metadata:
  name: test-addresses
spec:
  cidrs: [2001:db8:b::/64]
  use: [addresses]
  namespaces: [default]
`

var (
	nodeV6 = mustAddr("fd00:ffff::1")
	nodeV4 = mustAddr("192.0.2.1")
)

// startNode creates a node namespace and starts an agent in it.
func startNode(t *testing.T, config string, agentArgs ...string) *node {
	t.Helper()
	ns := newNS(t, "flkn-")
	for _, ip := range []string{"fd00:ffff::1", "192.0.2.1"} {
		if err := ns.AddAddr(mustAddr(ip)); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	a, err := lab.NewAgent(ns, filepath.Join(dir, "agent"), config)
	if err != nil {
		t.Fatal(err)
	}
	a.Args = agentArgs
	if err := a.Start(filepath.Join(binDir, "flock-agent"), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			t.Errorf("stop agent: %v", err)
		}
		if strings.Contains(a.Log(), "DATA RACE") {
			t.Error("the race detector caught a data race in flock-agent")
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", a.Log())
		}
	})
	c, err := lab.NewCNI(binDir, filepath.Join(dir, "cni-cache"), a.CNISocket, "1.1.0")
	if err != nil {
		t.Fatal(err)
	}
	return &node{ns: ns, agent: a, cni: c, dir: dir}
}
