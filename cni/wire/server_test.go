package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

var _ Handler = HandlerFunc(nil)

// sockDir returns a short temp dir: unix socket paths are limited to ~108
// bytes, and t.TempDir embeds the (long) test name.
func sockDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "fw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// safetyCtx is a generous timeout so a broken test fails instead of hanging.
func safetyCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

type running struct {
	path   string
	cancel context.CancelFunc
	done   chan error
}

// startServer listens on a fresh socket and serves h until the test ends.
func startServer(t *testing.T, h Handler) *running {
	t.Helper()
	path := filepath.Join(sockDir(t), "run", "cni.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{path: path, cancel: cancel, done: make(chan error, 1)}
	srv := &Server{Handler: h, Logger: quietLogger()}
	srv.Listener = l
	go func() { r.done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return r
}

// trackedListener tells when Serve closed it and, with waitAfter set,
// when the server reads a connection again after waitAfter bytes: it is
// waiting for the rest of a request.
type trackedListener struct {
	net.Listener
	closed    chan struct{}
	closeOnce sync.Once
	waitAfter int
	waiting   chan struct{}
	waitOnce  sync.Once
}

func (l *trackedListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.closed) })
	return err
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || l.waiting == nil {
		return c, err
	}
	return &waitingConn{Conn: c, l: l}, nil
}

type waitingConn struct {
	net.Conn
	l   *trackedListener
	got int // read by the serving goroutine only
}

func (c *waitingConn) Read(b []byte) (int, error) {
	if c.got >= c.l.waitAfter {
		c.l.waitOnce.Do(func() { close(c.l.waiting) })
	}
	n, err := c.Conn.Read(b)
	c.got += n
	return n, err
}

func echoHandler() Handler {
	return HandlerFunc(func(ctx context.Context, req Request) Response {
		res := fmt.Sprintf(`{"cniVersion":"1.1.0","echo":{"op":%q,"containerID":%q,"ifName":%q}}`, req.Op, req.ContainerID, req.IfName)
		return Response{Result: []byte(res)}
	})
}

func TestClientAgentNotRunningMissingSocket(t *testing.T) {
	path := filepath.Join(sockDir(t), "nope", "cni.sock")
	_, err := Client{Socket: path}.Call(safetyCtx(t), Request{Op: OpAdd})
	if !errors.Is(err, ErrAgentNotRunning) {
		t.Fatalf("err = %v, want ErrAgentNotRunning", err)
	}
	want := "flock agent not running: dial unix " + path + ": connect: no such file or directory"
	if err.Error() != want {
		t.Errorf("error = %q\n want %q", err, want)
	}
}

func TestClientAgentNotRunningStaleSocket(t *testing.T) {
	path := filepath.Join(sockDir(t), "cni.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	_, err = Client{Socket: path}.Call(safetyCtx(t), Request{Op: OpAdd})
	if !errors.Is(err, ErrAgentNotRunning) {
		t.Fatalf("err = %v, want ErrAgentNotRunning", err)
	}
	if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("error %q does not say connection refused", err)
	}
}

func TestClientIOTimeout(t *testing.T) {
	path := filepath.Join(sockDir(t), "cni.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept() // accept, never answer
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()

	_, err = Client{Socket: path, IOTimeout: 200 * time.Millisecond}.Call(safetyCtx(t), Request{Op: OpAdd})
	if err == nil {
		t.Fatal("Call succeeded against a silent server")
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("err = %v, want a deadline exceeded error", err)
	}
	if errors.Is(err, ErrAgentNotRunning) {
		t.Errorf("err = %v: a connected but silent agent is not 'not running'", err)
	}
	if !strings.Contains(err.Error(), "did not answer within 200ms") {
		t.Errorf("error %q does not explain the timeout", err)
	}
}

func TestClientContextCancel(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	r := startServer(t, HandlerFunc(func(ctx context.Context, req Request) Response {
		close(started)
		<-release
		return Response{}
	}))
	ctx, cancel := context.WithCancel(safetyCtx(t))
	go func() {
		<-started
		cancel()
	}()
	_, err := Client{Socket: r.path}.Call(ctx, Request{Op: OpAdd})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestServerEndToEnd(t *testing.T) {
	r := startServer(t, echoHandler())

	fi, err := os.Stat(r.path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, want socket 0600", fi.Mode())
	}
	if di, err := os.Stat(filepath.Dir(r.path)); err != nil || di.Mode().Perm() != 0o755 {
		t.Errorf("parent dir mode = %v (err %v), want 0755", di.Mode(), err)
	}

	resp, err := Client{Socket: r.path}.Call(safetyCtx(t), Request{Op: OpAdd, ContainerID: "c1", IfName: "eth0", Config: []byte(`{"cniVersion":"1.1.0"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Error != nil {
		t.Fatalf("unexpected error response %+v", resp.Error)
	}
	want := `{"cniVersion":"1.1.0","echo":{"op":"ADD","containerID":"c1","ifName":"eth0"}}`
	if string(resp.Result) != want {
		t.Errorf("result = %s, want %s", resp.Result, want)
	}
}

func TestServerErrorResponse(t *testing.T) {
	r := startServer(t, HandlerFunc(func(ctx context.Context, req Request) Response {
		return Response{Error: types.NewError(types.ErrUnknownContainer, "no such container", req.ContainerID)}
	}))
	resp, err := Client{Socket: r.path}.Call(safetyCtx(t), Request{Op: OpCheck, ContainerID: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Error == nil || resp.Error.Code != types.ErrUnknownContainer || resp.Error.Details != "gone" {
		t.Errorf("resp = %+v", resp)
	}
}

// rawExchange sends raw bytes to the server and decodes its response.
func rawExchange(t *testing.T, path string, send []byte) Response {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	go c.Write(send) // may fail once the server gives up on an oversized frame
	var resp Response
	if err := ReadFrame(bufio.NewReader(c), &resp); err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return resp
}

func TestServerMalformedRequest(t *testing.T) {
	called := make(chan Request, 10)
	r := startServer(t, HandlerFunc(func(ctx context.Context, req Request) Response {
		called <- req
		return Response{}
	}))
	cases := map[string]struct {
		send []byte
		want string
	}{
		"not json":      {[]byte("hello\n"), "malformed request"},
		"unknown field": {[]byte(`{"op":"ADD","future":true}` + "\n"), "future"},
		"oversized":     {[]byte(`{"op":"ADD","args":"` + strings.Repeat("x", MaxFrameBytes) + `"}` + "\n"), "1048576"},
		"truncated":     {[]byte(`{"op":"ADD"`), "unexpected EOF"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			send := tc.send
			if name == "truncated" {
				// Send then half-close so the server sees EOF mid-frame.
				c, err := net.Dial("unix", r.path)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				c.Write(send)
				c.(*net.UnixConn).CloseWrite()
				var resp Response
				if err := ReadFrame(c, &resp); err != nil {
					t.Fatal(err)
				}
				checkDecodingError(t, resp, tc.want)
				return
			}
			checkDecodingError(t, rawExchange(t, r.path, send), tc.want)
		})
	}
	select {
	case req := <-called:
		t.Errorf("handler called for malformed request %+v", req)
	default:
	}
}

func checkDecodingError(t *testing.T, resp Response, want string) {
	t.Helper()
	if resp.Error == nil {
		t.Fatalf("no error in response %+v", resp)
	}
	if resp.Error.Code != types.ErrDecodingFailure {
		t.Errorf("code = %d, want %d", resp.Error.Code, types.ErrDecodingFailure)
	}
	if !strings.Contains(resp.Error.Msg, want) {
		t.Errorf("msg %q does not contain %q", resp.Error.Msg, want)
	}
}

func TestServerReadTimeout(t *testing.T) {
	path := filepath.Join(sockDir(t), "cni.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	srv := &Server{Handler: echoHandler(), ReadTimeout: 100 * time.Millisecond, Logger: quietLogger()}
	srv.Listener = l
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	c.Write([]byte(`{"op":`)) // and then nothing
	var resp Response
	if err := ReadFrame(c, &resp); err != nil {
		t.Fatal(err)
	}
	checkDecodingError(t, resp, "timeout")
}

func TestServerHandlerPanic(t *testing.T) {
	r := startServer(t, HandlerFunc(func(ctx context.Context, req Request) Response {
		panic("boom")
	}))
	resp, err := Client{Socket: r.path}.Call(safetyCtx(t), Request{Op: OpAdd})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Error == nil || resp.Error.Code != types.ErrInternal || resp.Error.Details != "boom" {
		t.Errorf("resp = %+v, want internal error", resp)
	}
	// The server is still alive.
	if _, err := (Client{Socket: r.path}).Call(safetyCtx(t), Request{Op: OpStatus}); err != nil {
		t.Errorf("second call: %v", err)
	}
}

func TestListenStaleSocket(t *testing.T) {
	path := filepath.Join(sockDir(t), "cni.sock")
	old, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	old.(*net.UnixListener).SetUnlinkOnClose(false) // simulate a crashed agent
	old.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("stale socket file not left behind: %v", err)
	}

	l, err := Listen(path)
	if err != nil {
		t.Fatalf("Listen over stale socket: %v", err)
	}
	defer l.Close()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v (err %v), want 0600", fi.Mode(), err)
	}
}

func TestListenLiveServer(t *testing.T) {
	r := startServer(t, echoHandler())
	_, err := Listen(r.path)
	if err == nil {
		t.Fatal("second Listen succeeded")
	}
	if !strings.Contains(err.Error(), "another agent is listening on "+r.path) {
		t.Errorf("error %q does not name the path", err)
	}
	// The live server is unaffected.
	if _, err := (Client{Socket: r.path}).Call(safetyCtx(t), Request{Op: OpStatus}); err != nil {
		t.Errorf("live server broken by second Listen: %v", err)
	}
}

func TestListenRefusesNonSocket(t *testing.T) {
	path := filepath.Join(sockDir(t), "cni.sock")
	if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Listen over regular file: err = %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "precious" {
		t.Error("regular file clobbered")
	}
}

func TestServeShutdownWaitsForInFlight(t *testing.T) {
	path := filepath.Join(sockDir(t), "cni.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	sawCancel := make(chan struct{})
	release := make(chan struct{})
	finished := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req Request) Response {
		close(started)
		<-ctx.Done() // handler ctx follows Serve's ctx
		close(sawCancel)
		<-release
		close(finished)
		return Response{Result: []byte(`{"ok":true}`)}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	tl := &trackedListener{Listener: l, closed: make(chan struct{})}
	go func() { done <- (&Server{Listener: tl, Handler: h, Logger: quietLogger()}).Run(ctx) }()

	callDone := make(chan error, 1)
	var resp Response
	go func() {
		var err error
		resp, err = Client{Socket: path}.Call(safetyCtx(t), Request{Op: OpAdd})
		callDone <- err
	}()

	<-started
	cancel()
	<-sawCancel
	<-tl.closed // Serve closes it on cancel, from a goroutine of its own
	// A Serve that did not wait would return right after: give it time to.
	select {
	case err := <-done:
		t.Fatalf("Serve returned (%v) while a handler was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	// The listener is closed: new clients see no agent.
	if _, err := (Client{Socket: path}).Call(safetyCtx(t), Request{Op: OpStatus}); !errors.Is(err, ErrAgentNotRunning) {
		t.Errorf("call after shutdown: err = %v, want ErrAgentNotRunning", err)
	}

	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve returned %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	select {
	case <-finished:
	default:
		t.Error("Serve returned before the handler finished")
	}
	if err := <-callDone; err != nil {
		t.Fatalf("in-flight call failed: %v", err)
	}
	if string(resp.Result) != `{"ok":true}` {
		t.Errorf("in-flight call got %+v", resp)
	}
}

func TestServeShutdownAbortsPendingRead(t *testing.T) {
	path := filepath.Join(sockDir(t), "cni.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	srv := &Server{Handler: echoHandler(), ReadTimeout: time.Hour, Logger: quietLogger()}
	partial := []byte(`{"op":"ADD"`) // incomplete: the server waits for more
	tl := &trackedListener{Listener: l, closed: make(chan struct{}), waitAfter: len(partial), waiting: make(chan struct{})}
	srv.Listener = tl
	go func() { done <- srv.Run(ctx) }()

	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	c.Write(partial)
	<-tl.waiting
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve blocked on a connection that never sends its request")
	}
	var resp Response
	if err := ReadFrame(c, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Error == nil || resp.Error.Code != types.ErrTryAgainLater {
		t.Errorf("resp = %+v, want try-again-later", resp)
	}
}

func TestConcurrentCalls(t *testing.T) {
	r := startServer(t, echoHandler())
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("ctr%03d", i)
			resp, err := Client{Socket: r.path}.Call(safetyCtx(t), Request{Op: OpAdd, ContainerID: id, IfName: "eth0"})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", id, err)
				return
			}
			if !strings.Contains(string(resp.Result), `"containerID":"`+id+`"`) {
				errs <- fmt.Errorf("%s: got response for someone else: %s", id, resp.Result)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestServeNilHandler(t *testing.T) {
	l, err := Listen(filepath.Join(sockDir(t), "cni.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := (&Server{Listener: l}).Run(context.Background()); err == nil {
		t.Error("Serve with nil handler succeeded")
	}
}
