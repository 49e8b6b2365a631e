package plugin

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func mark(t *testing.T, sock string, until time.Duration) {
	t.Helper()
	if err := wire.WriteRestart(sock, wire.Restart{Until: time.Now().Add(until)}); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, what string, o outcome, code uint, says string) {
	t.Helper()
	e := cniErr(t, what, o)
	if e.Code != code || !strings.Contains(e.Msg, says) {
		t.Errorf("%s: %+v, want code %d with %q", what, e, code, says)
	}
}

// No agent: STATUS fails (the node goes NotReady) unless a planned
// restart's fresh marker says it is coming back; ADD fails fast with
// code 11 either way, saying which.
func TestNoAgentWithAndWithoutRestartMarker(t *testing.T) {
	for _, tc := range []struct {
		name       string
		marker     time.Duration // 0: none
		statusOK   bool
		addMessage string
	}{
		{"no marker (a crash)", 0, false, "the flock agent is not running"},
		{"fresh marker (a planned stop)", 30 * time.Second, true, "the flock agent is restarting"},
		{"expired marker", -time.Second, false, "the flock agent is not running"},
		{"marker beyond the longest grace", wire.MaxRestartGrace + time.Minute, false, "the flock agent is not running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "cni.sock")
			if tc.marker != 0 {
				mark(t, sock, tc.marker)
			}
			o := invoke(cniEnv("STATUS"), confFor(sock, "1.1.0"))
			if tc.statusOK && o.exit != 0 {
				t.Errorf("STATUS: %+v, want success", o)
			}
			if !tc.statusOK {
				wantCode(t, "STATUS", o, types.ErrPluginNotAvailable, "the flock agent is not running")
			}
			start := time.Now()
			wantCode(t, "ADD", invoke(cniEnv("ADD"), confFor(sock, "1.1.0")), types.ErrTryAgainLater, tc.addMessage)
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("ADD took %v: want it to fail fast", d)
			}
		})
	}
}

// A new agent holds calls in its socket's backlog while it recovers:
// during a planned restart STATUS does not wait its full timeout for it,
// and succeeds; without a marker, the wait ends at the timeout in an
// error naming it.
func TestAgentThatDoesNotAnswer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cni.sock")
	l, err := net.Listen("unix", sock) // bound, never accepts
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	o := invoke(cniEnv("ADD"), `{"cniVersion":"1.1.0","name":"n","timeoutSeconds":1,"socket":`+quote(sock)+`}`)
	wantCode(t, "ADD to an agent that does not answer", o, types.ErrIOFailure, "ADD via "+sock+" failed")
	if d := time.Since(start); d < time.Second || d > 3*time.Second {
		t.Errorf("ADD gave up after %v, want its 1s timeout", d)
	}
	if !strings.Contains(o.stdout, "did not answer within 1s") {
		t.Errorf("ADD: %s, want the timeout named", o.stdout)
	}
	mark(t, sock, 30*time.Second)
	start = time.Now()
	if o := invoke(cniEnv("STATUS"), confFor(sock, "1.1.0")); o.exit != 0 {
		t.Errorf("STATUS: %+v, want success", o)
	}
	if d := time.Since(start); d >= statusTimeout {
		t.Errorf("STATUS took %v, want less than its usual %v", d, statusTimeout)
	}
}

// An agent that answers is believed, marker or not.
func TestStatusBelievesAnAnsweringAgent(t *testing.T) {
	a := newAgent(t, func(wire.Request) wire.Response {
		return wire.Response{Error: types.NewError(types.ErrPluginNotAvailable, "flock: not ready", "")}
	})
	mark(t, a.sock, 30*time.Second)
	wantCode(t, "STATUS", invoke(cniEnv("STATUS"), confFor(a.sock, "1.1.0")), types.ErrPluginNotAvailable, "flock: not ready")
}

// With no agent, a DEL of a sandbox whose network namespace is gone (a
// reboot: the runtime tears the dead sandboxes down before the agent pod
// is back) succeeds — nothing is left in the kernel, the agent reaps the
// allocation at its start; a DEL of a live namespace fails for the
// runtime to retry.
func TestDelWithoutAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cni.sock")
	left := filepath.Join(t.TempDir(), "cni-1234") // a bind mount's file, unmounted
	if err := os.WriteFile(left, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		netns string
		ok    bool
	}{
		{"", true},
		{filepath.Join(t.TempDir(), "cni-gone"), true},
		{left, true},
		{"/proc/self/ns/net", false}, // a live namespace
	} {
		o := invoke(with(cniEnv("DEL"), "CNI_NETNS", tc.netns, "CNI_NETNS_OVERRIDE", "1"), confFor(sock, "1.1.0"))
		if tc.ok && o.exit != 0 {
			t.Errorf("DEL of netns %q with no agent: %+v, want success", tc.netns, o)
		}
		if !tc.ok {
			wantCode(t, "DEL of a live netns with no agent", o, types.ErrTryAgainLater, "the flock agent is not running")
		}
	}
}
