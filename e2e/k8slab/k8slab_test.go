package k8slab_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/k8slab"
)

// ptpConflist is a stand-in for flock's own CNI config: Debian's ptp plugin
// with host-local IPAM, enough for kubelet to report Ready and run a pod.
const ptpConflist = `{
  "cniVersion": "1.0.0",
  "name": "k8slab-ptp",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "198.51.100.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// busyboxPod is the test pod; %s is its name.
const busyboxPod = `apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: bb
    image: ` + k8slab.BusyboxImage + `
    imagePullPolicy: Never
    command: ["sleep", "3600"]
`

func TestClusterUpDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("k8slab runs a real cluster and must run as root (sudo go test)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "k8slab-test-")
	if err != nil {
		t.Fatal(err)
	}
	netnsBefore := len(k8slab.CNINetns())

	start := time.Now()
	c, err := k8slab.Up(ctx, k8slab.Options{Dir: dir, Log: t.Logf})
	if err != nil {
		t.Fatalf("up: %v (lab dir %s kept)", err, dir)
	}
	t.Logf("Up took %s", time.Since(start).Round(100*time.Millisecond))
	downDone := false
	t.Cleanup(func() {
		if t.Failed() {
			for _, comp := range []string{k8slab.Kubelet, k8slab.Containerd, k8slab.APIServer} {
				t.Logf("--- %s ---\n%s", comp, c.LogTail(comp, 40))
			}
		}
		if !downDone {
			if err := c.Down(); err != nil {
				t.Errorf("down: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("lab dir %s kept", dir)
		} else {
			os.RemoveAll(dir)
		}
	})

	kubectl := func(args ...string) string {
		t.Helper()
		out, err := c.Kubectl(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}
	if out := kubectl("get", "--raw", "/readyz"); out != "ok" {
		t.Fatalf("readyz: %q", out)
	}
	t.Log(kubectl("version"))

	ipam := filepath.Join(dir, "cni", "ipam")
	conf := filepath.Join(c.Opts.CNIConfDir, "10-ptp.conflist")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(ptpConflist, ipam)), 0o644); err != nil {
		t.Fatal(err)
	}
	readyCtx, readyCancel := context.WithTimeout(ctx, 3*time.Minute)
	defer readyCancel()
	if err := c.WaitNodeReady(readyCtx); err != nil {
		t.Fatal(err)
	}

	// bb is deleted by the test, bb2 is left for Down to delete.
	for _, name := range []string{"bb", "bb2"} {
		if _, err := c.KubectlStdin(ctx, fmt.Sprintf(busyboxPod, name), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
	}
	kubectl("wait", "--for=jsonpath={.status.phase}=Running", "pod/bb", "pod/bb2", "--timeout=180s")
	if ip := kubectl("get", "pod", "bb", "-o", "jsonpath={.status.podIP}"); !strings.HasPrefix(ip, "198.51.100.") {
		t.Errorf("pod IP %q is not from the ptp range", ip)
	}
	if out := kubectl("exec", "bb", "--", "hostname"); out != "bb" {
		t.Errorf("exec hostname: %q, want bb", out)
	}

	// The in-cluster config path of hostNetwork pods: kubernetes Service
	// address, DNATed to the apiserver, certificate valid for its name.
	if ip := kubectl("get", "service", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"); ip != k8slab.KubernetesServiceIP {
		t.Errorf("kubernetes service IP %q, want %s", ip, k8slab.KubernetesServiceIP)
	}
	tlsCfg, err := c.TLSConfig("kubernetes.default.svc")
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	resp, err := hc.Get("https://" + k8slab.KubernetesServiceIP + ":443/readyz")
	if err != nil {
		t.Fatalf("service IP path to apiserver: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET https://%s/readyz: %s", k8slab.KubernetesServiceIP, resp.Status)
	}

	// A pod deleted while kubelet is down is torn down once it is back.
	if err := c.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	kubectl("delete", "pod", "bb", "--wait=false")
	if err := c.StartKubelet(); err != nil {
		t.Fatal(err)
	}
	kubectl("wait", "--for=delete", "pod/bb", "--timeout=120s")

	saved := c.SavedSysctls()
	for k, v := range saved {
		if now, _ := k8slab.ReadSysctl(k); now != v {
			t.Logf("while up: %s = %s (saved %s)", k, now, v)
		}
	}
	downStart := time.Now()
	downDone = true
	if err := c.Down(); err != nil {
		t.Fatalf("down: %v", err)
	}
	t.Logf("Down took %s", time.Since(downStart).Round(100*time.Millisecond))
	assertHostRestored(t, c, saved, netnsBefore)
	// Down deleted bb2 through kubelet, so CNI DEL released its address.
	if leases := ipamLeases(t, filepath.Join(ipam, "k8slab-ptp")); len(leases) > 0 {
		t.Errorf("host-local addresses still allocated after Down: %v", leases)
	}
}

// ipamLeases lists the addresses host-local holds in dir (one file each).
func ipamLeases(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("host-local data dir: %v", err)
	}
	var ips []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "198.51.100.") {
			ips = append(ips, e.Name())
		}
	}
	return ips
}

func assertHostRestored(t *testing.T, c *k8slab.Cluster, saved map[string]string, netnsBefore int) {
	t.Helper()
	if pids := processesNaming(c.ContainerdSocket); len(pids) > 0 {
		t.Errorf("processes still name %s: %v", c.ContainerdSocket, pids)
	}
	pidFiles, _ := filepath.Glob(filepath.Join(c.Opts.Dir, "run", "*.pid"))
	for _, f := range pidFiles {
		b, _ := os.ReadFile(f)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err == nil && syscall.Kill(pid, 0) == nil {
			t.Errorf("%s: pid %d still exists", filepath.Base(f), pid)
		}
	}
	for _, ch := range []struct{ bin, table, chain string }{
		{"iptables", "nat", k8slab.SvcChain},
		{"iptables", "filter", "KUBE-FIREWALL"},
		{"iptables", "mangle", "KUBE-IPTABLES-HINT"},
		{"iptables", "mangle", "KUBE-KUBELET-CANARY"},
		{"iptables", "nat", "KUBE-KUBELET-CANARY"},
		{"iptables", "filter", "KUBE-KUBELET-CANARY"},
		{"ip6tables", "filter", "KUBE-FIREWALL"},
		{"ip6tables", "mangle", "KUBE-KUBELET-CANARY"},
	} {
		if k8slab.ChainExists(ch.bin, ch.table, ch.chain) {
			t.Errorf("%s -t %s: chain %s still exists", ch.bin, ch.table, ch.chain)
		}
	}
	if len(saved) == 0 {
		t.Error("no sysctls were saved")
	}
	for k, want := range saved {
		if got, err := k8slab.ReadSysctl(k); err != nil || got != want {
			t.Errorf("sysctl %s = %q (%v), want %q", k, got, err, want)
		}
	}
	if ns := k8slab.CNINetns(); len(ns) > netnsBefore {
		t.Errorf("cni netns left: %v", ns)
	}
}

// processesNaming lists PIDs whose command line contains s anywhere.
func processesNaming(s string) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !strings.Contains(string(b), s) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(d)); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// AddNode refuses bad options before it changes anything, naming the
// field and the value.
func TestAddNodeBadInput(t *testing.T) {
	dir := t.TempDir()
	netnsFile := filepath.Join(dir, "netns")
	if err := os.WriteFile(netnsFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := &k8slab.Cluster{Opts: k8slab.Options{Dir: dir, NodeName: "vm"}}
	for _, tc := range []struct {
		name    string
		o       k8slab.NodeOptions
		apiOnly bool
		want    string
	}{
		{"empty name", k8slab.NodeOptions{Netns: netnsFile, NodeIP: "fd00:0:98::1"}, false, `node name ""`},
		{"the first node's name", k8slab.NodeOptions{Name: "vm", Netns: netnsFile, NodeIP: "fd00:0:98::1"}, false, `node name "vm"`},
		{"not a label", k8slab.NodeOptions{Name: "vm2.example", Netns: netnsFile, NodeIP: "fd00:0:98::1"}, false, `node name "vm2.example"`},
		{"no netns", k8slab.NodeOptions{Name: "vm2", Netns: filepath.Join(dir, "missing"), NodeIP: "fd00:0:98::1"}, false, "Netns"},
		{"loopback IP", k8slab.NodeOptions{Name: "vm2", Netns: netnsFile, NodeIP: "::1"}, false, `NodeIP "::1"`},
		{"bad IP", k8slab.NodeOptions{Name: "vm2", Netns: netnsFile, NodeIP: "fd00:0:98::1,nope"}, false, `NodeIP "fd00:0:98::1,nope"`},
		{"an API-only lab", k8slab.NodeOptions{Name: "vm2", Netns: netnsFile, NodeIP: "fd00:0:98::1"}, true, "a lab with a node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.Opts.APIOnly = tc.apiOnly
			_, err := c.AddNode(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("AddNode(%+v) = %v, want an error naming %s", tc.o, err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "node-"+tc.o.Name)); err == nil {
				t.Errorf("AddNode left %s behind", filepath.Join(dir, "node-"+tc.o.Name))
			}
		})
	}
}
