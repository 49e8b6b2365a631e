package plugin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// The plugin once ran on the CNI library's skel; it checks the CNI
// environment and config by hand now. skel, with the checks the plugin
// made on top of it, is the oracle: for any environment and config, the
// same CNI error code (or success), and the agent asked exactly when skel
// would have called the plugin. One difference is meant: an ADD into the
// plugin's own network namespace is refused before the agent is asked
// (skel asked, then failed).

var cniVars = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

// oldPluginChecks are the checks the skel-based plugin made in its
// callbacks before it asked the agent.
func oldPluginChecks(stdin []byte) error {
	var c struct {
		CNIVersion     string `json:"cniVersion"`
		Socket         string `json:"socket,omitempty"`
		TimeoutSeconds int    `json:"timeoutSeconds,omitempty"`
	}
	if err := json.Unmarshal(stdin, &c); err != nil {
		return types.NewError(types.ErrDecodingFailure, "not valid JSON", err.Error())
	}
	if c.TimeoutSeconds < 0 {
		return types.NewError(types.ErrInvalidNetworkConfig, "negative", "")
	}
	return nil
}

// skelOutcome runs skel in this process on env and stdin: the error code
// (0: success) and whether it called the plugin's function.
func skelOutcome(t testing.TB, env map[string]string, stdin []byte) (code uint, called bool) {
	for _, k := range cniVars {
		if v, ok := env[k]; ok {
			os.Setenv(k, v)
		} else {
			os.Unsetenv(k)
		}
	}
	defer func() {
		for _, k := range cniVars {
			os.Unsetenv(k)
		}
	}()
	in := filepath.Join(t.TempDir(), "stdin")
	if err := os.WriteFile(in, stdin, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	oldIn, oldOut := os.Stdin, os.Stdout
	devnull, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	defer devnull.Close()
	os.Stdin, os.Stdout = f, devnull
	defer func() { os.Stdin, os.Stdout = oldIn, oldOut }()

	fn := func(*skel.CmdArgs) error {
		if err := oldPluginChecks(stdin); err != nil {
			return err
		}
		called = true
		return nil
	}
	e := skel.PluginMainFuncsWithError(skel.CNIFuncs{Add: fn, Del: fn, Check: fn, GC: fn, Status: fn},
		version.PluginSupports(SupportedVersions...), "")
	if e != nil {
		return e.Code, called
	}
	return 0, called
}

// oursOutcome runs the plugin against a (for) agent.
func oursOutcome(t testing.TB, a *agent, env map[string]string, stdin []byte) (code uint, called bool) {
	before := len(a.requests())
	o := invoke(env, string(stdin))
	called = len(a.requests()) > before
	if o.exit == 0 {
		return 0, called
	}
	var e types.Error
	if err := json.Unmarshal([]byte(o.stdout), &e); err != nil {
		t.Fatalf("stdout %q: %v", o.stdout, err)
	}
	return e.Code, called
}

func compareWithSkel(t *testing.T, a *agent, env map[string]string, stdin []byte) {
	t.Helper()
	if env["CNI_COMMAND"] == "" || env["CNI_COMMAND"] == "VERSION" {
		return // the about text and VERSION: TestAbout, TestVersionAndErrorJSON
	}
	wantCode, wantCalled := skelOutcome(t, env, stdin)
	gotCode, gotCalled := oursOutcome(t, a, env, stdin)
	if env["CNI_COMMAND"] == "ADD" && wantCode == types.ErrInvalidNetNS {
		wantCalled = false // refused before the agent is asked
	}
	if gotCode != wantCode || gotCalled != wantCalled {
		t.Errorf("env %v stdin %q: code %d, agent asked %v; skel: code %d, called %v", env, stdin, gotCode, gotCalled, wantCode, wantCalled)
	}
}

func TestMatchesSkel(t *testing.T) {
	a := newAgent(t, answerInConfigVersion)
	sock := quote(a.sock)
	configs := []string{
		`{"cniVersion":"1.1.0","name":"n","socket":` + sock + `}`,
		`{"cniVersion":"1.0.0","name":"n","socket":` + sock + `}`,
		`{"cniVersion":"0.4.0","name":"n","socket":` + sock + `}`,
		`{"cniVersion":"0.3.1","name":"n","socket":` + sock + `}`,
		`{"cniVersion":"0.3.0","name":"n","socket":` + sock + `}`,
		`{"cniVersion":"1.2.0","name":"n","socket":` + sock + `}`,
		`{"cniVersion":"1.x","name":"n","socket":` + sock + `}`,
		`{"cniVersion":"1.0","name":"n","socket":` + sock + `}`,
		`{"name":"n","socket":` + sock + `}`,
		`{"cniVersion":5,"name":"n","socket":` + sock + `}`,
		`{"cniVersion":"1.1.0","name":"n","socket":5}`,
		`{"cniVersion":"0.2.0","name":"n","socket":5}`,
		`{"cniVersion":"1.1.0","name":"n","socket":` + sock + `,"timeoutSeconds":-1}`,
		`{"cniVersion":"1.1.0","name":"n","socket":` + sock + `,"timeoutSeconds":"1"}`,
		`{"cniVersion":"1.1.0","NAME":"n","Socket":` + sock + `}`,
		`{"cniVersion":"1.1.0","name":"n","name":5,"socket":` + sock + `}`,
		`{"cniVersion":"1.1.0","name":"-n","socket":` + sock + `}`,
		`{"cniVersion":"1.1.0","socket":` + sock + `}`,
		`{"cniVersion":"1.1.0","name":null,"socket":` + sock + `}`,
		`null`, `[]`, `"x"`, `{`, ``, `{"cniVersion":"1.1.0","name":"n"} x`,
	}
	envs := []map[string]string{}
	for _, cmd := range []string{"ADD", "DEL", "CHECK", "GC", "STATUS", "FROB"} {
		base := cniEnv(cmd)
		envs = append(envs, base,
			with(base, "CNI_CONTAINERID", ""), with(base, "CNI_CONTAINERID", "a:b"), with(base, "CNI_NETNS", ""),
			with(base, "CNI_IFNAME", ""), with(base, "CNI_IFNAME", "a b"), with(base, "CNI_IFNAME", "0123456789abcdef"),
			with(base, "CNI_PATH", ""), with(base, "CNI_NETNS", "/proc/self/ns/net"),
			with(base, "CNI_NETNS", "/proc/self/ns/net", "CNI_NETNS_OVERRIDE", "TRUE"),
		)
	}
	for _, env := range envs {
		for _, c := range configs {
			compareWithSkel(t, a, env, []byte(c))
		}
	}
}

// FuzzMatchesSkel holds the plugin to skel on arbitrary environments and
// configs.
func FuzzMatchesSkel(f *testing.F) {
	f.Add("ADD", "c1", "eth0", false, []byte(`{"cniVersion":"1.1.0","name":"n"}`))
	f.Add("CHECK", "c-1.x_y", "net1", true, []byte(`{"cniVersion":"0.4.0","name":"a.b","timeoutSeconds":3}`))
	f.Add("GC", "", "", false, []byte(`{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[]}`))
	f.Add("DEL", "c", "e", false, []byte(`{"cniVersion":"1.0.0","NaMe":"n","ſocket":"x"}`))
	f.Fuzz(func(t *testing.T, cmd, id, ifName string, ownNetns bool, stdin []byte) {
		if strings.ContainsRune(cmd+id+ifName, 0) {
			return // not an environment variable
		}
		a := newAgent(t, answerInConfigVersion)
		// The config's socket is the test agent's, so that a call
		// reaches it; the rest is the fuzzer's.
		var m map[string]json.RawMessage
		if json.Unmarshal(stdin, &m) == nil && m != nil {
			for k := range m {
				if strings.EqualFold(k, "socket") || strings.EqualFold(k, "timeoutSeconds") {
					delete(m, k) // FuzzConfFields compares how these are read
				}
			}
			m["socket"] = json.RawMessage(quote(a.sock))
			stdin, _ = json.Marshal(m)
		}
		netns := "/var/run/netns/none"
		if ownNetns {
			netns = "/proc/self/ns/net"
		}
		env := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": id, "CNI_NETNS": netns, "CNI_IFNAME": ifName, "CNI_PATH": "/opt/cni/bin"}
		compareWithSkel(t, a, env, stdin)
	})
}

// FuzzConfFields: the fields the plugin reads come out as encoding/json
// read them for the skel-based plugin, type errors included.
func FuzzConfFields(f *testing.F) {
	for _, s := range []string{`{"cniVersion":"1.1.0","name":"n","socket":"/s","timeoutSeconds":3}`, `{"ſocket":"x","NAME":"n","name":5}`,
		`{"timeoutSeconds":1e2,"K":1}`, `{"timeoutSeconds":-0}`, `null`, `{"cniVersion":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		var want struct {
			CNIVersion     string `json:"cniVersion"`
			Name           string `json:"name"`
			Socket         string `json:"socket"`
			TimeoutSeconds int    `json:"timeoutSeconds"`
		}
		werr := json.Unmarshal(stdin, &want)
		var syntax *json.SyntaxError
		got, cerr := decodeConf(stdin)
		if errors.As(werr, &syntax) || (werr != nil && !json.Valid(stdin)) {
			if cerr == nil || cerr.code != errDecodingFailure {
				t.Fatalf("%q: encoding/json: %v; plugin: %v", stdin, werr, cerr)
			}
			return
		}
		if cerr != nil && cerr.code == errDecodingFailure && len(got.typeErrs) == 0 {
			// Not an object: encoding/json must have refused it too.
			if werr == nil {
				t.Fatalf("%q: plugin %v, encoding/json took it", stdin, cerr)
			}
			return
		}
		if (werr != nil) != (len(got.typeErrs) > 0) {
			t.Fatalf("%q: encoding/json: %v; plugin type errors: %v", stdin, werr, got.typeErrs)
		}
		if werr == nil && (got.cniVersion != want.CNIVersion || got.name != want.Name || got.socket != want.Socket || got.timeoutSeconds != want.TimeoutSeconds) {
			t.Fatalf("%q: plugin read %+v, encoding/json %+v", stdin, got, want)
		}
	})
}
