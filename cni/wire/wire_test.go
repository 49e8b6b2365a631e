package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestFrameRoundTrip(t *testing.T) {
	cfg := "{\n  \"cniVersion\": \"1.1.0\",\n  \"name\": \"flock\",\n  \"type\": \"flock\",\n  \"note\": \"a<b>&c\\nd\"\n}"
	req := Request{
		Op:          OpAdd,
		ContainerID: "abc123",
		Netns:       "/var/run/netns/cni-1",
		IfName:      "eth0",
		Args:        "K8S_POD_NAMESPACE=default;K8S_POD_NAME=x",
		Config:      json.RawMessage(cfg),
	}
	var buf bytes.Buffer
	if err := WriteFrame(&buf, req); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if b[len(b)-1] != '\n' || bytes.Count(b, []byte("\n")) != 1 {
		t.Fatalf("frame is not exactly one newline-terminated line: %q", b)
	}
	var got Request
	if err := ReadFrame(&buf, &got); err != nil {
		t.Fatal(err)
	}
	if got.Op != req.Op || got.ContainerID != req.ContainerID || got.Netns != req.Netns || got.IfName != req.IfName || got.Args != req.Args {
		t.Errorf("got %+v, want %+v", got, req)
	}
	// Config survives semantically (whitespace is compacted by framing).
	var a, b2 any
	json.Unmarshal([]byte(cfg), &a)
	json.Unmarshal(got.Config, &b2)
	if !jsonEqual(a, b2) {
		t.Errorf("config changed: got %s want %s", got.Config, cfg)
	}
	if !strings.Contains(string(got.Config), `a<b>&c`) {
		t.Errorf("config HTML-escaped: %s", got.Config)
	}

	resp := Response{Error: types.NewError(types.ErrTryAgainLater, "busy", "details")}
	buf.Reset()
	if err := WriteFrame(&buf, resp); err != nil {
		t.Fatal(err)
	}
	var gotResp Response
	if err := ReadFrame(&buf, &gotResp); err != nil {
		t.Fatal(err)
	}
	if gotResp.Error == nil || *gotResp.Error != *resp.Error || gotResp.Result != nil {
		t.Errorf("got %+v, want %+v", gotResp, resp)
	}

	// Omitted fields stay omitted.
	buf.Reset()
	WriteFrame(&buf, Request{Op: OpStatus})
	if got := buf.String(); got != "{\"op\":\"STATUS\"}\n" {
		t.Errorf("STATUS frame = %q", got)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

func TestReadFrameConsecutiveWithBufio(t *testing.T) {
	var buf bytes.Buffer
	for _, op := range []Op{OpAdd, OpDel, OpGC} {
		if err := WriteFrame(&buf, Request{Op: op}); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReader(&buf)
	for _, want := range []Op{OpAdd, OpDel, OpGC} {
		var r Request
		if err := ReadFrame(br, &r); err != nil {
			t.Fatal(err)
		}
		if r.Op != want {
			t.Errorf("op = %s, want %s", r.Op, want)
		}
	}
	var r Request
	if err := ReadFrame(br, &r); !errors.Is(err, io.EOF) {
		t.Errorf("after last frame err = %v, want io.EOF", err)
	}
}

// bigString returns a frame payload that is a JSON string of exactly n bytes.
func bigString(n int) string {
	return `"` + strings.Repeat("a", n-2) + `"`
}

func TestWriteFrameTooLarge(t *testing.T) {
	var buf bytes.Buffer
	// Exactly at the limit is fine.
	if err := WriteFrame(&buf, json.RawMessage(bigString(MaxFrameBytes))); err != nil {
		t.Fatalf("frame of exactly MaxFrameBytes: %v", err)
	}
	if buf.Len() != MaxFrameBytes+1 {
		t.Fatalf("wrote %d bytes, want %d", buf.Len(), MaxFrameBytes+1)
	}
	buf.Reset()
	err := WriteFrame(&buf, Request{Op: OpAdd, Config: json.RawMessage(bigString(MaxFrameBytes))})
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err = %v, want ErrFrameTooLarge", err)
	}
	if !strings.Contains(err.Error(), "1048576") {
		t.Errorf("error %q does not name the limit", err)
	}
	if buf.Len() != 0 {
		t.Errorf("oversized WriteFrame wrote %d bytes", buf.Len())
	}
}

// countingReader yields an endless stream of 'a' without a newline.
type countingReader struct{ n int }

func (r *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	r.n += len(p)
	return len(p), nil
}

func TestReadFrameTooLarge(t *testing.T) {
	// Exactly MaxFrameBytes of payload plus newline is accepted.
	var s string
	if err := ReadFrame(strings.NewReader(bigString(MaxFrameBytes)+"\n"), &s); err != nil {
		t.Fatalf("frame at limit: %v", err)
	}
	if len(s) != MaxFrameBytes-2 {
		t.Errorf("decoded %d bytes", len(s))
	}

	// One byte more is not.
	err := ReadFrame(strings.NewReader(bigString(MaxFrameBytes+1)+"\n"), &s)
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err = %v, want ErrFrameTooLarge", err)
	}
	if !strings.Contains(err.Error(), "1048576") {
		t.Errorf("error %q does not name the limit", err)
	}

	// An endless stream without newline is cut off after about the limit.
	cr := &countingReader{}
	if err := ReadFrame(cr, &s); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("endless stream: err = %v, want ErrFrameTooLarge", err)
	}
	if cr.n > MaxFrameBytes+1+64<<10 {
		t.Errorf("read %d bytes from endless stream", cr.n)
	}
}

func TestReadFrameTruncated(t *testing.T) {
	var r Request
	err := ReadFrame(strings.NewReader(`{"op":"ADD","containerID":"x"}`), &r)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("no newline: err = %v, want io.ErrUnexpectedEOF", err)
	}
	err = ReadFrame(strings.NewReader(`{"op":"AD`), &r)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut mid-value: err = %v, want io.ErrUnexpectedEOF", err)
	}
	if err := ReadFrame(strings.NewReader(""), &r); !errors.Is(err, io.EOF) {
		t.Errorf("empty stream: err = %v, want io.EOF", err)
	}
	// Newline present but the JSON is incomplete.
	if err := ReadFrame(strings.NewReader("{\"op\":\n"), &r); err == nil {
		t.Error("incomplete JSON accepted")
	}
}

func TestReadFrameRejects(t *testing.T) {
	cases := map[string]string{
		"unknown field":        `{"op":"ADD","bogus":1}`,
		"unknown nested field": `{"error":{"code":1,"msg":"x","extra":true}}`,
		"trailing data":        `{"op":"ADD"} {"op":"DEL"}`,
		"empty frame":          ``,
		"blank frame":          `   `,
		"not json":             `hello`,
		"wrong type":           `{"op":5}`,
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			var r struct {
				Request
				Error *types.Error `json:"error"`
			}
			err := ReadFrame(strings.NewReader(frame+"\n"), &r)
			if err == nil {
				t.Fatalf("frame %q accepted", frame)
			}
			if name == "unknown field" && !strings.Contains(err.Error(), "bogus") {
				t.Errorf("error %q does not name the field", err)
			}
		})
	}
}
