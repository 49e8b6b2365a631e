package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/cni/wire/unixsock"
)

// DefaultReadTimeout bounds reading the request frame on the server.
const DefaultReadTimeout = 10 * time.Second

// Handler serves one plugin request.
type Handler interface {
	Handle(ctx context.Context, req Request) Response
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req Request) Response

// Handle calls f(ctx, req).
func (f HandlerFunc) Handle(ctx context.Context, req Request) Response { return f(ctx, req) }

// Listen creates the agent's unix socket at path: it creates the parent
// directory (0755) if needed, removes a stale socket left by a previous agent
// (only if dialing it fails), binds, and restricts the socket to mode 0600.
// If another process answers on path, Listen fails with an error naming it.
// A non-socket file at path is never removed.
func Listen(path string) (net.Listener, error) {
	l, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("wire: %w", err)
	}
	return l, nil
}

// Server serves plugin requests: one request and one response per
// connection.
type Server struct {
	// Listener is the bound socket (Listen); Run closes it.
	Listener net.Listener
	Handler  Handler
	// ReadTimeout bounds reading the request frame (default 10s). The same
	// bound applies to writing the response once the handler returns.
	ReadTimeout time.Duration
	Logger      *slog.Logger // default slog.Default()
}

// Run accepts connections on the listener until ctx is cancelled, serving
// each in its own goroutine. Handlers get a context that is cancelled when
// ctx is. When ctx is cancelled Run closes the listener, waits for
// in-flight connections to finish and returns nil. If accepting fails for
// another reason, Run waits for in-flight connections and returns that
// error.
func (s *Server) Run(ctx context.Context) error {
	if s.Handler == nil || s.Listener == nil {
		return errors.New("wire: Server.Handler and Listener are required")
	}
	l := s.Listener
	log := s.logger()

	var wg sync.WaitGroup
	defer wg.Wait()

	stopClose := context.AfterFunc(ctx, func() { l.Close() })
	defer stopClose()

	var backoff time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if isTemporaryAcceptError(err) {
				// E.g. EMFILE: back off like net/http instead of spinning.
				if backoff == 0 {
					backoff = 5 * time.Millisecond
				} else {
					backoff = min(2*backoff, time.Second)
				}
				log.Warn("wire: accept failed; retrying", "err", err, "delay", backoff)
				select {
				case <-time.After(backoff):
					continue
				case <-ctx.Done():
					return nil
				}
			}
			l.Close()
			return fmt.Errorf("wire: accept: %w", err)
		}
		backoff = 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, conn)
		}()
	}
}

func isTemporaryAcceptError(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	// Temporary is deprecated in general but is still how net/http
	// classifies retryable accept errors such as EMFILE.
	var ne interface{ Temporary() bool }
	return errors.As(err, &ne) && ne.Temporary()
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

func (s *Server) readTimeout() time.Duration {
	if s.ReadTimeout > 0 {
		return s.ReadTimeout
	}
	return DefaultReadTimeout
}

func (s *Server) serveConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	log := s.logger()
	timeout := s.readTimeout()

	var req Request
	conn.SetReadDeadline(time.Now().Add(timeout))
	// On shutdown, abort a read that is still waiting for the request.
	stopRead := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	err := ReadFrame(conn, &req)
	stopRead()

	var resp Response
	switch {
	case err != nil && ctx.Err() != nil:
		resp.Error = types.NewError(types.ErrTryAgainLater, "flock agent is shutting down", err.Error())
		log.Info("wire: request aborted by shutdown", "err", err)
	case errors.Is(err, io.EOF):
		// Peer connected and closed without sending anything (e.g. a
		// liveness probe such as Listen's stale-socket check).
		log.Debug("wire: connection closed before request")
		return
	case err != nil:
		resp.Error = types.NewError(types.ErrDecodingFailure, "malformed request: "+err.Error(), "")
		log.Warn("wire: malformed request", "err", err)
	default:
		start := time.Now()
		resp = s.handle(ctx, req)
		attrs := []any{"op", req.Op, "containerID", req.ContainerID, "duration", time.Since(start)}
		if resp.Error != nil {
			log.Debug("wire: request failed", append(attrs, "code", resp.Error.Code, "msg", resp.Error.Msg)...)
		} else {
			log.Debug("wire: request served", attrs...)
		}
	}

	conn.SetWriteDeadline(time.Now().Add(timeout))
	if err := WriteFrame(conn, resp); err != nil {
		if errors.Is(err, ErrFrameTooLarge) {
			// Tell the plugin something rather than nothing.
			msg := types.NewError(types.ErrInternal, "flock agent response too large", err.Error())
			err = WriteFrame(conn, Response{Error: msg})
		}
		if err != nil {
			log.Warn("wire: writing response", "op", req.Op, "containerID", req.ContainerID, "err", err)
		}
	}
}

// handle runs the handler, turning a panic into an internal error response
// so one bad request cannot take down the agent.
func (s *Server) handle(ctx context.Context, req Request) (resp Response) {
	defer func() {
		if r := recover(); r != nil {
			s.logger().Error("wire: handler panic", "op", req.Op, "containerID", req.ContainerID, "panic", r, "stack", string(debug.Stack()))
			resp = Response{Error: types.NewError(types.ErrInternal, "flock agent internal error", fmt.Sprint(r))}
		}
	}()
	return s.Handler.Handle(ctx, req)
}
