package main

import (
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// cnitool's version is go.mod's CNI requirement, read from the build,
// not typed; the same lookup finds GoBGP's in a binary's build info.
func TestModuleVersionIsGoMods(t *testing.T) {
	b, err := os.ReadFile("../../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, mod := range []string{cniModule, gobgpModule} {
		m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(mod) + `\s+(v\S+)`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s not in go.mod", mod)
		}
		want := string(m[1])
		got, err := moduleVersion(mod)
		if err != nil || got != want {
			t.Errorf("moduleVersion(%s) = %q, %v; want go.mod's %s", mod, got, err, want)
		}
	}
	// This test binary is built with libcni: its build info says which.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := moduleVersion(cniModule)
	if got, err := binaryModuleVersion(exe, cniModule); err != nil || got != want {
		t.Errorf("binaryModuleVersion(test binary, %s) = %q, %v; want %s", cniModule, got, err, want)
	}
	if _, err := binaryModuleVersion(exe, "example.com/not/a/dependency"); err == nil {
		t.Error("binaryModuleVersion of a module the binary lacks: no error")
	}
}

// What cnitool is given: the container ID it derives (so the bench knows
// flock's host veth), CNI_ARGS as it parses them, and nothing else from
// this process's environment but PATH.
func TestCnitoolInvocation(t *testing.T) {
	sum := sha512.Sum512([]byte("/run/netns/fbabcd-p7"))
	if got, want := cnitoolContainerID("/run/netns/fbabcd-p7"), "cnitool-"+hex.EncodeToString(sum[:10]); got != want {
		t.Errorf("cnitoolContainerID = %q, want %q", got, want)
	}
	args := lab.PodArgs("default", "p7", "flock.fritzlab.net/ipv6", "false")
	got, err := cniArgs(args)
	if want := "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p7;flock.fritzlab.net/ipv6=false"; err != nil || got != want {
		t.Errorf("cniArgs = %q, %v; want %q", got, err, want)
	}
	for _, bad := range [][2]string{{"k", ""}, {"", "v"}, {"k", "a=b"}, {"k", "a;b"}} {
		if _, err := cniArgs([][2]string{bad}); err == nil {
			t.Errorf("cniArgs(%q): no error", bad)
		}
	}
	tool := &cnitool{bin: "cnitool", cniPath: "/opt/flock/bin", confDir: "/tmp/conf", network: "flock"}
	t.Setenv("CNI_COMMAND", "ADD") // must not leak into cnitool
	env, err := tool.env(lab.Pod{Args: args})
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(env, "\n")
	for _, want := range []string{"CNI_PATH=/opt/flock/bin", "NETCONFPATH=/tmp/conf", "CNI_ARGS=IgnoreUnknown=1;", "PATH="} {
		if !strings.Contains(joined, want) {
			t.Errorf("env lacks %q: %q", want, env)
		}
	}
	if strings.Contains(joined, "CNI_COMMAND") {
		t.Errorf("env leaks CNI_COMMAND: %q", env)
	}

	// The plugin keeps its namespaces and config; cnitool's copy is named.
	dir := t.TempDir()
	list, err := ptpPlugin(filepath.Join(dir, "ptp"), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cnitoolPlugin(list, "/x/cnitool", filepath.Join(dir, "conf"), "/usr/lib/cni", list.cni.List)
	if err != nil {
		t.Fatal(err)
	}
	if p.name != "ptp IPv4-only (cnitool)" || p.tool == nil || p.cni != nil || p.tool.network != "ptp" {
		t.Errorf("cnitoolPlugin = %+v", p)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "conf", "ptp.conflist")); err != nil || !strings.Contains(string(b), `"type":"ptp"`) {
		t.Errorf("NETCONFPATH's ptp.conflist: %q, %v", b, err)
	}
	ns := &lab.NS{Name: "x", Path: "/run/netns/x"}
	if got := p.pod("t", 3, ns).ContainerID; got != cnitoolContainerID(ns.Path) {
		t.Errorf("a cnitool pod's container ID %q, want cnitool's own", got)
	}
}

// The agent's GOGC, from its metrics.
func TestParseGOGC(t *testing.T) {
	for in, want := range map[string]string{
		"# HELP go_gc_gogc_percent Heap size target percentage\n# TYPE go_gc_gogc_percent gauge\ngo_gc_gogc_percent 25\ngo_goroutines 40\n": "25",
		"go_gc_gogc_percent 100\n": "100",
		"go_gc_gogc_percent -1\n":  "off",
	} {
		if got, err := parseGOGC([]byte(in)); err != nil || got != want {
			t.Errorf("parseGOGC(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "go_goroutines 4\n", "go_gc_gogc_percent x\n", "go_gc_gogc_percent 2.5\n"} {
		if _, err := parseGOGC([]byte(bad)); err == nil {
			t.Errorf("parseGOGC(%q): no error", bad)
		}
	}
}

// A DEL is done when it returned and its host veth's deletion was
// announced, whichever is later; a deletion never announced, or a lost
// event, is an error.
func TestVethGoneAfter(t *testing.T) {
	newWatch := func() *vethWatch {
		return &vethWatch{gone: map[string]time.Time{}, notify: make(chan struct{}), done: make(chan struct{}), ended: make(chan struct{})}
	}
	t0 := time.Now()
	w := newWatch()
	w.deleted("veth1", t0.Add(-time.Millisecond)) // announced before the DEL returned (ptp)
	if got, err := w.goneAfter([]string{"veth1"}, t0, time.Second); err != nil || !got.Equal(t0) {
		t.Errorf("deleted before the return: %v, %v; want the return", got, err)
	}
	w.deleted("flock1", t0.Add(20*time.Millisecond)) // after (flock)
	if got, err := w.goneAfter([]string{"veth1", "flock1"}, t0, time.Second); err != nil || !got.Equal(t0.Add(20*time.Millisecond)) {
		t.Errorf("deleted after the return: %v, %v; want the deletion", got, err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		w.deleted("flock2", time.Now())
	}()
	if got, err := w.goneAfter([]string{"flock2"}, time.Now(), 5*time.Second); err != nil || got.Before(t0.Add(20*time.Millisecond)) {
		t.Errorf("waited for a deletion: %v, %v", got, err)
	}
	if _, err := w.goneAfter([]string{"never"}, time.Now(), 30*time.Millisecond); err == nil || !strings.Contains(err.Error(), "never") {
		t.Errorf("a veth never deleted: %v; want an error naming it", err)
	}
	if _, err := w.goneAfter([]string{""}, time.Now(), time.Second); err == nil {
		t.Error("a pod without a veth name: no error")
	}
	w = newWatch()
	go func() {
		time.Sleep(10 * time.Millisecond)
		w.fail(errors.New("no buffer space available"))
	}()
	if _, err := w.goneAfter([]string{"flock3"}, time.Now(), 5*time.Second); err == nil || !strings.Contains(err.Error(), "buffer") {
		t.Errorf("lost events: %v; want the subscription's error", err)
	}
}
