package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/cni/agentsock"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

// agent is a real wire.Server on a temporary socket whose handler the
// test sets; it records every request it gets.
type agent struct {
	sock   string
	mu     sync.Mutex
	reqs   []wire.Request
	answer func(wire.Request) wire.Response
}

func newAgent(t *testing.T, answer func(wire.Request) wire.Response) *agent {
	t.Helper()
	a := &agent{sock: filepath.Join(t.TempDir(), "cni.sock"), answer: answer}
	l, err := wire.Listen(a.sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s := wire.Server{Listener: l, Handler: wire.HandlerFunc(func(_ context.Context, r wire.Request) wire.Response {
			a.mu.Lock()
			a.reqs = append(a.reqs, r)
			answer := a.answer
			a.mu.Unlock()
			return answer(r)
		})}
		_ = s.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

func (a *agent) setAnswer(f func(wire.Request) wire.Response) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answer = f
}

func (a *agent) requests() []wire.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]wire.Request(nil), a.reqs...)
}

// resultIn is an ADD result in spec version v.
func resultIn(v string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"cniVersion":%q,"interfaces":[{"name":"flock1","mac":"02:00:00:00:00:01"},{"name":"eth0","mac":"02:00:00:00:00:02","sandbox":"/ns"}],"ips":[{"interface":1,"address":"2001:db8:100:1::5/128","gateway":"fe80::1"}]}`, v))
}

// answerInConfigVersion is what the agent does: ADD answered in the
// config's spec version.
func answerInConfigVersion(r wire.Request) wire.Response {
	if r.Op != wire.OpAdd {
		return wire.Response{}
	}
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(r.Config, &c)
	return wire.Response{Result: resultIn(c.CNIVersion)}
}

// cniEnv is a complete, valid environment for command.
func cniEnv(command string) map[string]string {
	return map[string]string{"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/none",
		"CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
}

func confFor(sock, v string) string {
	return fmt.Sprintf(`{"cniVersion":%q,"name":"n","type":"flock","socket":%q}`, v, sock)
}

type outcome struct {
	exit           int
	stdout, stderr string
}

func invoke(env map[string]string, stdin string) outcome {
	var stdout, stderr bytes.Buffer
	code := Run(func(k string) string { return env[k] }, strings.NewReader(stdin), &stdout, &stderr)
	return outcome{code, stdout.String(), stderr.String()}
}

// cniErr reads the CNI error o printed; it fails the test if there is none.
func cniErr(t *testing.T, what string, o outcome) types.Error {
	t.Helper()
	var e types.Error
	if o.exit != 1 || json.Unmarshal([]byte(o.stdout), &e) != nil || e.Code == 0 {
		t.Fatalf("%s: exit %d, stdout %q: want a CNI error and exit 1", what, o.exit, o.stdout)
	}
	return e
}

// ADD prints the agent's result as it came, in the config's version; an
// agent answering in another version (one older than the plugin) is an
// error naming both.
func TestAddPrintsResultInConfigVersion(t *testing.T) {
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			a := newAgent(t, answerInConfigVersion)
			o := invoke(cniEnv("ADD"), confFor(a.sock, v))
			if o.exit != 0 || o.stdout != string(resultIn(v))+"\n" {
				t.Fatalf("exit %d, stdout %s: want the agent's result as it came", o.exit, o.stdout)
			}
			res, err := version.NewResult(v, []byte(o.stdout))
			if err != nil {
				t.Fatalf("not a %s result: %v", v, err)
			}
			cur, err := current.GetResult(res)
			if err != nil || len(cur.IPs) != 1 || cur.IPs[0].Address.String() != "2001:db8:100:1::5/128" {
				t.Errorf("result %+v (%v)", cur, err)
			}
		})
	}
	a := newAgent(t, func(wire.Request) wire.Response { return wire.Response{Result: resultIn("1.1.0")} })
	e := cniErr(t, "older agent", invoke(cniEnv("ADD"), confFor(a.sock, "0.4.0")))
	if e.Code != types.ErrIncompatibleCNIVersion || !strings.Contains(e.Msg, `"1.1.0"`) || !strings.Contains(e.Msg, `"0.4.0"`) {
		t.Errorf("older agent: %+v, want code 1 naming both versions", e)
	}
}

// What the plugin sends is what cni/wire's client sent: the agent reads
// it with wire.ReadFrame, byte for byte as wire.WriteFrame writes it.
func TestRequestFrameIsWires(t *testing.T) {
	for _, r := range []request{
		{op: "ADD", containerID: "c1", netns: "/run/netns/x", ifName: "eth0", args: "K8S_POD_NAME=a;IgnoreUnknown=1", config: []byte(" {\n \"cniVersion\" : \"1.1.0\",\n\t\"name\":\"n\", \"x\":\"a b\\n<&>\u2028\" }\n")},
		{op: "GC", config: []byte(`{"cni.dev/valid-attachments":[{"containerID":"c","ifname":"eth0"}]}`)},
		{op: "STATUS", containerID: "é\x00\xff\"", config: []byte(`{}`)},
	} {
		want := wire.Request{Op: wire.Op(r.op), ContainerID: r.containerID, Netns: r.netns, IfName: r.ifName, Args: r.args, Config: r.config}
		var b bytes.Buffer
		if err := wire.WriteFrame(&b, want); err != nil {
			t.Fatal(err)
		}
		if got := r.frame(); !bytes.Equal(got, b.Bytes()) {
			t.Errorf("frame\n%s\nwire.WriteFrame:\n%s", got, b.Bytes())
		}
	}
}

func FuzzRequestFrame(f *testing.F) {
	f.Add("ADD", "c1", "/run/netns/x", "eth0", "A=b", []byte(`{"name":"n"}`))
	f.Add("DEL", "", "", "", "", []byte("{\"a\":\"\\u2028\u2028\"}"))
	f.Fuzz(func(t *testing.T, op, id, netns, ifName, args string, config []byte) {
		if !json.Valid(config) {
			return // the plugin sends only configs it has read as JSON
		}
		var b bytes.Buffer
		want := wire.Request{Op: wire.Op(op), ContainerID: id, Netns: netns, IfName: ifName, Args: args, Config: config}
		if err := wire.WriteFrame(&b, want); err != nil {
			return
		}
		r := request{op: op, containerID: id, netns: netns, ifName: ifName, args: args, config: config}
		if got := r.frame(); !bytes.Equal(got, b.Bytes()) {
			t.Fatalf("frame %q, wire.WriteFrame %q", got, b.Bytes())
		}
	})
}

// The agent's responses, as wire.WriteFrame writes them, are read.
func TestParseResponse(t *testing.T) {
	for _, resp := range []wire.Response{
		{Result: resultIn("1.1.0")},
		{Error: types.NewError(types.ErrTryAgainLater, "busy <&>", "details")},
		{},
	} {
		var b bytes.Buffer
		if err := wire.WriteFrame(&b, resp); err != nil {
			t.Fatal(err)
		}
		got, err := parseResponse(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
		if err != nil {
			t.Fatalf("%s: %v", b.Bytes(), err)
		}
		if !bytes.Equal(got.result, resp.Result) {
			t.Errorf("result %s, want %s", got.result, resp.Result)
		}
		var e *types.Error
		if got.err != nil {
			if err := json.Unmarshal(got.err, &e); err != nil {
				t.Fatal(err)
			}
		}
		if fmt.Sprint(e) != fmt.Sprint(resp.Error) {
			t.Errorf("error %v, want %v", e, resp.Error)
		}
	}
	for _, bad := range []string{``, `{`, `[]`, `null`, `{"result":1}`, `{"error":"x"}`, `{"other":{}}`, `{"result":{}} x`} {
		if r, err := parseResponse([]byte(bad)); err == nil {
			t.Errorf("response %q read as %+v, want an error", bad, r)
		}
	}
}

// The plugin's constants are cni/wire's and the CNI library's.
func TestConstantsAgree(t *testing.T) {
	if maxFrameBytes != wire.MaxFrameBytes {
		t.Errorf("maxFrameBytes %d, wire %d", maxFrameBytes, wire.MaxFrameBytes)
	}
	for _, c := range []struct{ ours, lib uint }{
		{errIncompatibleCNIVersion, types.ErrIncompatibleCNIVersion}, {errInvalidEnvironmentVariables, types.ErrInvalidEnvironmentVariables},
		{errIOFailure, types.ErrIOFailure}, {errDecodingFailure, types.ErrDecodingFailure}, {errInvalidNetworkConfig, types.ErrInvalidNetworkConfig},
		{errInvalidNetNS, types.ErrInvalidNetNS}, {errTryAgainLater, types.ErrTryAgainLater}, {errPluginNotAvailable, types.ErrPluginNotAvailable},
		{errInternal, types.ErrInternal},
	} {
		if c.ours != c.lib {
			t.Errorf("code %d, the CNI library's %d", c.ours, c.lib)
		}
	}
	if implementedVersion != SupportedVersions[len(SupportedVersions)-1] {
		t.Errorf("implementedVersion %s is not the newest supported", implementedVersion)
	}
	if wire.DefaultSocket != agentsock.DefaultPath {
		t.Errorf("wire.DefaultSocket %s, agentsock %s", wire.DefaultSocket, agentsock.DefaultPath)
	}
}

// VERSION prints what the CNI library's version package printed, and
// errors decode as its types.Error.
func TestVersionAndErrorJSON(t *testing.T) {
	var want bytes.Buffer
	if err := version.PluginSupports(SupportedVersions...).Encode(&want); err != nil {
		t.Fatal(err)
	}
	if o := invoke(map[string]string{"CNI_COMMAND": "VERSION"}, "ignored"); o.exit != 0 || o.stdout != want.String() {
		t.Errorf("VERSION: exit %d, %q; want %q", o.exit, o.stdout, want.String())
	}
	for _, e := range []*cniError{newError(7, "a \"b\"\n", ""), newError(11, "x", "y\x00")} {
		var got types.Error
		if err := json.Unmarshal(e.json(), &got); err != nil || got.Code != e.code || got.Msg != e.msg || got.Details != e.details {
			t.Errorf("%s read as %+v (%v)", e.json(), got, err)
		}
	}
}

// Run by hand (no CNI_COMMAND), it says what it is and succeeds.
func TestAbout(t *testing.T) {
	o := invoke(map[string]string{}, "")
	if o.exit != 0 || o.stdout != "" || !strings.Contains(o.stderr, "CNI protocol versions supported: 0.3.1, 0.4.0, 1.0.0, 1.1.0") {
		t.Errorf("%+v", o)
	}
}

func with(env map[string]string, kv ...string) map[string]string {
	env = maps.Clone(env)
	for i := 0; i < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return env
}

// Bad input gets a CNI error with the CNI library's code, naming the
// variable or field and its value, and reaches no agent.
func TestBadInput(t *testing.T) {
	a := newAgent(t, answerInConfigVersion)
	good := confFor(a.sock, "1.1.0")
	for _, tc := range []struct {
		name  string
		env   map[string]string
		stdin string
		code  uint
		says  []string
	}{
		{"missing variables", map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1"}, good, 4, []string{"CNI_NETNS", "CNI_IFNAME", "CNI_PATH", `"ADD"`}},
		{"empty variable", with(cniEnv("DEL"), "CNI_IFNAME", ""), good, 4, []string{"CNI_IFNAME"}},
		{"container ID", with(cniEnv("ADD"), "CNI_CONTAINERID", "a b"), good, 4, []string{"CNI_CONTAINERID", `"a b"`}},
		{"container ID first char", with(cniEnv("DEL"), "CNI_CONTAINERID", "-a"), good, 4, []string{"CNI_CONTAINERID", `"-a"`}},
		{"interface too long", with(cniEnv("ADD"), "CNI_IFNAME", "eth0123456789012"), good, 4, []string{"CNI_IFNAME", "eth0123456789012", "15"}},
		{"interface ..", with(cniEnv("CHECK"), "CNI_IFNAME", ".."), good, 4, []string{"CNI_IFNAME", `".."`}},
		{"interface slash", with(cniEnv("ADD"), "CNI_IFNAME", "a/b"), good, 4, []string{"CNI_IFNAME", `"a/b"`}},
		{"interface space", with(cniEnv("ADD"), "CNI_IFNAME", "a\u00a0b"), good, 4, []string{"CNI_IFNAME"}},
		{"not JSON", cniEnv("ADD"), `{"cniVersion":"1.1.0",`, 6, []string{"not a JSON object", "offset"}},
		{"not an object", cniEnv("ADD"), `["n"]`, 6, []string{"array"}},
		{"field type", cniEnv("ADD"), `{"cniVersion":"1.1.0","name":"n","timeoutSeconds":"5"}`, 6, []string{"timeoutSeconds", `"5"`}},
		{"fraction", cniEnv("ADD"), `{"cniVersion":"1.1.0","name":"n","timeoutSeconds":2.5}`, 6, []string{"timeoutSeconds", "2.5"}},
		{"name type", cniEnv("ADD"), `{"cniVersion":"1.1.0","name":7}`, 6, []string{"name", "7"}},
		{"no name", cniEnv("ADD"), `{"cniVersion":"1.1.0"}`, 7, []string{"name"}},
		{"null config", cniEnv("ADD"), `null`, 7, []string{"name"}},
		{"bad name", cniEnv("ADD"), `{"cniVersion":"1.1.0","name":"a/b"}`, 7, []string{"name", `"a/b"`}},
		{"unsupported version", cniEnv("ADD"), `{"cniVersion":"0.2.0","name":"n"}`, 1, []string{"cniVersion", `"0.2.0"`, "1.1.0"}},
		{"no version", cniEnv("DEL"), `{"name":"n"}`, 1, []string{"cniVersion", `"0.1.0"`}},
		{"CHECK before 0.4.0", cniEnv("CHECK"), confFor(a.sock, "0.3.1"), 1, []string{"CHECK", "0.4.0", `"0.3.1"`}},
		{"GC before 1.1.0", with(cniEnv("GC")), confFor(a.sock, "1.0.0"), 1, []string{"GC", "1.1.0", `"1.0.0"`}},
		{"STATUS before 1.1.0", cniEnv("STATUS"), confFor(a.sock, "0.4.0"), 1, []string{"STATUS", "1.1.0"}},
		{"STATUS unparsable version", cniEnv("STATUS"), confFor(a.sock, "1.x"), 6, []string{"cniVersion", `"1.x"`}},
		{"negative timeout", cniEnv("ADD"), `{"cniVersion":"1.1.0","name":"n","timeoutSeconds":-1}`, 7, []string{"timeoutSeconds", "-1"}},
		{"unknown command", with(cniEnv("ADD"), "CNI_COMMAND", "FROB"), good, 4, []string{"CNI_COMMAND", `"FROB"`}},
		{"host's netns", with(cniEnv("ADD"), "CNI_NETNS", "/proc/self/ns/net"), good, 8, []string{"CNI_NETNS", "/proc/self/ns/net"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(a.requests())
			e := cniErr(t, tc.name, invoke(tc.env, tc.stdin))
			if e.Code != tc.code {
				t.Errorf("code %d (%s), want %d", e.Code, e.Msg, tc.code)
			}
			for _, s := range tc.says {
				if !strings.Contains(e.Msg, s) {
					t.Errorf("message %q does not name %q", e.Msg, s)
				}
			}
			if n := len(a.requests()); n != before {
				t.Errorf("the agent got %d request(s)", n-before)
			}
		})
	}
	// The netns check is waived when the runtime says it is meant.
	if o := invoke(with(cniEnv("ADD"), "CNI_NETNS", "/proc/self/ns/net", "CNI_NETNS_OVERRIDE", "true"), good); o.exit != 0 {
		t.Errorf("CNI_NETNS_OVERRIDE: %+v", o)
	}
}

// Every command reaches the agent with the environment and config as
// given.
func TestForwards(t *testing.T) {
	a := newAgent(t, answerInConfigVersion)
	conf := " {\n  \"cniVersion\": \"1.1.0\", \"name\": \"n\", \"socket\": " + quote(a.sock) + ", \"ipam\": {\"x\": [1, 2]}\n}\n"
	for _, cmd := range []string{"ADD", "CHECK", "DEL", "GC", "STATUS"} {
		env := with(cniEnv(cmd), "CNI_ARGS", "K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns")
		if o := invoke(env, conf); o.exit != 0 {
			t.Fatalf("%s: %+v", cmd, o)
		}
		reqs := a.requests()
		r := reqs[len(reqs)-1]
		var cfg map[string]any
		if err := json.Unmarshal(r.Config, &cfg); err != nil || cfg["name"] != "n" || cfg["ipam"] == nil {
			t.Errorf("%s: config %s (%v)", cmd, r.Config, err)
		}
		if r.Op != wire.Op(cmd) || r.ContainerID != "c1" || r.Netns != "/var/run/netns/none" || r.IfName != "eth0" || r.Args != "K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns" {
			t.Errorf("%s: request %+v", cmd, r)
		}
	}
	// The agent's error is printed as it sent it.
	a.setAnswer(func(wire.Request) wire.Response {
		return wire.Response{Error: types.NewError(types.ErrInvalidNetworkConfig, "flock: pool \"x\" is full", "d")}
	})
	e := cniErr(t, "agent error", invoke(cniEnv("ADD"), conf))
	if e.Code != types.ErrInvalidNetworkConfig || e.Msg != `flock: pool "x" is full` || e.Details != "d" {
		t.Errorf("agent error printed as %+v", e)
	}
}

// An agent that answers ADD with no result: a decoding failure, as the
// skel-based plugin reported it.
func TestAddWithoutResult(t *testing.T) {
	a := newAgent(t, func(wire.Request) wire.Response { return wire.Response{} })
	e := cniErr(t, "no result", invoke(cniEnv("ADD"), confFor(a.sock, "1.1.0")))
	if e.Code != types.ErrDecodingFailure || !strings.Contains(e.Msg, "without a result") {
		t.Errorf("%+v, want code 6 saying there was no result", e)
	}
}
