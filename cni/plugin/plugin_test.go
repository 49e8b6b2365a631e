package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func TestParseConf(t *testing.T) {
	c, err := parseConf([]byte(`{"cniVersion":"1.1.0","name":"n","type":"flock"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != wire.DefaultSocket || c.TimeoutSeconds != 30 {
		t.Errorf("defaults: socket %q timeout %d", c.Socket, c.TimeoutSeconds)
	}
	c, err = parseConf([]byte(`{"cniVersion":"1.1.0","name":"n","type":"flock","socket":"/tmp/x.sock","timeoutSeconds":5}`))
	if err != nil || c.Socket != "/tmp/x.sock" || c.TimeoutSeconds != 5 {
		t.Errorf("explicit: %+v %v", c, err)
	}
	for _, bad := range []struct{ in, want string }{
		{`{not json`, "not valid JSON"},
		{`{"cniVersion":"1.1.0","name":"n","type":"flock","timeoutSeconds":-1}`, "timeoutSeconds -1"},
	} {
		_, err := parseConf([]byte(bad.in))
		var te *types.Error
		if !errors.As(err, &te) || !strings.Contains(te.Msg, bad.want) {
			t.Errorf("%s: want error containing %q, got %v", bad.in, bad.want, err)
		}
	}
}

// fakeAgent answers every ADD with result.
func fakeAgent(t *testing.T, result string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cni.sock")
	l, err := wire.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s := wire.Server{Listener: l, Handler: wire.HandlerFunc(func(context.Context, wire.Request) wire.Response {
			return wire.Response{Result: json.RawMessage(result)}
		})}
		_ = s.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

// stdoutOf runs f with os.Stdout going to a pipe and returns what it wrote.
func stdoutOf(t *testing.T, f func() error) ([]byte, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	ferr := f()
	os.Stdout = old
	w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return out, ferr
}

// ADD prints the result in the config's spec version: as the agent sent
// it when it is in that version already (not decoded), converted when it
// is not (an older agent answering in its own version).
func TestAddPrintsResultInConfigVersion(t *testing.T) {
	const result = `{"cniVersion":%q,"interfaces":[{"name":"flock1","mac":"02:00:00:00:00:01"},{"name":"eth0","mac":"02:00:00:00:00:02","sandbox":"/ns"}],"ips":[{"interface":1,"address":"10.1.1.5/32","gateway":"169.254.1.1"}]}`
	for _, c := range []struct {
		agent, conf string
		verbatim    bool
	}{
		{"1.0.0", "1.0.0", true},
		{"0.4.0", "0.4.0", true},
		{"1.1.0", "1.0.0", false},
		{"1.1.0", "0.3.1", false},
	} {
		t.Run(c.agent+" for "+c.conf, func(t *testing.T) {
			raw := fmt.Sprintf(result, c.agent)
			sock := fakeAgent(t, raw)
			args := &skel.CmdArgs{ContainerID: "c1", Netns: "/ns", IfName: "eth0",
				StdinData: []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"n","type":"flock","socket":%q}`, c.conf, sock))}
			out, err := stdoutOf(t, func() error { return Add(args) })
			if err != nil {
				t.Fatal(err)
			}
			if c.verbatim && string(out) != raw+"\n" {
				t.Errorf("printed %s, want the agent's result as it came: %s", out, raw)
			}
			res, err := version.NewResult(c.conf, out)
			if err != nil {
				t.Fatalf("printed %s: not a %s result: %v", out, c.conf, err)
			}
			if v := res.Version(); v != c.conf {
				t.Errorf("printed a %s result, want %s: %s", v, c.conf, out)
			}
			cur, err := current.GetResult(res)
			if err != nil || len(cur.IPs) != 1 || cur.IPs[0].Address.String() != "10.1.1.5/32" {
				t.Errorf("result %+v (%v): want 10.1.1.5/32", cur, err)
			}
		})
	}
}
