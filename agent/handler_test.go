package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/agent"
	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
	"code.fritzlab.net/fritzlab/flock/dataplane"
	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

const netConf = `{"cniVersion":"1.1.0","name":"n","type":"flock"}`

func addReq(id, args string) wire.Request {
	return wire.Request{Op: wire.OpAdd, ContainerID: id, Netns: netnsOf(id), IfName: "eth0", Args: args, Config: json.RawMessage(netConf)}
}

func TestToCNI(t *testing.T) {
	if agent.ToCNI(nil) != nil {
		t.Error("ToCNI(nil) != nil")
	}
	tests := []struct {
		name string
		err  error
		code uint
	}{
		{"missing pod name", &podmeta.MissingArgError{Key: podmeta.ArgName}, types.ErrInvalidEnvironmentVariables},
		{"wrapped missing arg", fmt.Errorf("lookup: %w", &podmeta.MissingArgError{Key: podmeta.ArgNamespace}), types.ErrInvalidEnvironmentVariables},
		{"annotation error", &annotations.Error{Key: annotations.IPv4, Value: "yes", Reason: "bad"}, types.ErrInvalidNetworkConfig},
		{"ipam exhausted", fmt.Errorf("allocate: %w", ipam.ErrExhausted), types.ErrTryAgainLater},
		{"ipam not in pool", ipam.ErrNotInPool, types.ErrInvalidNetworkConfig},
		{"ipam forbidden", ipam.ErrForbidden, types.ErrInvalidNetworkConfig},
		{"ipam bad algo", ipam.ErrBadAlgo, types.ErrInvalidNetworkConfig},
		{"netns error", &dataplane.NetnsError{Path: "/proc/1/ns/net", Err: os.ErrNotExist}, types.ErrInvalidNetNS},
		{"wrapped netns error", fmt.Errorf("setup: %w", &dataplane.NetnsError{Path: "/x", Err: os.ErrPermission}), types.ErrInvalidNetNS},
		{"explicit code", &agent.Error{Code: types.ErrUnknownContainer, Err: errors.New("gone")}, types.ErrUnknownContainer},
		{"other", errors.New("something else"), types.ErrInternal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ce := agent.ToCNI(tc.err)
			if ce == nil {
				t.Fatal("nil")
			}
			if ce.Code != tc.code {
				t.Errorf("code = %d, want %d", ce.Code, tc.code)
			}
			if want := "flock: " + tc.err.Error(); ce.Msg != want {
				t.Errorf("Msg = %q, want %q", ce.Msg, want)
			}
		})
	}
}

// ADD errors reach the runtime with the right CNI code.
func TestHandleAddErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    string
		spec4   string // replaces the IPv4 pool when set
		prefill int    // ADDs before the failing one
		dpErr   error
		code    uint
		want    string
	}{
		{name: "missing K8S_POD_NAME", args: "K8S_POD_NAMESPACE=default", code: types.ErrInvalidEnvironmentVariables, want: podmeta.ArgName},
		{name: "annotation error", args: podArgs("default", "p", annotations.CIDR6+"=fd00:10:1::1/64"), code: types.ErrInvalidNetworkConfig, want: "fd00:10:1::/64"},
		{name: "ipam exhaustion", args: podArgs("default", "p"), spec4: "10.1.1.0/30", prefill: 2, code: types.ErrTryAgainLater, want: "exhausted"},
		{name: "netns error", args: podArgs("default", "p"), dpErr: &dataplane.NetnsError{Path: "/var/run/netns/x", Err: os.ErrNotExist}, code: types.ErrInvalidNetNS, want: "/var/run/netns/x"},
		{name: "other error", args: podArgs("default", "p"), dpErr: errors.New("netlink: operation not permitted"), code: types.ErrInternal, want: "operation not permitted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec()
			if tc.spec4 != "" {
				s.Pools[1].CIDR = tc.spec4
			}
			e := started(t, withSpec(s))
			for i := 0; i < tc.prefill; i++ {
				e.mustAdd(fmt.Sprintf("pre%d", i))
			}
			e.dp.set(func(d *fakeDP) { d.setupErr = tc.dpErr })
			resp := e.a.Handle(context.Background(), addReq("c1", tc.args))
			if resp.Error == nil {
				t.Fatalf("ADD succeeded: %s", resp.Result)
			}
			if resp.Result != nil {
				t.Errorf("error response carries a result: %s", resp.Result)
			}
			if resp.Error.Code != tc.code {
				t.Errorf("code = %d, want %d (%s)", resp.Error.Code, tc.code, resp.Error.Msg)
			}
			if !strings.HasPrefix(resp.Error.Msg, "flock: ") {
				t.Errorf("message %q does not start with \"flock: \"", resp.Error.Msg)
			}
			if !strings.Contains(resp.Error.Msg, tc.want) {
				t.Errorf("message %q does not contain %q", resp.Error.Msg, tc.want)
			}
			e.wantNothingFor("c1")
		})
	}
}

func TestHandleAddResult(t *testing.T) {
	e := started(t)
	resp := e.a.Handle(context.Background(), addReq("c1", podArgs("prod", "web-0",
		annotations.Addresses+"=2001:db8:aa::1,198.51.100.7", annotations.Anycast+"=2001:db8:ff::1")))
	if resp.Error != nil {
		t.Fatalf("ADD: %+v", resp.Error)
	}
	rec := e.a.Allocations()[0]

	// The raw JSON says 1.1.0 and decodes as a 1.1.0 result.
	var hdr struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(resp.Result, &hdr); err != nil || hdr.CNIVersion != "1.1.0" {
		t.Fatalf("cniVersion = %q (%v), want 1.1.0; result %s", hdr.CNIVersion, err, resp.Result)
	}
	generic, err := current.NewResult(resp.Result)
	if err != nil {
		t.Fatalf("decode result: %v\n%s", err, resp.Result)
	}
	res, err := current.GetResult(generic)
	if err != nil {
		t.Fatal(err)
	}
	if res.CNIVersion != "1.1.0" {
		t.Errorf("CNIVersion = %q", res.CNIVersion)
	}

	// Interfaces: host veth, then the pod's eth0 inside the netns.
	if len(res.Interfaces) != 2 {
		t.Fatalf("interfaces = %+v, want 2", res.Interfaces)
	}
	host, pod := res.Interfaces[0], res.Interfaces[1]
	if host.Name != dataplane.HostVethName("c1") || host.Sandbox != "" || host.Mac != rec.HostMAC {
		t.Errorf("host interface = %+v", host)
	}
	if pod.Name != "eth0" || pod.Sandbox != netnsOf("c1") || pod.Mac != rec.PodMAC {
		t.Errorf("pod interface = %+v, want eth0 in %s", pod, netnsOf("c1"))
	}

	// IPs: pod IPv6, pod IPv4 (with gateways), then the addresses IPs.
	type ipWant struct {
		cidr string
		gw   string
	}
	want := []ipWant{
		{rec.IPs[0].String() + "/128", "fe80::1"},
		{rec.IPs[1].String() + "/32", "169.254.1.1"},
		{"2001:db8:aa::1/128", ""},
		{"198.51.100.7/32", ""},
	}
	if len(res.IPs) != len(want) {
		t.Fatalf("IPs = %v, want %d", res.IPs, len(want))
	}
	for i, w := range want {
		ip := res.IPs[i]
		if ip.Address.String() != w.cidr {
			t.Errorf("IPs[%d] = %s, want %s", i, ip.Address.String(), w.cidr)
		}
		gw := ""
		if ip.Gateway != nil {
			gw = ip.Gateway.String()
		}
		if gw != w.gw {
			t.Errorf("IPs[%d] gateway = %q, want %q", i, gw, w.gw)
		}
		if ip.Interface == nil || *ip.Interface != 1 {
			t.Errorf("IPs[%d] interface = %v, want 1 (eth0)", i, ip.Interface)
		}
	}
	if !strings.HasPrefix(res.IPs[0].Address.IP.String(), "fd00:10:1:") {
		t.Errorf("first IP %s is not the pod IPv6", res.IPs[0].Address.IP)
	}
	// Anycast IPs are not in the result.
	if strings.Contains(string(resp.Result), "2001:db8:ff::1") {
		t.Errorf("anycast IP in the result: %s", resp.Result)
	}

	// Default routes for both families.
	if len(res.Routes) != 2 {
		t.Fatalf("routes = %v, want 2", res.Routes)
	}
	wantRoutes := []struct{ dst, gw string }{{"::/0", "fe80::1"}, {"0.0.0.0/0", "169.254.1.1"}}
	for i, w := range wantRoutes {
		r := res.Routes[i]
		if r.Dst.String() != w.dst || r.GW.String() != w.gw {
			t.Errorf("route[%d] = %s via %s, want %s via %s", i, r.Dst.String(), r.GW, w.dst, w.gw)
		}
	}

	// A retried ADD returns the identical result.
	again := e.a.Handle(context.Background(), addReq("c1", podArgs("prod", "web-0",
		annotations.Addresses+"=2001:db8:aa::1,198.51.100.7", annotations.Anycast+"=2001:db8:ff::1")))
	if again.Error != nil || string(again.Result) != string(resp.Result) {
		t.Errorf("retried ADD: %+v / %s, want %s", again.Error, again.Result, resp.Result)
	}
}

func TestHandleAddResultIPv6Only(t *testing.T) {
	s := testSpec()
	s.Defaults.IPv4 = false
	e := started(t, withSpec(s))
	resp := e.a.Handle(context.Background(), addReq("c1", podArgs("default", "p")))
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	r, err := current.NewResult(resp.Result)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := current.GetResult(r)
	if len(res.IPs) != 1 || res.IPs[0].Address.IP.To4() != nil || len(res.Routes) != 1 || res.Routes[0].Dst.String() != "::/0" {
		t.Errorf("IPv6-only result: IPs %v routes %v", res.IPs, res.Routes)
	}
}

func TestHandleOps(t *testing.T) {
	ctx := context.Background()
	e := started(t)
	if resp := e.a.Handle(ctx, addReq("c1", podArgs("default", "p"))); resp.Error != nil {
		t.Fatal(resp.Error)
	}
	addResp := e.a.Handle(ctx, addReq("c2", podArgs("default", "q")))
	if addResp.Error != nil {
		t.Fatal(addResp.Error)
	}

	withPrev := func(prev string) json.RawMessage {
		return json.RawMessage(`{"cniVersion":"1.1.0","name":"n","type":"flock","prevResult":` + prev + `}`)
	}
	c2 := e.a.Allocations()[1]
	other := otherV4(c2.IPs[1])
	wrongPrev := strings.Replace(string(addResp.Result), `"`+c2.IPs[1].String()+`/32"`, `"`+other.String()+`/32"`, 1)
	if wrongPrev == string(addResp.Result) {
		t.Fatal("could not build a mismatching prevResult")
	}

	tests := []struct {
		name string
		req  wire.Request
		code uint // 0: success
		want string
	}{
		{"status", wire.Request{Op: wire.OpStatus, Config: json.RawMessage(netConf)}, 0, ""},
		{"check ok", wire.Request{Op: wire.OpCheck, ContainerID: "c2", IfName: "eth0", Config: json.RawMessage(netConf)}, 0, ""},
		{"check with prevResult", wire.Request{Op: wire.OpCheck, ContainerID: "c2", IfName: "eth0", Config: withPrev(string(addResp.Result))}, 0, ""},
		{"check with null prevResult", wire.Request{Op: wire.OpCheck, ContainerID: "c2", IfName: "eth0", Config: withPrev("null")}, 0, ""},
		{"check prevResult mismatch", wire.Request{Op: wire.OpCheck, ContainerID: "c2", IfName: "eth0", Config: withPrev(wrongPrev)}, types.ErrInternal, other.String()},
		{"check bad prevResult", wire.Request{Op: wire.OpCheck, ContainerID: "c2", IfName: "eth0", Config: withPrev(`{"ips":5}`)}, types.ErrDecodingFailure, "prevResult"},
		{"check unknown", wire.Request{Op: wire.OpCheck, ContainerID: "nope", IfName: "eth0", Config: json.RawMessage(netConf)}, types.ErrUnknownContainer, "nope"},
		{"bad config", wire.Request{Op: wire.OpCheck, ContainerID: "c2", Config: json.RawMessage(`{"cniVersion":5}`)}, types.ErrDecodingFailure, "network config"},
		{"unknown op", wire.Request{Op: wire.Op("FROB"), Config: json.RawMessage(netConf)}, types.ErrInvalidNetworkConfig, "FROB"},
		{"del unknown", wire.Request{Op: wire.OpDel, ContainerID: "ghost", IfName: "eth0", Config: json.RawMessage(netConf)}, 0, ""},
		{"del c1", wire.Request{Op: wire.OpDel, ContainerID: "c1", IfName: "eth0", Config: json.RawMessage(netConf)}, 0, ""},
		{"del c1 again", wire.Request{Op: wire.OpDel, ContainerID: "c1", IfName: "eth0", Config: json.RawMessage(netConf)}, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.a.Handle(ctx, tc.req)
			if tc.code == 0 {
				if resp.Error != nil {
					t.Fatalf("error %+v", resp.Error)
				}
				return
			}
			if resp.Error == nil {
				t.Fatal("succeeded")
			}
			if resp.Error.Code != tc.code {
				t.Errorf("code = %d, want %d (%s)", resp.Error.Code, tc.code, resp.Error.Msg)
			}
			if !strings.HasPrefix(resp.Error.Msg, "flock: ") || !strings.Contains(resp.Error.Msg, tc.want) {
				t.Errorf("message %q: want prefix \"flock: \" and %q", resp.Error.Msg, tc.want)
			}
		})
	}
	if ids := e.allocIDs(); len(ids) != 1 || ids[0] != "c2" {
		t.Errorf("allocations = %v, want [c2]", ids)
	}
}

func TestHandleGC(t *testing.T) {
	ctx := context.Background()
	e := started(t)
	for _, id := range []string{"a", "b", "c"} {
		if resp := e.a.Handle(ctx, addReq(id, podArgs("default", id))); resp.Error != nil {
			t.Fatal(resp.Error)
		}
	}
	conf := `{"cniVersion":"1.1.0","name":"n","type":"flock","cni.dev/valid-attachments":[` +
		`{"containerID":"a","ifname":"eth0"},{"containerID":"c","ifname":"eth0"}]}`
	resp := e.a.Handle(ctx, wire.Request{Op: wire.OpGC, Config: json.RawMessage(conf)})
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	if ids := e.allocIDs(); len(ids) != 2 || ids[0] != "a" || ids[1] != "c" {
		t.Errorf("allocations after GC = %v, want [a c]", ids)
	}
	if e.dp.count(td("b")) != 1 {
		t.Error("b not torn down")
	}
}

// The result for a stored allocation does not depend on the order the IPs
// were recorded in.
func TestHandleAddResultOrderFromRestoredRecord(t *testing.T) {
	e := newEnv(t)
	putRecord(t, e.dir, store.Allocation{
		ContainerID: "old", State: store.Committed,
		IPs: []netip.Addr{mustAddr("10.1.1.9"), mustAddr("fd00:10:1::9")}, // IPv4 first on disk
	})
	if err := e.run(); err != nil {
		t.Fatal(err)
	}
	resp := e.a.Handle(context.Background(), addReq("old", podArgs("default", "old")))
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	r, err := current.NewResult(resp.Result)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := current.GetResult(r)
	if len(res.IPs) != 2 || !res.IPs[0].Address.IP.Equal(net.ParseIP("fd00:10:1::9")) || !res.IPs[1].Address.IP.Equal(net.ParseIP("10.1.1.9")) {
		t.Errorf("IPs = %v, want IPv6 first", res.IPs)
	}
}

// The result comes in the config's spec version (the plugin prints it as
// it is); unknown ones, which the plugin refuses before asking, get the
// agent's own.
func TestHandleAddResultVersion(t *testing.T) {
	for i, c := range []struct{ conf, want string }{
		{"1.0.0", "1.0.0"}, {"1.1.0", "1.1.0"}, {"0.4.0", "0.4.0"}, {"0.3.1", "0.3.1"}, {"9.9.9", "1.1.0"}, {"", "1.1.0"},
	} {
		t.Run(c.conf, func(t *testing.T) {
			e := started(t)
			id := fmt.Sprintf("v%d", i)
			req := addReq(id, podArgs("prod", "web-0"))
			req.Config = json.RawMessage(fmt.Sprintf(`{"cniVersion":%q,"name":"n","type":"flock"}`, c.conf))
			resp := e.a.Handle(context.Background(), req)
			if resp.Error != nil {
				t.Fatalf("ADD: %+v", resp.Error)
			}
			res, err := version.NewResult(c.want, resp.Result)
			if err != nil || res.Version() != c.want {
				t.Fatalf("result %s: want a %s result (%v)", resp.Result, c.want, err)
			}
			cur, err := current.GetResult(res)
			rec := e.a.Allocations()[0]
			if err != nil || len(cur.IPs) != len(rec.IPs) || len(cur.Interfaces) != 2 || cur.Interfaces[0].Mac != rec.HostMAC {
				t.Errorf("result %+v (%v) does not carry allocation %+v", cur, err, rec)
			}
		})
	}
}
