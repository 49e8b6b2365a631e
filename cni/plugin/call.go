package plugin

import (
	"errors"
	"strconv"
	"syscall"
	"time"

	"code.fritzlab.net/fritzlab/flock/cni/internal/jsonlite"
)

// The plugin speaks cni/wire's protocol by hand, with blocking system
// calls: no encoding/json, no net package, no poller (see jsonlite for
// why). cni/wire's tests and this package's hold the two to one format.

// maxFrameBytes is wire.MaxFrameBytes (a test checks).
const maxFrameBytes = 1 << 20

// errAgentNotRunning: nothing serves the socket (missing, refused, or
// its backlog stayed full for the whole dial timeout).
var errAgentNotRunning = errors.New("flock agent not running")

// request is one wire.Request frame.
type request struct {
	op                               string
	containerID, netns, ifName, args string
	config                           []byte // valid JSON
}

// frame encodes r as wire.WriteFrame does: one JSON object (fields in
// wire.Request's order, empty ones left out), then '\n'.
func (r request) frame() []byte {
	b := make([]byte, 0, 256+len(r.config))
	b = jsonlite.AppendQuote(append(b, `{"op":`...), r.op)
	for _, f := range []struct{ key, val string }{
		{"containerID", r.containerID}, {"netns", r.netns}, {"ifName", r.ifName}, {"args", r.args},
	} {
		if f.val != "" {
			b = jsonlite.AppendQuote(append(append(append(b, ',', '"'), f.key...), '"', ':'), f.val)
		}
	}
	if len(r.config) > 0 {
		b = jsonlite.AppendCompact(append(b, `,"config":`...), r.config)
	}
	return append(b, '}', '\n')
}

// response is one wire.Response frame, its members as they came.
type response struct {
	result []byte // a CNI result object; nil when absent or null
	err    []byte // a CNI error object; nil when absent or null
}

func parseResponse(frame []byte) (response, error) {
	var r response
	members, err := jsonlite.Object(frame)
	if err != nil {
		return r, errors.New("wire: decoding frame: " + err.Error())
	}
	if members == nil {
		return r, errors.New("wire: decoding frame: null")
	}
	for _, m := range members {
		var dst *[]byte
		switch m.Key {
		case "result":
			dst = &r.result
		case "error":
			dst = &r.err
		default:
			return r, errors.New("wire: decoding frame: unknown field " + quote(m.Key))
		}
		switch k := jsonlite.Kind(m.Value); k {
		case "null":
			*dst = nil
		case "object":
			*dst = m.Value
		default:
			return r, errors.New("wire: decoding frame: " + m.Key + " is a JSON " + k + ", want an object")
		}
	}
	return r, nil
}

// timeval is d as a socket timeout; at least 1µs (0 means none).
func timeval(d time.Duration) *syscall.Timeval {
	tv := syscall.NsecToTimeval(max(d, time.Microsecond).Nanoseconds())
	return &tv
}

// call sends one request frame on a new connection to socket and returns
// the agent's response frame (its newline dropped). The whole call, dial
// included, is bounded by timeout; the dial alone by dialTimeout too.
func call(socket string, frame []byte, dialTimeout, timeout time.Duration) ([]byte, error) {
	if len(frame)-1 > maxFrameBytes {
		return nil, errors.New("wire: request of " + strconv.Itoa(len(frame)-1) + " bytes, more than the agent reads (" + strconv.Itoa(maxFrameBytes) + ")")
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, errors.New("wire: socket: " + err.Error())
	}
	defer syscall.Close(fd)

	deadline := time.Now().Add(timeout)
	dialTimeout = min(dialTimeout, timeout)
	// A unix socket's connect waits for room in the listener's backlog
	// for as long as the send timeout, then fails with EAGAIN.
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, timeval(dialTimeout)); err != nil {
		return nil, errors.New("wire: setting dial timeout: " + err.Error())
	}
	for {
		err = syscall.Connect(fd, &syscall.SockaddrUnix{Name: socket})
		if err != syscall.EINTR {
			break
		}
	}
	switch {
	case err == syscall.ENOENT || err == syscall.ECONNREFUSED:
		return nil, &callError{kind: errAgentNotRunning, msg: "connecting to " + socket + ": " + err.Error()}
	case err == syscall.EAGAIN:
		return nil, &callError{kind: errAgentNotRunning, msg: "connecting to " + socket + ": no room in its backlog within " + dialTimeout.String()}
	case err != nil:
		return nil, errors.New("wire: connecting to flock agent at " + socket + ": " + err.Error())
	}

	for len(frame) > 0 {
		n, again, err := ioStep(fd, syscall.SO_SNDTIMEO, deadline, timeout, "sending request", func() (int, error) { return syscall.Write(fd, frame) })
		if again {
			continue
		}
		if err != nil {
			return nil, err
		}
		frame = frame[n:]
	}

	buf := make([]byte, 0, 4<<10)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, again, err := ioStep(fd, syscall.SO_RCVTIMEO, deadline, timeout, "reading response", func() (int, error) { return syscall.Read(fd, buf[len(buf):cap(buf)]) })
		switch {
		case again:
			continue
		case err != nil:
			return nil, err
		case n == 0 && len(buf) == 0:
			return nil, errors.New("wire: reading response: the agent closed the connection without answering")
		case n == 0:
			return nil, errors.New("wire: reading response: connection closed after " + strconv.Itoa(len(buf)) + " bytes without newline")
		}
		for i, c := range buf[len(buf) : len(buf)+n] {
			if c == '\n' {
				if len(buf)+i > maxFrameBytes {
					break // too long, newline or not
				}
				return buf[:len(buf)+i], nil
			}
		}
		buf = buf[:len(buf)+n]
		if len(buf) > maxFrameBytes {
			return nil, errors.New("wire: reading response: a frame of more than " + strconv.Itoa(maxFrameBytes) + " bytes")
		}
	}
}

// ioStep runs one read or write (op) with the time left before deadline
// as the socket's timeout opt (SO_SNDTIMEO or SO_RCVTIMEO): its count,
// again after a signal, or the error, a timeout named as the agent not
// answering within timeout.
func ioStep(fd, opt int, deadline time.Time, timeout time.Duration, what string, op func() (int, error)) (n int, again bool, err error) {
	timedOut := func() error {
		return errors.New("wire: flock agent did not answer within " + timeout.String() + ": " + what)
	}
	left := time.Until(deadline)
	if left <= 0 {
		return 0, false, timedOut()
	}
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, opt, timeval(left)); err != nil {
		return 0, false, errors.New("wire: " + what + ": " + err.Error())
	}
	n, err = op()
	switch {
	case err == syscall.EINTR:
		return 0, true, nil
	case err == syscall.EAGAIN:
		return 0, false, timedOut()
	case err != nil:
		return 0, false, errors.New("wire: " + what + ": " + err.Error())
	}
	return n, false, nil
}

// callError is a failed call of a kind the caller tells apart.
type callError struct {
	kind error
	msg  string
}

func (e *callError) Error() string { return "wire: " + e.kind.Error() + ": " + e.msg }
func (e *callError) Unwrap() error { return e.kind }
