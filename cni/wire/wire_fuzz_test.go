package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/types"
)

// The seed corpus is in testdata/fuzz/<FuzzName>/; `go test` runs it as
// regression tests, `go test -fuzz '^FuzzName$'` (.ci/fuzz) explores from it.

// FuzzReadFrame feeds arbitrary bytes to the decoder, as a Request and as
// a Response. What it accepts must survive encode→decode unchanged (Config
// and Result only compacted, as documented), re-encode to the same bytes,
// stay accepted when padded to exactly MaxFrameBytes, and be refused with
// ErrFrameTooLarge one byte later; cut before its newline it is a truncated
// frame (io.ErrUnexpectedEOF).
func FuzzReadFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var req Request
		if err := ReadFrame(bytes.NewReader(data), &req); err == nil {
			payload := checkAcceptedFrame(t, data)
			got := roundTrip(t, req, new(Request)).(*Request)
			want := req
			want.Config = compact(t, req.Config)
			if !reflect.DeepEqual(*got, want) {
				t.Fatalf("Request round trip of %q:\n got %#v\nwant %#v", payload, *got, want)
			}
			checkOversize(t, payload, new(Request), &req)
		}

		var resp Response
		if err := ReadFrame(bytes.NewReader(data), &resp); err == nil {
			payload := checkAcceptedFrame(t, data)
			got := roundTrip(t, resp, new(Response)).(*Response)
			want := resp
			want.Result = compact(t, resp.Result)
			if !reflect.DeepEqual(*got, want) {
				t.Fatalf("Response round trip of %q:\n got %#v\nwant %#v", payload, *got, want)
			}
			checkOversize(t, payload, new(Response), &resp)
		}
	})
}

// checkAcceptedFrame checks what any accepted input must look like and
// returns the frame's payload (without the newline).
func checkAcceptedFrame(t *testing.T, data []byte) []byte {
	t.Helper()
	i := bytes.IndexByte(data, '\n')
	if i < 0 {
		t.Fatalf("accepted %q, which has no newline", data)
	}
	payload := data[:i]
	if len(payload) > MaxFrameBytes {
		t.Fatalf("accepted a %d-byte frame (limit %d)", len(payload), MaxFrameBytes)
	}
	if len(bytes.TrimSpace(payload)) == 0 {
		t.Fatalf("accepted the blank frame %q", payload)
	}
	// What follows the newline is the next frame's business.
	if err := ReadFrame(bytes.NewReader(data[:i+1]), new(json.RawMessage)); err != nil {
		t.Fatalf("the frame alone %q is refused: %v", data[:i+1], err)
	}
	// Without its newline the frame is truncated.
	if err := ReadFrame(bytes.NewReader(payload), new(json.RawMessage)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("frame %q without its newline: err = %v, want io.ErrUnexpectedEOF", payload, err)
	}
	return payload
}

// roundTrip encodes v, checks the frame's shape, decodes it into into and
// checks that re-encoding gives the same bytes.
func roundTrip(t *testing.T, v any, into any) any {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteFrame(&buf, v); err != nil {
		t.Fatalf("WriteFrame(%#v) of an accepted frame: %v", v, err)
	}
	frame := bytes.Clone(buf.Bytes())
	if n := bytes.IndexByte(frame, '\n'); n != len(frame)-1 {
		t.Fatalf("WriteFrame wrote %q: not one newline-terminated line", frame)
	}
	if err := ReadFrame(&buf, into); err != nil {
		t.Fatalf("ReadFrame(WriteFrame(%#v)) = %v (frame %q)", v, err, frame)
	}
	var again bytes.Buffer
	if err := WriteFrame(&again, into); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), frame) {
		t.Fatalf("re-encoding changed the frame:\n%q\n%q", frame, again.Bytes())
	}
	return into
}

// checkOversize pads an accepted payload with trailing blanks: to exactly
// MaxFrameBytes it decodes to the same value, one byte more is
// ErrFrameTooLarge.
func checkOversize(t *testing.T, payload []byte, into, want any) {
	t.Helper()
	copy(padded, payload)
	defer copy(padded, blanks[:len(payload)])
	padded[MaxFrameBytes] = '\n'
	if err := ReadFrame(bytes.NewReader(padded[:MaxFrameBytes+1]), into); err != nil {
		t.Fatalf("payload %q padded to exactly MaxFrameBytes refused: %v", payload, err)
	}
	if !reflect.DeepEqual(into, want) {
		t.Fatalf("padding changed the value: got %#v, want %#v", into, want)
	}
	padded[MaxFrameBytes], padded[MaxFrameBytes+1] = ' ', '\n'
	if err := ReadFrame(bytes.NewReader(padded), into); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("payload %q padded to MaxFrameBytes+1: err = %v, want ErrFrameTooLarge", payload, err)
	}
}

// padded is checkOversize's frame buffer, kept between calls (a fuzz
// worker runs one input at a time): blanks beyond the payload. blanks
// restores it.
var (
	padded = bytes.Repeat([]byte{' '}, MaxFrameBytes+2)
	blanks = bytes.Repeat([]byte{' '}, MaxFrameBytes)
)

func compact(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	if raw == nil {
		return nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("decoded raw JSON %q does not compact: %v", raw, err)
	}
	return b.Bytes()
}

// FuzzWriteFrame encodes requests and responses built from arbitrary
// fields: decode(encode(x)) == x (raw JSON compacted; strings of invalid
// UTF-8 come back valid, as encoding/json documents), and raw JSON that is
// not valid is refused without writing anything.
func FuzzWriteFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, op, containerID, netns, ifName, args string, raw []byte, code uint, msg, details string) {
		req := Request{Op: Op(op), ContainerID: containerID, Netns: netns, IfName: ifName, Args: args}
		resp := Response{}
		if len(raw) > 0 {
			req.Config = raw
			resp.Result = raw
		}
		if code != 0 || msg != "" || details != "" {
			resp.Error = &types.Error{Code: code, Msg: msg, Details: details}
		}
		valid := len(raw) == 0 || json.Valid(raw)

		var buf bytes.Buffer
		err := WriteFrame(&buf, req)
		if !valid {
			if err == nil {
				t.Fatalf("WriteFrame accepted invalid raw JSON %q", raw)
			}
			if buf.Len() != 0 {
				t.Fatalf("failed WriteFrame wrote %q", buf.Bytes())
			}
			return
		}
		if err != nil {
			t.Fatalf("WriteFrame(%#v): %v", req, err)
		}
		var gotReq Request
		if err := ReadFrame(&buf, &gotReq); err != nil {
			t.Fatalf("ReadFrame of WriteFrame(%#v): %v", req, err)
		}
		wantReq := req
		wantReq.Config = compact(t, req.Config)
		if validUTF8(op, containerID, netns, ifName, args) {
			if !reflect.DeepEqual(gotReq, wantReq) {
				t.Fatalf("Request round trip:\n got %#v\nwant %#v", gotReq, wantReq)
			}
		} else if !validUTF8(string(gotReq.Op), gotReq.ContainerID, gotReq.Netns, gotReq.IfName, gotReq.Args) ||
			!bytes.Equal(gotReq.Config, wantReq.Config) {
			t.Fatalf("Request round trip of invalid UTF-8:\n got %#v\nwant %#v", gotReq, wantReq)
		}

		buf.Reset()
		if err := WriteFrame(&buf, resp); err != nil {
			t.Fatalf("WriteFrame(%#v): %v", resp, err)
		}
		var gotResp Response
		if err := ReadFrame(&buf, &gotResp); err != nil {
			t.Fatalf("ReadFrame of WriteFrame(%#v): %v", resp, err)
		}
		wantResp := resp
		wantResp.Result = compact(t, resp.Result)
		if validUTF8(msg, details) {
			if !reflect.DeepEqual(gotResp, wantResp) {
				t.Fatalf("Response round trip:\n got %#v\nwant %#v", gotResp, wantResp)
			}
		} else if gotResp.Error == nil || gotResp.Error.Code != code || !bytes.Equal(gotResp.Result, wantResp.Result) {
			t.Fatalf("Response round trip of invalid UTF-8:\n got %#v\nwant %#v", gotResp, wantResp)
		}
	})
}

// validUTF8 reports whether every one of ss is valid UTF-8 (two invalid
// strings may be valid together: "\xe2\x80" + "\xbe" is U+203E).
func validUTF8(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}
