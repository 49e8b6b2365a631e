package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func argsFor(sock string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/ns", IfName: "eth0",
		StdinData: []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"flock","socket":%q}`, sock))}
}

// cniError asserts err is a CNI error with code and a message holding want.
func cniError(t *testing.T, what string, err error, code uint, want string) {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) || te.Code != code || !strings.Contains(te.Msg, want) {
		t.Errorf("%s: %v, want code %d with %q", what, err, code, want)
	}
}

func mark(t *testing.T, sock string, until time.Duration) {
	t.Helper()
	if err := wire.WriteRestart(sock, wire.Restart{Until: time.Now().Add(until)}); err != nil {
		t.Fatal(err)
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
			err := Status(argsFor(sock))
			if tc.statusOK && err != nil {
				t.Errorf("STATUS: %v, want success", err)
			}
			if !tc.statusOK {
				cniError(t, "STATUS", err, types.ErrPluginNotAvailable, "the flock agent is not running")
			}
			start := time.Now()
			cniError(t, "ADD", Add(argsFor(sock)), types.ErrTryAgainLater, tc.addMessage)
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("ADD took %v: want it to fail fast", d)
			}
		})
	}
}

// A new agent holds calls in its socket's backlog while it recovers:
// during a planned restart STATUS does not wait its full timeout for it,
// and succeeds.
func TestStatusDuringRestartDoesNotWaitForARecoveringAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cni.sock")
	l, err := net.Listen("unix", sock) // bound, never accepts
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mark(t, sock, 30*time.Second)
	start := time.Now()
	if err := Status(argsFor(sock)); err != nil {
		t.Errorf("STATUS: %v, want success", err)
	}
	if d := time.Since(start); d >= statusTimeout {
		t.Errorf("STATUS took %v, want less than its usual %v", d, statusTimeout)
	}
}

// An agent that answers is believed, marker or not.
func TestStatusBelievesAnAnsweringAgent(t *testing.T) {
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
			return wire.Response{Error: types.NewError(types.ErrPluginNotAvailable, "flock: not ready", "")}
		})}
		_ = s.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	mark(t, sock, 30*time.Second)
	cniError(t, "STATUS", Status(argsFor(sock)), types.ErrPluginNotAvailable, "flock: not ready")
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
		a := argsFor(sock)
		a.Netns = tc.netns
		err := Del(a)
		if tc.ok && err != nil {
			t.Errorf("DEL of netns %q with no agent: %v, want success", tc.netns, err)
		}
		if !tc.ok {
			cniError(t, "DEL of a live netns with no agent", err, types.ErrTryAgainLater, "the flock agent is not running")
		}
	}
}
