package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/bgp/session"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// leaves lists every command that runs, as typed after "flockctl".
func leaves(c *command, prefix []string) [][]string {
	var out [][]string
	for _, s := range c.subs {
		p := append(append([]string(nil), prefix...), s.name)
		if s.run != nil {
			out = append(out, p)
		}
		out = append(out, leaves(s, p)...)
	}
	return out
}

// Every way of asking for help prints it to stdout and exits 0; a group
// (bgp) alone lists its commands and exits 0.
func TestHelp(t *testing.T) {
	type tc struct {
		args []string
		want []string // in stdout
	}
	cases := []tc{
		{[]string{"--help"}, []string{"usage: flockctl [flags] COMMAND", "bgp neighbors", "bgp routes", "policy [NAMESPACE/NAME]", "-socket", "-o format", "Exit status"}},
		{[]string{"-h"}, []string{"usage: flockctl [flags] COMMAND"}},
		{[]string{"-help"}, []string{"usage: flockctl [flags] COMMAND"}},
		{[]string{"help"}, []string{"usage: flockctl [flags] COMMAND", "help [COMMAND]"}},
		{[]string{"--socket", "/nonexistent", "--help"}, []string{"usage: flockctl [flags] COMMAND"}},
		{[]string{"bgp"}, []string{"usage: flockctl bgp COMMAND", "neighbors", "routes"}},
		{[]string{"bgp", "--help"}, []string{"usage: flockctl bgp COMMAND", "neighbors", "routes"}},
		{[]string{"help", "bgp"}, []string{"usage: flockctl bgp COMMAND", "neighbors", "routes"}},
		{[]string{"bgp", "help", "routes"}, []string{"usage: flockctl bgp routes [flags]"}},
		{[]string{"bgp", "neighbours", "--help"}, []string{"usage: flockctl bgp neighbors [flags]", "Aliases: neighbours, neighbor", "-o wide adds"}},
		{[]string{"-o", "json", "bgp", "neighbors", "-h"}, []string{"usage: flockctl bgp neighbors [flags]"}},
		{[]string{"ready", "--help"}, []string{"usage: flockctl ready NAMESPACE/NAME true|false", "{pod, ready, incarnations}"}},
		{[]string{"policy", "shop/web", "--help"}, []string{"usage: flockctl policy [NAMESPACE/NAME]", "--policy-socket"}},
	}
	for _, l := range leaves(tree(), nil) {
		usage := "usage: flockctl " + strings.Join(l, " ")
		cases = append(cases,
			tc{append(append([]string(nil), l...), "--help"), []string{usage, "-o format", "-socket"}},
			tc{append(append([]string(nil), l...), "-h"), []string{usage}},
			tc{append([]string{"help"}, l...), []string{usage}})
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		if code := cli(c.args, &stdout, &stderr); code != 0 || stderr.Len() > 0 {
			t.Errorf("%q: exit %d, stderr %q; want 0 and nothing on stderr", c.args, code, stderr.String())
		}
		for _, w := range c.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("%q: stdout lacks %q:\n%s", c.args, w, stdout.String())
			}
		}
	}
}

// A wrong command line exits 2 naming the bad thing on stderr (and
// nothing on stdout); a failure exits 1.
func TestExitCodes(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none.sock")
	for _, tc := range []struct {
		args []string
		code int
		want []string // in stderr
	}{
		{nil, 2, []string{"no command given", "usage: flockctl [flags] COMMAND"}},
		{[]string{"frobnicate"}, 2, []string{`unknown command "frobnicate" for "flockctl"`, "Run 'flockctl --help'"}},
		{[]string{"bgp", "frob"}, 2, []string{`unknown command "frob" for "flockctl bgp"`, "Run 'flockctl bgp --help'"}},
		{[]string{"help", "frob"}, 2, []string{`unknown command "frob"`}},
		{[]string{"--bogus", "status"}, 2, []string{"-bogus"}},
		{[]string{"status", "--bogus"}, 2, []string{"-bogus", "Run 'flockctl status --help'"}},
		{[]string{"bgp", "neighbors", "--bogus"}, 2, []string{"-bogus", "Run 'flockctl bgp neighbors --help'"}},
		{[]string{"bgp", "neighbors", "-o"}, 2, []string{"flag needs an argument: -o"}},
		{[]string{"-o", "xml", "status"}, 2, []string{`-o "xml": want table, wide, json or yaml`}},
		{[]string{"pods", "-o", "xml"}, 2, []string{`-o "xml": want table, wide, json or yaml`, "Run 'flockctl pods --help'"}},
		{[]string{"status", "extra"}, 2, []string{`status: unexpected argument "extra"`}},
		{[]string{"bgp", "neighbors", "extra"}, 2, []string{`bgp neighbors: unexpected argument "extra"`}},
		{[]string{"ready", "ns/p"}, 2, []string{"usage: flockctl ready NAMESPACE/NAME true|false"}},
		{[]string{"ready", "p", "true"}, 2, []string{`pod "p": want NAMESPACE/NAME`, "Run 'flockctl ready --help'"}},
		{[]string{"ready", "ns/p", "maybe"}, 2, []string{`"maybe": want true or false`}},
		{[]string{"policy", "a", "b"}, 2, []string{"usage: flockctl policy [NAMESPACE/NAME]"}},
		{[]string{"policy", "web"}, 2, []string{`policy: pod "web": want NAMESPACE/NAME`}},
		{[]string{"check-probe"}, 2, []string{"check-probe: want serve or connect"}},
		{[]string{"check-probe", "frob"}, 2, []string{`check-probe: "frob": want serve or connect`}},
		{[]string{"check-probe", "connect", "--want", "maybe", "[::1]:1"}, 2, []string{`--want "maybe": want answered or blocked`}},
		{[]string{"check", "--kubeconfig", filepath.Join(t.TempDir(), "missing")}, 1, []string{"check: the cluster"}},
		{[]string{"--socket", none, "status"}, 1, []string{"flock agent is not running", none}},
		{[]string{"bgp", "neighbors", "--socket", none}, 1, []string{"flock agent is not running", none}},
		{[]string{"policy", "--policy-socket", none}, 1, []string{"flock-policy is not running", none}},
	} {
		var stdout, stderr bytes.Buffer
		code := cli(tc.args, &stdout, &stderr)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.args, code, tc.code, stderr.String())
		}
		if !strings.HasPrefix(stderr.String(), "flockctl: ") {
			t.Errorf("%q: stderr %q, want it to start with \"flockctl: \"", tc.args, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%q: stderr lacks %q:\n%s", tc.args, w, stderr.String())
			}
		}
		if stdout.Len() > 0 {
			t.Errorf("%q: stdout %q, want nothing", tc.args, stdout.String())
		}
	}
}

// wideSource has the fields that only -o wide shows.
type wideSource struct{ fakeSource }

var since = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func (w *wideSource) Status() admin.Status {
	s := w.fakeSource.Status()
	s.Problems = []string{"not advertised: 2001:db8:1::/64 (no session)"}
	s.Reconcilers = []reconcile.Status{{Target: "bgp", Passes: 10, Generation: 42, LastSuccess: time.Now().Add(-3 * time.Second)}}
	return s
}
func (w *wideSource) Pods() []admin.Pod {
	return []admin.Pod{{ContainerID: "0123456789abcdef0123456789abcdef", ID: podmeta.ID{Namespace: "ns", Name: "p", UID: "uid-1"},
		Phase: "committed", Ready: true, Created: since}}
}
func (w *wideSource) Neighbors() []session.Neighbor {
	return []session.Neighbor{{Peer: "interface eth1", Address: "fe80::1", LocalASN: 64512, PeerASN: 64513, State: session.Established,
		Since: since, Uptime: session.Duration(time.Minute), RFC5549Mismatch: true, BFD: "up", GR: "enabled",
		BFDDetail: &session.BFDDetail{State: "Up", RemoteState: "Up", RemoteCBit: true, Failures: 2, PlannedDowns: 1, Diag: "neighbor signaled session down"},
		LastError: "hold timer expired"}}
}
func (w *wideSource) Pools() []admin.Pool {
	return []admin.Pool{{Name: "pods", CIDR: "2001:db8:300::/124", Kind: "addresspool", Namespaces: []string{"dns"}, Selector: "team=infra", Used: 3}}
}
func (w *wideSource) Routes() []admin.Route {
	return []admin.Route{{Prefix: "2001:db8:ff::1/128", Kind: "anycast", Owners: []string{"0123456789abcdef0123456789abcdef"}, Synced: true}}
}

// Every command takes -o wide, json and yaml; wide adds columns the table
// leaves out.
func TestOutputFormats(t *testing.T) {
	sock := serve(t, &wideSource{})
	var asked []string
	psock := servePolicy(t, &asked)
	for _, tc := range []struct {
		args      []string
		wide, not []string // in -o wide, not in the table
	}{
		{[]string{"status"}, []string{"PROBLEM", "not advertised: 2001:db8:1::/64", "GENERATION", " 42 ", "LAST SUCCESS", "3s ago"}, []string{"PROBLEM", "GENERATION"}},
		{[]string{"pods"}, []string{"0123456789abcdef0123456789abcdef", "UID", "uid-1", "2026-01-02T03:04:05Z"}, []string{"0123456789abcdef0123", "uid-1"}},
		{[]string{"ipam"}, []string{"SELECTOR", "team=infra"}, []string{"SELECTOR"}},
		{[]string{"routes"}, []string{"0123456789abcdef0123456789abcdef"}, []string{"0123456789abcdef0123"}},
		{[]string{"bgp", "neighbors"}, []string{"ADDRESS", "fe80::1", "SINCE", "2026-01-02T03:04:05Z", "Up (C-bit)", "2/1",
			"neighbor signaled session down", "holding IPv4 back", "LAST ERROR", "hold timer expired"}, []string{"C-bit", "hold timer expired", "SINCE"}},
		{[]string{"bgp", "routes"}, []string{"PREFIX"}, nil},
		{[]string{"services"}, []string{"ENDPOINTS", "POLICY", "Local"}, []string{"ENDPOINTS", "Local"}},
		{[]string{"policy"}, []string{"NODE", "n1"}, []string{"NODE"}},
		{[]string{"ready", "ns/p", "true"}, []string{"ns/p: Ready (1 incarnation(s))"}, nil},
	} {
		get := func(format string) string {
			t.Helper()
			var stdout, stderr bytes.Buffer
			args := append(append([]string{"--socket", sock, "--policy-socket", psock}, tc.args...), "-o", format)
			if code := cli(args, &stdout, &stderr); code != 0 {
				t.Fatalf("%q: exit %d: %s", args, code, stderr.String())
			}
			return stdout.String()
		}
		wide, table := get("wide"), get("table")
		for _, w := range tc.wide {
			if !strings.Contains(wide, w) {
				t.Errorf("%q -o wide lacks %q:\n%s", tc.args, w, wide)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(table, w) {
				t.Errorf("%q (table) has %q:\n%s", tc.args, w, table)
			}
		}
		var v any
		if err := json.Unmarshal([]byte(get("json")), &v); err != nil {
			t.Errorf("%q -o json: %v", tc.args, err)
		}
		if y := get("yaml"); yaml.Unmarshal([]byte(y), &v) != nil || strings.HasPrefix(y, "{") || strings.HasPrefix(y, "[") {
			t.Errorf("%q -o yaml: not YAML:\n%s", tc.args, y)
		}
	}
	// ready -o json is its outcome.
	var stdout, stderr bytes.Buffer
	if code := cli([]string{"--socket", sock, "-o", "json", "ready", "ns/p", "false"}, &stdout, &stderr); code != 0 {
		t.Fatalf("ready -o json: exit %d: %s", code, stderr.String())
	}
	var r readyResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || r != (readyResult{Pod: "ns/p", Ready: false, Incarnations: 1}) {
		t.Errorf("ready -o json: %+v, %v:\n%s", r, err, stdout.String())
	}
}

// Flags go before the command, between its words and after it (also
// between and after its arguments); "--" ends them.
func TestFlagsAnywhere(t *testing.T) {
	sock := serve(t, &fakeSource{})
	var asked []string
	psock := servePolicy(t, &asked)
	for _, args := range [][]string{
		{"--socket", sock, "-o", "json", "status"},
		{"--socket", sock, "status", "-o", "json"},
		{"status", "-o", "json", "--socket", sock},
		{"status", "-o=json", "--socket=" + sock},
		{"-o", "json", "bgp", "neighbors", "--socket", sock},
		{"bgp", "neighbors", "-o", "json", "--socket", sock},
		{"bgp", "-o", "json", "neighbours", "--socket", sock},
		{"-o", "table", "--socket", sock, "pods", "-o", "json"}, // the last one wins
		{"--policy-socket", psock, "policy", "-o", "json", "shop/web"},
		{"policy", "shop/web", "-o", "json", "--policy-socket", psock},
		{"--policy-socket", psock, "-o", "json", "policy", "--", "shop/web"},
	} {
		var stdout, stderr bytes.Buffer
		if code := cli(args, &stdout, &stderr); code != 0 {
			t.Errorf("%q: exit %d: %s", args, code, stderr.String())
			continue
		}
		var v any
		if err := json.Unmarshal(stdout.Bytes(), &v); err != nil {
			t.Errorf("%q: not JSON (%v):\n%s", args, err, stdout.String())
		}
	}
	// After "--", a flag is an argument.
	var stdout, stderr bytes.Buffer
	if code := cli([]string{"--policy-socket", psock, "policy", "--", "-o"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `pod "-o"`) {
		t.Errorf("policy -- -o: exit %d, %q; want 2 naming pod \"-o\"", code, stderr.String())
	}
}

// The binary itself: the exit statuses, and --version stamped by the
// linker as the Makefile and the Dockerfile do.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds flockctl")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	bin := filepath.Join(t.TempDir(), "flockctl")
	const pkg = "code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	build := exec.Command(goBin, "build", "-ldflags", "-X "+pkg+".version=v9.8.7-test -X "+pkg+".commit=abc1234", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	none := filepath.Join(t.TempDir(), "none.sock")
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"--version"}, 0, "flockctl v9.8.7-test (commit abc1234, " + runtime.Version() + ")\n", ""},
		{[]string{"status", "--version"}, 0, "flockctl v9.8.7-test (commit abc1234, " + runtime.Version() + ")\n", ""},
		{[]string{"--help"}, 0, "usage: flockctl", ""},
		{[]string{"bgp", "neighbors", "--help"}, 0, "usage: flockctl bgp neighbors", ""},
		{[]string{"bgp"}, 0, "neighbors", ""},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"status", "-o", "xml"}, 2, "", `-o "xml"`},
		{[]string{"--socket", none, "status"}, 1, "", "flock agent is not running"},
	} {
		cmd := exec.Command(bin, tc.args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("flockctl %q: exit %d, stdout %q, stderr %q; want %d, stdout with %q, stderr with %q",
				tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}

// A flockctl built without a release version cannot know which image
// holds its probe: check says to name it, before it touches the cluster.
func TestCheckNeedsAnImage(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := cli([]string{"check", "--kubeconfig", kc}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "name the probes' image with --image") {
		t.Errorf("check without --image from a dev build: exit %d, stderr %q", code, stderr.String())
	}
}
