// Package wire is the protocol between the flock CNI plugin binary and the
// node agent.
//
// The plugin connects to the agent's unix socket, writes one Request frame,
// reads one Response frame and closes the connection: one request per
// connection. A frame is a single JSON value followed by '\n' (JSON encoding
// never emits a raw newline inside a value). Frames are limited to
// MaxFrameBytes of JSON, and decoding rejects unknown fields so that version
// skew between plugin and agent fails loudly instead of silently dropping
// data.
package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/containernetworking/cni/pkg/types"

	"code.fritzlab.net/fritzlab/flock/cni/agentsock"
)

// Op is a CNI operation forwarded from the plugin to the agent.
type Op string

const (
	OpAdd    Op = "ADD"
	OpDel    Op = "DEL"
	OpCheck  Op = "CHECK"
	OpGC     Op = "GC"
	OpStatus Op = "STATUS"
)

// Request is what the plugin sends: the CNI environment plus the network
// config it received on stdin.
type Request struct {
	Op          Op     `json:"op"`
	ContainerID string `json:"containerID,omitempty"`
	Netns       string `json:"netns,omitempty"`
	IfName      string `json:"ifName,omitempty"`
	Args        string `json:"args,omitempty"` // CNI_ARGS verbatim
	// Config is the network config as the plugin got it on stdin (with
	// cniVersion, prevResult, and for GC cni.dev/valid-attachments). It is
	// carried as raw JSON; framing compacts insignificant whitespace but
	// does not otherwise change it.
	Config json.RawMessage `json:"config,omitempty"`
}

// Response is the agent's answer. On success Error is nil and, for ADD,
// Result holds a CNI result in spec 1.1.0 form.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *types.Error    `json:"error,omitempty"`
}

// MaxFrameBytes is the largest JSON payload of a frame, excluding the
// terminating newline.
const MaxFrameBytes = 1 << 20

// DefaultSocket is where the agent listens and the plugin connects.
const DefaultSocket = agentsock.DefaultPath

// ErrFrameTooLarge is wrapped by WriteFrame and ReadFrame when a frame
// exceeds MaxFrameBytes.
var ErrFrameTooLarge = errors.New("wire: frame too large")

func tooLarge(n int) error {
	if n < 0 {
		return fmt.Errorf("%w: more than %d bytes without a newline (limit %d bytes)", ErrFrameTooLarge, MaxFrameBytes, MaxFrameBytes)
	}
	return fmt.Errorf("%w: %d bytes (limit %d bytes)", ErrFrameTooLarge, n, MaxFrameBytes)
}

// WriteFrame encodes v as JSON followed by '\n' and writes it to w in a single
// Write. It fails with ErrFrameTooLarge, writing nothing, if the JSON is
// longer than MaxFrameBytes.
func WriteFrame(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // appends '\n'
		return fmt.Errorf("wire: encoding frame: %w", err)
	}
	if n := buf.Len() - 1; n > MaxFrameBytes {
		return tooLarge(n)
	}
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("wire: writing frame: %w", err)
	}
	return nil
}

// ReadFrame reads one newline-terminated frame from r and decodes it into v.
//
// At most MaxFrameBytes+1 bytes are accepted before the newline must have
// been seen; a longer frame yields an error wrapping ErrFrameTooLarge. EOF
// before the newline is an error (io.EOF if nothing at all was read,
// io.ErrUnexpectedEOF for a truncated frame). Unknown JSON fields, trailing
// data after the JSON value and empty frames are rejected.
//
// Unless r is a *bufio.Reader, ReadFrame may buffer and thereby consume bytes
// past the newline; to read several frames from one stream, pass the same
// *bufio.Reader each time.
func ReadFrame(r io.Reader, v any) error {
	line, err := readLine(r)
	if err != nil {
		return err
	}
	payload := line[:len(line)-1]
	if len(bytes.TrimSpace(payload)) == 0 {
		return errors.New("wire: empty frame")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("wire: decoding frame: %w", err)
	}
	if rest := payload[dec.InputOffset():]; len(bytes.TrimSpace(rest)) != 0 {
		return errors.New("wire: decoding frame: unexpected data after JSON value")
	}
	return nil
}

// readLine returns the bytes up to and including the first '\n', reading at
// most MaxFrameBytes+1 bytes.
func readLine(r io.Reader) ([]byte, error) {
	const limit = MaxFrameBytes + 1 // payload plus newline
	br, ok := r.(*bufio.Reader)
	if !ok {
		// Frames are ~1 KiB; longer ones are read in pieces below. (A
		// 64 KiB buffer per request was half of what the agent allocated
		// under a burst of ADDs, and page faults in every plugin process.)
		br = bufio.NewReaderSize(r, 4<<10)
	}
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > limit {
			return nil, tooLarge(-1)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			if len(line) >= limit {
				return nil, tooLarge(-1)
			}
		case errors.Is(err, io.EOF):
			if len(line) == 0 {
				return nil, fmt.Errorf("wire: reading frame: %w", io.EOF)
			}
			return nil, fmt.Errorf("wire: reading frame: connection closed after %d bytes without newline: %w", len(line), io.ErrUnexpectedEOF)
		default:
			return nil, fmt.Errorf("wire: reading frame: %w", err)
		}
	}
}
