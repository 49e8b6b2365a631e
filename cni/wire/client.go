package wire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

const (
	// DefaultDialTimeout bounds connecting to the agent socket.
	DefaultDialTimeout = 2 * time.Second
	// DefaultIOTimeout bounds a whole call once connected.
	DefaultIOTimeout = 60 * time.Second
)

// ErrAgentNotRunning is wrapped by Client.Call when nothing is serving the
// socket: it does not exist, the connection is refused, or dialing times out.
var ErrAgentNotRunning = errors.New("flock agent not running")

// Client calls the agent over its unix socket. The zero value uses
// DefaultSocket and the default timeouts.
type Client struct {
	Socket      string        // default DefaultSocket
	DialTimeout time.Duration // default 2s
	IOTimeout   time.Duration // default 60s; bounds writing the request and reading the response
}

// Call sends req on a new connection and returns the agent's response. An
// error means no valid response was received; a response carrying an Error
// is returned with a nil error.
//
// The connection deadline is the earlier of ctx's deadline and now+IOTimeout;
// cancelling ctx aborts the call.
func (c Client) Call(ctx context.Context, req Request) (Response, error) {
	socket := c.Socket
	if socket == "" {
		socket = DefaultSocket
	}
	dialTimeout := c.DialTimeout
	if dialTimeout <= 0 {
		dialTimeout = DefaultDialTimeout
	}
	ioTimeout := c.IOTimeout
	if ioTimeout <= 0 {
		ioTimeout = DefaultIOTimeout
	}

	d := net.Dialer{Timeout: dialTimeout}
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		if ctx.Err() != nil {
			return Response{}, fmt.Errorf("wire: connecting to flock agent: %w", errors.Join(ctx.Err(), err))
		}
		if agentAbsent(err) {
			return Response{}, fmt.Errorf("%w: %w", ErrAgentNotRunning, err)
		}
		return Response{}, fmt.Errorf("wire: connecting to flock agent: %w", err)
	}
	defer conn.Close()

	start := time.Now()
	deadline := start.Add(ioTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return Response{}, fmt.Errorf("wire: setting deadline: %w", err)
	}
	// Cancellation (not just a deadline) of ctx unblocks I/O immediately.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	wrap := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("wire: %s: %w", what, errors.Join(ctx.Err(), err))
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("wire: flock agent did not answer within %v: %s: %w", deadline.Sub(start).Round(time.Millisecond), what, err)
		}
		return fmt.Errorf("wire: %s: %w", what, err)
	}

	if err := WriteFrame(conn, req); err != nil {
		return Response{}, wrap("sending request", err)
	}
	var resp Response
	if err := ReadFrame(conn, &resp); err != nil {
		return Response{}, wrap("reading response", err)
	}
	return resp, nil
}

// agentAbsent reports whether a dial error means nobody is serving the socket.
func agentAbsent(err error) bool {
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
