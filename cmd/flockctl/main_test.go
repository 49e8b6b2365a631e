package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"code.fritzlab.net/fritzlab/flock/agent/admin"
	"code.fritzlab.net/fritzlab/flock/agent/reconcile"
	"code.fritzlab.net/fritzlab/flock/bgp/session"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/policyapi"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
	"code.fritzlab.net/fritzlab/flock/k8s/services"
)

func TestNotRunning(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"--socket", t.TempDir() + "/none.sock", "bgp", "neighbors"}, &out)
	if err == nil || !strings.Contains(err.Error(), "flock agent is not running") || !strings.Contains(err.Error(), "none.sock") {
		t.Fatalf("want a clear 'not running' error naming the socket, got %v", err)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "xml", "pods"}, `-o "xml"`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{nil, "no command given"},
	} {
		var out bytes.Buffer
		err := run(tc.args, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: want error containing %q, got %v", tc.args, tc.want, err)
		}
	}
}

// fakeSource answers the admin API like an agent would.
type fakeSource struct {
	readiness []admin.Readiness
	installer string
}

func (f *fakeSource) Status() admin.Status {
	return admin.Status{Ready: true, Allocations: 3, PeersUp: 1, Peers: 2, Installer: f.installer,
		Reaped: map[string]uint64{"netns-gone": 2, "interrupted-add": 0},
		Reconcilers: []reconcile.Status{
			{Target: "bgp", Passes: 10},
			{Target: "kernel", Passes: 12, Errors: 4, Failing: true, LastError: "route 2001:db8:ff::1/128: no such device", LastErrorAt: time.Now()},
		}}
}
func (f *fakeSource) Pods() []admin.Pod {
	return []admin.Pod{{ContainerID: "abc", ID: podmeta.ID{Namespace: "ns", Name: "p"}, Phase: "committed", Ready: true}}
}
func (f *fakeSource) Neighbors() []session.Neighbor {
	return []session.Neighbor{
		{Peer: "fd00::2", LocalASN: 64512, PeerASN: 64513, State: session.Established, Uptime: session.Duration(90 * time.Minute),
			Families: []session.FamilyCounts{{Family: "ipv6", Received: 0, Accepted: 0, Advertised: 7}}, BFD: "up", GR: "enabled",
			BFDDetail: &session.BFDDetail{State: "Up", Failures: 1, Diag: "detection time expired"}},
		{Peer: "interface eth1", State: session.Active, LastError: "connection refused", BFD: "down",
			BFDDetail: &session.BFDDetail{State: "Down", SocketFailures: 3, SocketError: "bind: address in use"}},
	}
}
func (f *fakeSource) Pools() []admin.Pool {
	return []admin.Pool{{Name: "pods", CIDR: "2001:db8:300::/124", Kind: "addresspool", Use: []string{"pod"}, Namespaces: []string{"dns"},
		Used: 3, Held: 1, Free: "10", Note: "in use here as anycast/addresses, never handed out: 2001:db8:300::5 (anycast: dns/coredns-1)"}}
}
func (f *fakeSource) BGPRoutes() []admin.BGPRoute { return nil }
func (f *fakeSource) Services() []services.Address {
	return []services.Address{{Service: "shop/web", IP: netip.MustParseAddr("2001:db8:1b::1"), Source: services.SourceLoadBalancer,
		State: services.StateDraining, Reason: "local endpoints terminating", Endpoints: 1, Local: true, Route: netip.MustParsePrefix("2001:db8:1b::1/128")}}
}
func (f *fakeSource) Routes() []admin.Route {
	return []admin.Route{
		{Prefix: "2001:db8:ff::1/128", Kind: "anycast", Nexthops: []string{"fd00::1%flock1"}, Desired: []string{"fd00::1%flock1"}, Owners: []string{"abc"}, Synced: true},
		{Prefix: "2001:db8:ee::1/128", Nexthops: []string{"fd00::2%flock2"}},
	}
}
func (f *fakeSource) SetReadiness(r admin.Readiness) (int, error) {
	if r.Name == "nope" {
		return 0, errors.New("no attachment of pod ns/nope on this node")
	}
	f.readiness = append(f.readiness, r)
	return 1, nil
}

func serve(t *testing.T, src admin.Source) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "admin.sock")
	l, err := admin.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = (&admin.Server{Listener: l, Source: src}).Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

func TestStatusRoutesReady(t *testing.T) {
	src := &fakeSource{}
	sock := serve(t, src)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"status"}, []string{"serving", "1/2 established", "netns-gone=2", "kernel", "FAILING", "no such device", "bgp"}},
		{[]string{"routes"}, []string{"2001:db8:ff::1/128", "anycast", "true", "2001:db8:ee::1/128", "stale"}},
		{[]string{"pods"}, []string{"committed", "ns/p"}},
		{[]string{"services"}, []string{"SERVICE", "shop/web", "2001:db8:1b::1", "loadBalancer", "draining", "local endpoints terminating"}},
		{[]string{"-o", "json", "svc"}, []string{`"state": "draining"`, `"ip": "2001:db8:1b::1"`, `"endpoints": 1`, `"route": "2001:db8:1b::1/128"`}},
		{[]string{"svc", "-o", "wide"}, []string{"ROUTE", "2001:db8:1b::1/128", "Local"}},
		{[]string{"ipam"}, []string{"HELD", "2001:db8:300::/124", " 3 ", " 1 ", " 10 ", "never handed out: 2001:db8:300::5 (anycast: dns/coredns-1)"}},
		{[]string{"-o", "json", "ipam"}, []string{`"held": 1`}},
		{[]string{"ready", "ns/p", "false"}, []string{"ns/p: NotReady"}},
		{[]string{"-o", "json", "status"}, []string{`"failing": true`, `"lastError": "route 2001:db8:ff::1/128: no such device"`}},
		{[]string{"bgp", "neighbors"}, []string{"fd00::2", "Established", "1h30m0s", "ipv6 0/0/7", "1 failures", "detection time expired",
			"interface eth1", "Active", "connection refused", "bfd socket (3 failures): bind: address in use"}},
		{[]string{"-o", "json", "bgp", "neighbors"}, []string{`"state": "Established"`, `"uptime": "1h30m0s"`, `"socketError": "bind: address in use"`}},
	} {
		var out bytes.Buffer
		if err := run(append([]string{"--socket", sock}, tc.args...), &out); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out.String())
			}
		}
	}
	if len(src.readiness) != 1 || src.readiness[0] != (admin.Readiness{ID: podmeta.ID{Namespace: "ns", Name: "p"}, Ready: false}) {
		t.Errorf("readiness reports %+v", src.readiness)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ready", "ns/p"}, "usage: flockctl ready"},
		{[]string{"ready", "p", "true"}, `pod "p": want NAMESPACE/NAME`},
		{[]string{"ready", "ns/p", "maybe"}, `"maybe": want true or false`},
		{[]string{"ready", "ns/nope", "true"}, "no attachment of pod ns/nope"},
	} {
		var out bytes.Buffer
		err := run(append([]string{"--socket", sock}, tc.args...), &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	if len(src.readiness) != 1 {
		t.Errorf("a refused report reached the agent: %+v", src.readiness)
	}
}

// A CNI installer's refusal shows in `flockctl status`: the agent serves
// but is not Ready.
func TestStatusNamesTheInstallerRefusal(t *testing.T) {
	const refusal = "installer: refused to write the CNI config: chained plugin portmap (/opt/cni/bin/portmap): not found"
	sock := serve(t, &fakeSource{installer: refusal})
	var out bytes.Buffer
	if err := run([]string{"--socket", sock, "status"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"not Ready: the CNI installer refused", "CNI INSTALLER", refusal} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("status lacks %q:\n%s", w, out.String())
		}
	}
}

// servePolicy answers flock-policy's admin API on a temp socket like
// flock-policy would: the node's pods, or the one named (404 for another),
// and records the pod each request asked for.
func servePolicy(t *testing.T, asked *[]string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "policy.sock")
	l, err := admin.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	rows := []policyapi.PodView{
		{Namespace: "shop", Name: "web", Node: "n1", IPs: []string{"2001:db8::5", "2001:db8:ff::53"},
			Ingress: []string{"shop/allow-lb", "shop/deny-all"}, Egress: []string{"shop/egress-dns"}},
		{Namespace: "shop", Name: "batch", Node: "n1", IPs: []string{"2001:db8::6"}, Ingress: []string{}, Egress: []string{}},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+policyapi.PoliciesPath, func(w http.ResponseWriter, r *http.Request) {
		pod := r.URL.Query().Get("pod")
		*asked = append(*asked, pod)
		v := rows
		if pod != "" {
			v = nil
			for _, row := range rows {
				if row.Namespace+"/"+row.Name == pod {
					v = append(v, row)
				}
			}
			if v == nil {
				http.Error(w, "pod "+pod+" not found", http.StatusNotFound)
				return
			}
		}
		_ = json.NewEncoder(w).Encode(v)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = admin.ServeHTTP(ctx, l, mux) }()
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

func TestPolicy(t *testing.T) {
	var asked []string
	sock := servePolicy(t, &asked)
	for _, tc := range []struct {
		args []string
		want []string
		not  []string
	}{
		// Not isolated in a direction: "-"; several policies: comma-separated.
		{[]string{"policy"}, []string{"POD IPS INGRESS EGRESS",
			"shop/web 2001:db8::5,2001:db8:ff::53 shop/allow-lb,shop/deny-all shop/egress-dns",
			"shop/batch 2001:db8::6 - -"}, nil},
		{[]string{"policy", "shop/batch"}, []string{"shop/batch"}, []string{"shop/web"}},
		{[]string{"-o", "json", "policy", "shop/web"}, []string{`"namespace": "shop"`, `"node": "n1"`,
			`"ips": [`, `"2001:db8:ff::53"`, `"ingress": [`, `"shop/deny-all"`, `"egress": [`}, []string{"POD"}},
	} {
		var out bytes.Buffer
		if err := run(append([]string{"--policy-socket", sock}, tc.args...), &out); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		// The table's columns, whatever their padding.
		var rows []string
		for _, l := range strings.Split(out.String(), "\n") {
			rows = append(rows, strings.Join(strings.Fields(l), " "))
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) && !slices.Contains(rows, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out.String())
			}
		}
		for _, w := range tc.not {
			if strings.Contains(out.String(), w) {
				t.Errorf("%v: output has %q:\n%s", tc.args, w, out.String())
			}
		}
	}
	if want := []string{"", "shop/batch", "shop/web"}; !slices.Equal(asked, want) {
		t.Errorf("flock-policy was asked for pods %q, want %q", asked, want)
	}
	asked = nil
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"policy", "web"}, `policy: pod "web": want NAMESPACE/NAME`},
		{[]string{"policy", "/web"}, `policy: pod "/web": want NAMESPACE/NAME`},
		{[]string{"policy", "shop/web/x"}, `policy: pod "shop/web/x": want NAMESPACE/NAME`},
		{[]string{"policy", "shop/web", "extra"}, "usage: flockctl policy [NAMESPACE/NAME]"},
		{[]string{"policy", "shop/gone"}, "pod shop/gone not found"},
	} {
		var out bytes.Buffer
		err := run(append([]string{"--policy-socket", sock}, tc.args...), &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	if !slices.Equal(asked, []string{"shop/gone"}) {
		t.Errorf("malformed requests reached flock-policy: %q", asked)
	}
	// The agent's socket is not the policy engine's: --socket does not
	// steer `policy`, and a missing engine is named as such.
	var out bytes.Buffer
	err := run([]string{"--socket", sock, "--policy-socket", t.TempDir() + "/none.sock", "policy"}, &out)
	if err == nil || !strings.Contains(err.Error(), "flock-policy is not running") || !strings.Contains(err.Error(), "none.sock") ||
		!strings.Contains(err.Error(), "--policy-socket") || strings.Contains(err.Error(), "flock agent") {
		t.Errorf("no flock-policy: %v, want a clear 'flock-policy is not running' naming the socket and --policy-socket", err)
	}
}
